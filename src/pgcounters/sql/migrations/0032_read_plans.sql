-- Version 32: plans of exact reads that no vacuum can turn into scans, a careful drain in
-- the fast one's key order, drain_all called with parameters.
--
-- VACUUM truncated a drained queue to no pages (taking a lock that made writers wait): the
-- planner then saw an empty table, planned each key's pending deltas as a sequential scan
-- (a cost of 0), and psycopg's prepared statements kept that plan while the queue grew
-- again. Measured: get_many of 50 keys 7-9x slower for minutes after a held snapshot ended.
-- The queues keep their pages (vacuum_truncate = false); VACUUM still makes the space
-- reusable.
--
-- _drain_carefully took the keys of a batch in the order of their text ({100} before
-- {10}), the fast path in the order of the arrays ({10} before {100}): two drainers, one on
-- each path, could lock the same counters in opposite orders. Both now take the arrays'
-- order (a key that is no well-formed array, which the careful path sets aside, last).
--
-- drain_all refused, as a transaction block, a CALL whose arguments were bound as
-- parameters (the extended protocol of psycopg, JDBC and asyncpg sends Bind and Execute
-- as two messages, so now() and statement_timestamp() differ). It now lets PostgreSQL
-- refuse its first COMMIT in a transaction block (2D000, invalid transaction termination).
--
-- PostgreSQL older than 15 (the oldest the tests run on) is refused (PC023).

-- The oldest PostgreSQL pgcounters installs on: the oldest its tests run on.
DO $$
BEGIN
    IF current_setting('server_version_num')::integer < 150000 THEN
        RAISE EXCEPTION 'pgcounters needs PostgreSQL 15 or later; this server is %',
            current_setting('server_version')
            USING ERRCODE = 'PC023';
    END IF;
END;
$$;

ALTER TABLE pgcounters.queue SET (vacuum_truncate = false);
ALTER TABLE pgcounters.queue_unlogged SET (vacuum_truncate = false);

