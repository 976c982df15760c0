-- Version 30: drain_all takes a backlog in one batch, as the worker and Counters.drain do.
--
-- A batch writes one row per distinct (counter, key) it holds, whatever the number of
-- deltas of each. A queue holding more deltas than batch_size is now drained in one
-- batch of all of them, up to the session's pgcounters.max_batch_size (500000 when unset;
-- equal to batch_size or less: every batch is of batch_size): a backlog over many keys
-- writes each key once instead of once per batch. The size is read from the span of the
-- queue's ids (two probes of its primary key), before each batch.
--
-- A batch holding a delta that cannot be applied takes the careful path: one (counter,
-- key) per subtransaction, many times the fast path's time, with every row it changed
-- locked until it commits. Over a large batch that held the parent rows of counter columns
-- for many seconds: _drain_carefully now refuses a batch larger than the session's
-- pgcounters.careful_limit (PC022, the batch rolls back), which a drainer taking a backlog
-- in one batch sets to its usual batch size; it then takes that part of the queue in
-- batches of that size, the bad delta set aside by one of them.
--
-- The column part of a batch (_drain_columns, the statement that never waits) sums the
-- deltas per parent key in key order: the rows are then locked, joined and updated in the
-- order of the parent table's index instead of the hash aggregate's, which over many keys
-- missed the cache at every row (500,000 keys in one batch: 5.4 s before, 3.7-3.9 s
-- after; in batches of 10,000: 3.8-3.9 s before, 3.3-3.5 s after).

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
    IF now() <> statement_timestamp() THEN
        RAISE EXCEPTION 'pgcounters.drain_all commits after every batch: CALL it outside '
                        'a transaction block (in autocommit mode)'
            USING ERRCODE = 'PC005';
    END IF;
    -- nothing is done yet: in a transaction block the check above cannot tell
    -- (BEGIN and CALL in one query string), PostgreSQL refuses this COMMIT
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

