-- Version 17: change notifications. A drain batch reports the keys it changed.
--
-- A session that sets pgcounters.note_changes to 'on' (a worker with a
-- listener) finds, before its batch commits, the keys the batch applied in the
-- transaction's setting pgcounters.changes: named counters whose summed delta
-- was not zero, column counters' parent rows the batch updated (not the ones
-- left busy, nor deltas set aside). The drain functions are redefined with the
-- same signatures; without the setting they do what version 15's did.

CREATE OR REPLACE FUNCTION pgcounters.drain_queue(
    p_limit integer DEFAULT 10000,
    p_unlogged boolean DEFAULT false,
    OUT deltas bigint,
    OUT keys bigint,
    OUT busy bigint,
    OUT quarantined bigint,
    OUT ahead boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text := CASE WHEN p_unlogged THEN 'queue_unlogged' ELSE 'queue' END;
    v_started timestamptz := clock_timestamp();
    v_sole boolean;
    v_claim text;
    v_skip text := '';
    v_broken integer[] := pgcounters._broken_targets();
    v_head bigint;
    v_claimed bigint;
    v_orphans bigint;
    v_columns pgcounters.batch_delta[];
    v_first_requeued bigint;
    v_state text;
    v_message text;
    v_column_keys bigint;
    v_column_busy bigint;
    v_last_claimed bigint;
    -- a listener asked for the keys each batch changes (version 17)
    v_note boolean := current_setting('pgcounters.note_changes', true) = 'on';
    v_changes jsonb;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'batch size must be a positive integer, got %', p_limit
            USING ERRCODE = 'PC005';
    END IF;
    IF cardinality(v_broken) > 0 THEN
        RAISE WARNING 'pgcounters: deltas of counters % stay queued: their table or column '
                      'no longer exists', v_broken;
        v_skip := ' AND q.target_id <> ALL ($2)';
    END IF;
    deltas := 0;
    keys := 0;
    busy := 0;
    quarantined := 0;
    ahead := false;

    v_sole := pg_try_advisory_xact_lock(hashtext('pgcounters.drain'), p_unlogged::integer);
    IF v_sole THEN
        v_claim := 'q.id BETWEEN (SELECT lo FROM head) AND (SELECT lo FROM head) + $1 - 1';
    ELSE
        v_claim := 'q.id = ANY (ARRAY(SELECT id FROM pgcounters.%1$I AS q WHERE true'
                   || v_skip || ' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))';
    END IF;

    BEGIN
        LOOP
        EXECUTE format($q$
            WITH head AS MATERIALIZED (
                SELECT min(id) AS lo FROM pgcounters.%1$I AS q WHERE true $q$ || v_skip || $q$
            ), claimed AS (
                DELETE FROM pgcounters.%1$I AS q
                 WHERE $q$ || v_claim || v_skip || $q$
                RETURNING q.id, q.target_id, q.key, q.delta, q.created_at
            ), summed AS (
                SELECT target_id, key::text[] AS key, sum(delta) AS delta, count(*) AS n,
                       min(created_at) AS created_at, max(id) AS last_id
                  FROM claimed
                 GROUP BY target_id, claimed.key
            ), named AS (
                INSERT INTO pgcounters.counters AS k (target_id, key, value)
                SELECT s.target_id, s.key, s.delta
                  FROM summed s
                  JOIN pgcounters.targets t ON t.id = s.target_id AND t.target_table IS NULL
                 WHERE s.delta <> 0
                 ORDER BY s.target_id, s.key
                ON CONFLICT (target_id, key) DO UPDATE SET value = k.value + excluded.value
                RETURNING 1
            )
            SELECT coalesce(sum(s.n), 0)::bigint,
                   (SELECT count(*) FROM named),
                   array_agg((s.target_id, s.key[1], s.delta, s.n, s.created_at)::pgcounters.batch_delta)
                       FILTER (WHERE t.target_table IS NOT NULL AND s.delta <> 0),
                   $q$ || CASE WHEN v_sole THEN '(SELECT lo FROM head)' ELSE 'NULL::bigint' END || $q$,
                   count(*) FILTER (WHERE t.id IS NULL
                       OR coalesce(array_length(s.key, 1), 0)
                          <> coalesce(array_length(t.key_types, 1), 0)),
                   max(s.last_id),
                   jsonb_agg(jsonb_build_array(t.name, s.key))
                       FILTER (WHERE $3 AND t.target_table IS NULL AND s.delta <> 0)
              FROM summed s
              LEFT JOIN pgcounters.targets t ON t.id = s.target_id
        $q$, v_queue)
        INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes
        USING p_limit, v_broken, v_note;
        -- a range found empty while the queue was not: another drainer held it and
        -- took it; claim again from the new head (each round sees a newer snapshot)
        EXIT WHEN v_claimed > 0 OR v_head IS NULL;
        END LOOP;
        IF v_orphans > 0 THEN
            -- deltas of a counter that no longer exists, or keys of the wrong
            -- length: the careful path sets them aside
            RAISE EXCEPTION 'deltas of unknown counters or with wrong keys' USING ERRCODE = 'PC003';
        END IF;
        deltas := v_claimed;
        IF v_changes IS NOT NULL THEN
            PERFORM pg_catalog.set_config('pgcounters.changes',
                (coalesce(nullif(current_setting('pgcounters.changes', true), ''), '[]')::jsonb
                 || v_changes)::text, true);
        END IF;
        IF v_columns IS NOT NULL THEN
            SELECT d.keys, d.busy, d.first_requeued
              INTO v_column_keys, v_column_busy, v_first_requeued
              FROM pgcounters._drain_columns(v_columns, p_unlogged) AS d;
            keys := keys + v_column_keys;
            busy := v_column_busy;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        IF NOT pgcounters._quarantinable(v_state) THEN
            RAISE;
        END IF;
        SELECT d.deltas, d.keys, d.busy, d.quarantined, d.first_requeued, d.last_claimed
          INTO deltas, keys, busy, quarantined, v_first_requeued, v_last_claimed
          FROM pgcounters._drain_carefully(p_limit, p_unlogged, v_sole, v_skip, v_broken) AS d;
    END;

    deltas := deltas - busy - quarantined;
    IF busy > 0 THEN
        -- deltas between this batch and the ones it put back (a scan above the batch's
        -- ids: below them, the index holds the entries of the rows just deleted)
        EXECUTE format(
            'SELECT EXISTS (SELECT 1 FROM pgcounters.%I WHERE id > $1 AND id < $2)', v_queue)
        INTO ahead USING v_last_claimed, v_first_requeued;
    END IF;
    IF deltas > 0 OR busy > 0 OR quarantined > 0 THEN
        PERFORM pgcounters._record_drain(
            p_unlogged, deltas, keys,
            extract(epoch FROM clock_timestamp() - v_started)::double precision,
            busy, quarantined);
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
BEGIN
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
    v_changes jsonb;
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
            -- the first one holds busy and puts its deltas back. A drainer holding this
            -- lock waits for nothing (SKIP LOCKED below), so the wait is always short.
            PERFORM pg_advisory_xact_lock(hashtext('pgcounters.parents'), hashtext(v_table));
        END IF;
        PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
        EXECUTE format($q$
            WITH d AS MATERIALIZED (
                SELECT b.key::%1$s AS key, min(b.key) AS text_key, sum(b.delta) AS delta,
                       sum(b.n) AS n, min(b.created_at) AS created_at
                  FROM unnest($1::pgcounters.batch_delta[]) AS b
                 WHERE b.target_id = $2
                 GROUP BY 1
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
                   (SELECT jsonb_agg(jsonb_build_array($3::text, ARRAY[l.key::text]))
                      FROM locked AS l WHERE $4)
            $q$,
            t.key_types[1]::regtype, t.target_key_column, v_table, t.target_column, v_queue,
            -- a sum of decimals: the deltas are units of 10^-scale (version 13)
            CASE WHEN t.scale IS NULL THEN 'd.delta::bigint'
                 ELSE format('pgcounters.unscaled(d.delta, %s)', t.scale) END)
        INTO v_applied, v_busy, v_first, v_changes
        USING p_columns, t.id, t.name, v_note;
        PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
        keys := keys + v_applied;
        busy := busy + v_busy;
        first_requeued := least(first_requeued, v_first);
        IF v_changes IS NOT NULL THEN
            PERFORM pg_catalog.set_config('pgcounters.changes',
                (coalesce(nullif(current_setting('pgcounters.changes', true), ''), '[]')::jsonb
                 || v_changes)::text, true);
        END IF;
    END LOOP;
END;
$$;