CREATE OR REPLACE FUNCTION pgcounters._drain_carefully(
    p_limit integer, p_unlogged boolean, p_sole boolean, p_skip text, p_broken integer[],
    OUT deltas bigint, OUT keys bigint, OUT busy bigint, OUT quarantined bigint,
    OUT first_requeued bigint, OUT last_claimed bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text := CASE WHEN p_unlogged THEN 'queue_unlogged' ELSE 'queue' END;
    v_claim text;
    v_rows pgcounters.claimed_delta[];
    v_head bigint;
    g record;
    t pgcounters.targets;
    v_key text[];
    v_lock record;
    v_id bigint;
    v_state text;
    v_message text;
    v_applied bigint;
    v_note boolean := current_setting('pgcounters.note_changes', true) = 'on';
    -- the largest batch taken one key at a time, if set (version 30): a drainer that took a
    -- backlog in one large batch sets it to its usual batch size
    v_careful_limit integer := CASE
        WHEN current_setting('pgcounters.careful_limit', true) ~ '^[0-9]{1,9}$'
        THEN current_setting('pgcounters.careful_limit', true)::integer END;
BEGIN
    IF p_limit > v_careful_limit THEN
        -- one (counter, key) per subtransaction over a large batch would hold its rows
        -- for many times the fast path's time: refused, the drainer takes smaller batches
        RAISE EXCEPTION 'a batch of % deltas holds one that cannot be applied: it is taken '
                        'again in batches of at most %', p_limit, v_careful_limit
            USING ERRCODE = 'PC022';
    END IF;
    deltas := 0;
    keys := 0;
    busy := 0;
    quarantined := 0;
    IF p_sole THEN
        v_claim := 'q.id BETWEEN (SELECT lo FROM head) AND (SELECT lo FROM head) + $1 - 1';
    ELSE
        v_claim := 'q.id = ANY (ARRAY(SELECT id FROM pgcounters.%1$I AS q WHERE true'
                   || p_skip || ' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))';
    END IF;
    LOOP
        EXECUTE format($q$
            WITH head AS MATERIALIZED (
                SELECT min(id) AS lo FROM pgcounters.%1$I AS q WHERE true $q$ || p_skip || $q$
            ), claimed AS (
                DELETE FROM pgcounters.%1$I AS q
                 WHERE $q$ || v_claim || p_skip || $q$
                RETURNING q.id, q.target_id, q.key, q.delta, q.created_at
            )
            SELECT (SELECT array_agg((c.id, c.target_id, c.key, c.delta, c.created_at)
                                     ::pgcounters.claimed_delta) FROM claimed AS c),
                   $q$ || CASE WHEN p_sole THEN '(SELECT lo FROM head)' ELSE 'NULL::bigint' END
        , v_queue)
        INTO v_rows, v_head
        USING p_limit, p_broken;
        EXIT WHEN v_rows IS NOT NULL OR v_head IS NULL;
    END LOOP;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    deltas := cardinality(v_rows);
    SELECT max(r.id) INTO last_claimed FROM unnest(v_rows) AS r;

    FOR g IN
        SELECT r.target_id, r.key, sum(r.delta) AS delta, count(*) AS n,
               min(r.created_at) AS created_at, array_agg(r.id) AS ids
          FROM unnest(v_rows) AS r
         GROUP BY r.target_id, r.key
         -- the fast path's order, the key as an array ({10} before {100}; as text the
         -- other way round), so that two drainers lock the same rows in the same order; a
         -- key that is no well-formed array (one this path sets aside) last, as text
         ORDER BY r.target_id,
                  CASE WHEN r.key ~ '^\{(("([^"\\]|\\.)*"|[^",{}\\[:space:]]+)(,("([^"\\]|\\.)*"|[^",{}\\[:space:]]+))*)?\}$'
                       THEN r.key::text[] END NULLS LAST,
                  r.key
    LOOP
        BEGIN
            SELECT * INTO t FROM pgcounters.targets WHERE id = g.target_id;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'counter id % no longer exists', g.target_id
                    USING ERRCODE = 'PC003';
            END IF;
            v_key := g.key::text[];
            IF coalesce(array_length(v_key, 1), 0) <> coalesce(array_length(t.key_types, 1), 0)
               OR array_position(v_key, NULL) IS NOT NULL THEN
                RAISE EXCEPTION 'counter % takes a key of (%), got %',
                    t.name, array_to_string(t.key_types, ', '), g.key USING ERRCODE = 'PC004';
            END IF;
            IF g.delta = 0 THEN
                NULL;
            ELSIF t.target_table IS NULL THEN
                INSERT INTO pgcounters.counters AS k (target_id, key, value)
                VALUES (t.id, v_key, g.delta)
                ON CONFLICT (target_id, key) DO UPDATE SET value = k.value + excluded.value;
                keys := keys + 1;
                IF v_note THEN
                    PERFORM pg_catalog.set_config('pgcounters.changes',
                        (coalesce(nullif(current_setting('pgcounters.changes', true), ''), '[]')::jsonb
                         || jsonb_build_array(jsonb_build_array(t.name, v_key)))::text, true);
                END IF;
            ELSIF t.id = ANY (p_broken) THEN
                NULL;  -- not claimed (left out above)
            ELSE
                -- here in target order, not table order: try only, never wait
                PERFORM pg_try_advisory_xact_lock(hashtext('pgcounters.parents'),
                        hashtext(format('%I.%I', t.target_schema, t.target_table)));
                SELECT l.locked, l.busy INTO v_lock
                  FROM pgcounters._lock_parents(t.target_schema, t.target_table,
                       t.target_key_column, t.key_types[1], ARRAY[v_key[1]]) AS l;
                IF cardinality(v_lock.locked) > 0 THEN
                    v_applied := pgcounters._apply_column(
                        t, ARRAY[v_key[1]], ARRAY[g.delta], v_lock.locked);
                    keys := keys + v_applied;
                    IF v_note AND v_applied > 0 THEN
                        PERFORM pg_catalog.set_config('pgcounters.changes',
                            (coalesce(nullif(current_setting('pgcounters.changes', true), ''), '[]')::jsonb
                             || jsonb_build_array(jsonb_build_array(t.name, v_lock.locked)))::text, true);
                    END IF;
                ELSIF cardinality(v_lock.busy) > 0 THEN
                    EXECUTE format(
                        'INSERT INTO pgcounters.%I (target_id, key, delta, created_at)
                         VALUES ($1, $2, $3, $4) RETURNING id', v_queue)
                    INTO v_id USING t.id, g.key, g.delta::bigint, g.created_at;
                    busy := busy + g.n;
                    first_requeued := least(first_requeued, v_id);
                END IF;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
            IF NOT pgcounters._quarantinable(v_state) THEN
                RAISE;
            END IF;
            INSERT INTO pgcounters.quarantine
                   (target_id, counter, key, delta, unlogged, created_at, sqlstate, error)
            SELECT r.target_id,
                   coalesce((SELECT name FROM pgcounters.targets WHERE id = r.target_id),
                            (SELECT name FROM pgcounters.dropped_targets WHERE id = r.target_id)),
                   r.key, r.delta, p_unlogged, r.created_at, v_state, v_message
              FROM unnest(v_rows) AS r
             WHERE r.id = ANY (g.ids)
             ORDER BY r.id;
            quarantined := quarantined + g.n;
            RAISE WARNING 'pgcounters: % delta(s) of counter % key % set aside: %',
                g.n, coalesce(t.name, '#' || g.target_id), g.key, v_message;
        END;
    END LOOP;
END;
$$;

CREATE OR REPLACE PROCEDURE pgcounters.drain_all(
    batch_size integer DEFAULT 10000,
    INOUT deltas bigint DEFAULT NULL,
    INOUT busy bigint DEFAULT NULL,
    INOUT quarantined bigint DEFAULT NULL
)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_unlogged boolean;
    v_done boolean[] := ARRAY[false, false];
    v_busy bigint[] := ARRAY[0, 0];
    v_setting text := nullif(current_setting('pgcounters.max_batch_size', true), '');
    v_max bigint := 500000;
    v_span bigint;
    v_size integer;
    -- batches of batch_size still to take from each queue after a large one was refused
    v_small integer[] := ARRAY[0, 0];
    i integer;
BEGIN
    IF batch_size IS NULL OR batch_size < 1 THEN
        RAISE EXCEPTION 'batch size must be a positive integer, got %',
            coalesce(batch_size::text, 'NULL')
            USING ERRCODE = 'PC005';
    END IF;
    IF v_setting IS NOT NULL THEN
        IF v_setting !~ '^\s*[0-9]{1,10}\s*$' OR v_setting::bigint NOT BETWEEN 1 AND 2147483647
        THEN
            RAISE EXCEPTION 'pgcounters.max_batch_size must be a positive integer of at most '
                            '2147483647, got %', v_setting
                USING ERRCODE = 'PC005';
        END IF;
        v_max := v_setting::bigint;
    END IF;
    -- nothing is done yet: in a transaction block PostgreSQL refuses this COMMIT
    -- (2D000, invalid transaction termination). Comparing now() with statement_timestamp()
    -- refused a CALL whose arguments were sent as parameters (the extended protocol of
    -- psycopg, JDBC, asyncpg), whose Bind and Execute are two messages.
    COMMIT;
    deltas := 0;
    quarantined := 0;
    WHILE NOT (v_done[1] AND v_done[2]) LOOP
        FOR i IN 1 .. 2 LOOP
            CONTINUE WHEN v_done[i];
            v_unlogged := i = 2;
            -- Read Committed whatever the session's default (as the worker's batches)
            SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
            v_span := 0;
            IF v_max > batch_size AND v_small[i] = 0 THEN
                -- a queue holding more than a batch: all of it in one, up to v_max
                IF v_unlogged THEN
                    SELECT coalesce(max(q.id) - min(q.id) + 1, 0) INTO v_span
                      FROM pgcounters.queue_unlogged AS q;
                ELSE
                    SELECT coalesce(max(q.id) - min(q.id) + 1, 0) INTO v_span
                      FROM pgcounters.queue AS q;
                END IF;
            END IF;
            v_size := greatest(batch_size, least(v_span, v_max))::integer;
            v_small[i] := greatest(v_small[i] - 1, 0);
            IF v_size > batch_size THEN
                BEGIN
                    PERFORM set_config('pgcounters.careful_limit', batch_size::text, true);
                    SELECT * INTO r FROM pgcounters.drain_queue(v_size, v_unlogged);
                EXCEPTION WHEN SQLSTATE 'PC022' THEN
                    -- a delta that cannot be applied: this part of the queue in batches of
                    -- batch_size, the first one now
                    v_small[i] := ceil(v_size::numeric / batch_size)::integer - 1;
                    SELECT * INTO r FROM pgcounters.drain_queue(batch_size, v_unlogged);
                END;
            ELSE
                SELECT * INTO r FROM pgcounters.drain_queue(batch_size, v_unlogged);
            END IF;
            COMMIT;
            deltas := deltas + r.deltas;
            quarantined := quarantined + r.quarantined;
            v_busy[i] := r.busy;
            v_done[i] := r.deltas = 0 AND r.quarantined = 0 AND (r.busy = 0 OR NOT r.ahead);
        END LOOP;
    END LOOP;
    busy := v_busy[1] + v_busy[2];
END;
$$;