CREATE OR REPLACE FUNCTION pgcounters._drain_columns(
    p_columns pgcounters.batch_delta[], p_unlogged boolean,
    OUT keys bigint, OUT busy bigint, OUT first_requeued bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text := CASE WHEN p_unlogged THEN 'queue_unlogged' ELSE 'queue' END;
    t pgcounters.targets;
    v_table text;
    v_applied bigint;
    v_busy bigint;
    v_first bigint;
    v_note boolean := current_setting('pgcounters.note_changes', true) = 'on';
    -- the most keys of one counter a batch lists, if set (version 27)
    v_cap bigint := CASE WHEN current_setting('pgcounters.note_max_keys', true) ~ '^[0-9]{1,18}$'
                         THEN current_setting('pgcounters.note_max_keys', true)::bigint END;
    v_changes json;
    v_lock_timeout text := current_setting('lock_timeout');
    -- tables whose last batch in this session found rows another transaction held
    v_held text[] := coalesce(
        nullif(current_setting('pgcounters.held_tables', true), ''), '{}')::text[];
    v_held_before text[] := v_held;
    v_sum text;
    v_careful boolean;
    -- the 1 ms attempt only while every parent row this batch holds was taken less than
    -- half the deadlock_timeout ago: an application waiting for one of them has not
    -- reached its own deadlock check when the attempt waits
    v_entered timestamptz := clock_timestamp();
    v_budget interval := current_setting('deadlock_timeout')::interval / 2;
    v_fast boolean := coalesce(current_setting('pgcounters.fast_column_drain', true), '') = 'on';
BEGIN
    keys := 0;
    busy := 0;
    FOR t IN
        SELECT g.* FROM pgcounters.targets AS g
         WHERE g.id IN (SELECT d.target_id FROM unnest(p_columns) AS d)
         ORDER BY g.target_schema, g.target_table, g.id
    LOOP
        IF v_table IS DISTINCT FROM format('%I.%I', t.target_schema, t.target_table) THEN
            v_table := format('%I.%I', t.target_schema, t.target_table);
            -- drainers take turns on a table (tables in name order, so they cannot wait
            -- for each other in a cycle): without this, a second drainer finds every row
            -- the first one holds busy and puts its deltas back.
            PERFORM pg_advisory_xact_lock(hashtext('pgcounters.parents'), hashtext(v_table));
        END IF;
        -- a sum of decimals: the deltas are units of 10^-scale (version 13)
        v_sum := CASE WHEN t.scale IS NULL THEN 'd.delta::bigint'
                      ELSE format('pgcounters.unscaled(d.delta, %s)', t.scale) END;
        PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
        v_busy := 0;
        v_first := NULL;
        -- the attempt is chosen per session (see the comment above): off by default
        v_careful := NOT v_fast OR v_table = ANY (v_held) OR cardinality(p_columns) > 20000
                     OR clock_timestamp() - v_entered > v_budget;
        IF NOT v_careful THEN
            BEGIN
                PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
                EXECUTE format($q$
                    WITH d AS (
                        SELECT b.key::%1$s AS key, sum(b.delta) AS delta
                          FROM unnest($1::pgcounters.batch_delta[]) AS b
                         WHERE b.target_id = $2
                         GROUP BY 1
                    ), applied AS (
                        UPDATE %3$s AS x SET %4$I = coalesce(x.%4$I, 0) + %5$s
                          FROM d
                         WHERE x.%2$I = d.key
                        RETURNING x.%2$I AS key
                    )
                    SELECT count(*),
                           CASE WHEN $4 AND count(*) > $5
                                THEN json_build_array(json_build_array($3::text, NULL))
                                ELSE json_agg(json_build_array($3::text, ARRAY[a.key::text]))
                                         FILTER (WHERE $4 AND ($5 IS NULL
                                             OR (SELECT count(*) FROM applied) <= $5)) END
                      FROM applied AS a
                    $q$,
                    t.key_types[1]::regtype, t.target_key_column, v_table, t.target_column,
                    v_sum)
                INTO v_applied, v_changes
                USING p_columns, t.id, t.name, v_note, v_cap;
                PERFORM pg_catalog.set_config('lock_timeout', v_lock_timeout, true);
            EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
                -- the rollback of the block restored lock_timeout
                v_careful := true;
            END;
        END IF;
        IF v_careful THEN
            EXECUTE format($q$
                WITH d AS MATERIALIZED (
                    SELECT b.key::%1$s AS key, min(b.key) AS text_key, sum(b.delta) AS delta,
                           sum(b.n) AS n, min(b.created_at) AS created_at
                      FROM unnest($1::pgcounters.batch_delta[]) AS b
                     WHERE b.target_id = $2
                     GROUP BY 1
                     -- in key order: the rows are then locked, joined and updated in the
                     -- order of the parent table's index (version 30; a batch of 500,000
                     -- keys took 1.4x as long in the hash aggregate's order)
                     ORDER BY 1
                ), locked AS MATERIALIZED (
                    SELECT x.%2$I AS key FROM %3$s AS x
                     WHERE x.%2$I = ANY (ARRAY(SELECT d.key FROM d))
                     ORDER BY x.%2$I
                       FOR NO KEY UPDATE OF x SKIP LOCKED
                ), applied AS (
                    UPDATE %3$s AS x SET %4$I = coalesce(x.%4$I, 0) + %6$s
                      FROM d JOIN locked AS l ON l.key = d.key
                     WHERE x.%2$I = d.key
                    RETURNING 1
                ), held AS MATERIALIZED (
                    SELECT d.* FROM d
                     WHERE NOT EXISTS (SELECT 1 FROM locked AS l WHERE l.key = d.key)
                       AND EXISTS (SELECT 1 FROM %3$s AS x WHERE x.%2$I = d.key)
                ), back AS (
                    INSERT INTO pgcounters.%5$I (target_id, key, delta, created_at)
                    SELECT $2, ARRAY[h.text_key]::text, h.delta::bigint, h.created_at
                      FROM held AS h
                     ORDER BY h.key
                    RETURNING id
                )
                SELECT (SELECT count(*) FROM applied),
                       (SELECT coalesce(sum(h.n), 0) FROM held AS h)::bigint,
                       (SELECT min(b.id) FROM back AS b),
                       (SELECT CASE WHEN count(*) > $5
                                    THEN json_build_array(json_build_array($3::text, NULL))
                                    ELSE json_agg(json_build_array($3::text, ARRAY[l.key::text]))
                                             FILTER (WHERE $5 IS NULL
                                                 OR (SELECT count(*) FROM locked) <= $5) END
                          FROM locked AS l WHERE $4)
                $q$,
                t.key_types[1]::regtype, t.target_key_column, v_table, t.target_column, v_queue,
                v_sum)
            INTO v_applied, v_busy, v_first, v_changes
            USING p_columns, t.id, t.name, v_note, v_cap;
            v_held := array_remove(v_held, v_table);
            IF v_busy > 0 THEN
                v_held := v_held || v_table;
            END IF;
        END IF;
        PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
        keys := keys + v_applied;
        busy := busy + v_busy;
        first_requeued := least(first_requeued, v_first);
        IF v_changes IS NOT NULL THEN
            -- the batch's JSON array spliced onto the notes so far, as text (version 20):
            -- building jsonb and parsing the notes again cost a third of a batch's time
            PERFORM pg_catalog.set_config('pgcounters.changes',
                CASE WHEN coalesce(current_setting('pgcounters.changes', true), '') IN ('', '[]')
                     THEN v_changes::text
                     ELSE left(current_setting('pgcounters.changes', true), -1) || ', '
                          || substr(v_changes::text, 2) END, true);
        END IF;
    END LOOP;
    IF v_held IS DISTINCT FROM v_held_before THEN
        -- for the session (kept if the batch commits)
        PERFORM pg_catalog.set_config('pgcounters.held_tables', v_held::text, false);
    END IF;
END;
$$;

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
         ORDER BY r.target_id, r.key
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
