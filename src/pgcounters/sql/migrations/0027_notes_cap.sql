-- Version 27: a drain batch lists at most a reporting worker's cap of keys per counter.
--
-- A worker reporting changes lists at most notify_max_keys keys of one counter in a
-- report, and reports a counter with more as "many keys". The drain functions still
-- built one JSON element per changed key, which the worker then dropped. A session that
-- notes changes (pgcounters.note_changes on) may now set pgcounters.note_max_keys to
-- a non-negative integer: the most keys of one counter a batch lists. A counter of more
-- keys is noted once, as [name, null], its keys not listed. drain_queue and
-- _drain_columns keep their signatures and results; only their notes change.

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
    -- the most keys of one counter a batch lists, if set (version 27)
    v_cap bigint := CASE WHEN current_setting('pgcounters.note_max_keys', true) ~ '^[0-9]{1,18}$'
                         THEN current_setting('pgcounters.note_max_keys', true)::bigint END;
    v_crowded json;
    v_changes json;
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
        -- no broken counter (the usual case): static statements, planned once a session
        IF v_skip = '' AND NOT p_unlogged AND v_sole THEN
            WITH head AS MATERIALIZED (
                SELECT min(id) AS lo FROM pgcounters.queue AS q
            ), claimed AS (
                DELETE FROM pgcounters.queue AS q
                 WHERE q.id BETWEEN (SELECT lo FROM head) AND (SELECT lo FROM head) + p_limit - 1
                RETURNING q.id, q.target_id, q.key, q.delta, q.created_at
            ), summed AS (
                SELECT target_id, key::text[] AS key, sum(delta) AS delta, count(*) AS n,
                       min(created_at) AS created_at, max(id) AS last_id
                  FROM claimed
                 GROUP BY target_id, claimed.key
            ), crowded AS (
                -- the counters with more keys than a batch lists: noted once, keys unlisted
                SELECT summed.target_id FROM summed
                 WHERE v_note AND v_cap IS NOT NULL AND summed.delta <> 0
                 GROUP BY summed.target_id HAVING count(*) > v_cap
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
                   (SELECT lo FROM head),
                   count(*) FILTER (WHERE t.id IS NULL
                       OR coalesce(array_length(s.key, 1), 0)
                          <> coalesce(array_length(t.key_types, 1), 0)),
                   max(s.last_id),
                   json_agg(json_build_array(t.name, s.key))
                       FILTER (WHERE v_note AND t.target_table IS NULL AND s.delta <> 0
                           AND (v_cap IS NULL
                                OR s.target_id NOT IN (SELECT c.target_id FROM crowded AS c))),
                   CASE WHEN v_cap IS NOT NULL THEN
                       (SELECT json_agg(json_build_array(g.name, NULL))
                          FROM crowded AS c
                          JOIN pgcounters.targets AS g
                            ON g.id = c.target_id AND g.target_table IS NULL) END
              INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes,
                   v_crowded
              FROM summed s
              LEFT JOIN pgcounters.targets t ON t.id = s.target_id;
        ELSIF v_skip = '' AND NOT p_unlogged THEN
            WITH claimed AS (
                DELETE FROM pgcounters.queue AS q
                 WHERE q.id = ANY (ARRAY(SELECT id FROM pgcounters.queue AS q
                                    ORDER BY id LIMIT p_limit FOR UPDATE SKIP LOCKED))
                RETURNING q.id, q.target_id, q.key, q.delta, q.created_at
            ), summed AS (
                SELECT target_id, key::text[] AS key, sum(delta) AS delta, count(*) AS n,
                       min(created_at) AS created_at, max(id) AS last_id
                  FROM claimed
                 GROUP BY target_id, claimed.key
            ), crowded AS (
                -- the counters with more keys than a batch lists: noted once, keys unlisted
                SELECT summed.target_id FROM summed
                 WHERE v_note AND v_cap IS NOT NULL AND summed.delta <> 0
                 GROUP BY summed.target_id HAVING count(*) > v_cap
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
                   NULL::bigint,
                   count(*) FILTER (WHERE t.id IS NULL
                       OR coalesce(array_length(s.key, 1), 0)
                          <> coalesce(array_length(t.key_types, 1), 0)),
                   max(s.last_id),
                   json_agg(json_build_array(t.name, s.key))
                       FILTER (WHERE v_note AND t.target_table IS NULL AND s.delta <> 0
                           AND (v_cap IS NULL
                                OR s.target_id NOT IN (SELECT c.target_id FROM crowded AS c))),
                   CASE WHEN v_cap IS NOT NULL THEN
                       (SELECT json_agg(json_build_array(g.name, NULL))
                          FROM crowded AS c
                          JOIN pgcounters.targets AS g
                            ON g.id = c.target_id AND g.target_table IS NULL) END
              INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes,
                   v_crowded
              FROM summed s
              LEFT JOIN pgcounters.targets t ON t.id = s.target_id;
        ELSIF v_skip = '' AND v_sole THEN
            WITH head AS MATERIALIZED (
                SELECT min(id) AS lo FROM pgcounters.queue_unlogged AS q
            ), claimed AS (
                DELETE FROM pgcounters.queue_unlogged AS q
                 WHERE q.id BETWEEN (SELECT lo FROM head) AND (SELECT lo FROM head) + p_limit - 1
                RETURNING q.id, q.target_id, q.key, q.delta, q.created_at
            ), summed AS (
                SELECT target_id, key::text[] AS key, sum(delta) AS delta, count(*) AS n,
                       min(created_at) AS created_at, max(id) AS last_id
                  FROM claimed
                 GROUP BY target_id, claimed.key
            ), crowded AS (
                -- the counters with more keys than a batch lists: noted once, keys unlisted
                SELECT summed.target_id FROM summed
                 WHERE v_note AND v_cap IS NOT NULL AND summed.delta <> 0
                 GROUP BY summed.target_id HAVING count(*) > v_cap
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
                   (SELECT lo FROM head),
                   count(*) FILTER (WHERE t.id IS NULL
                       OR coalesce(array_length(s.key, 1), 0)
                          <> coalesce(array_length(t.key_types, 1), 0)),
                   max(s.last_id),
                   json_agg(json_build_array(t.name, s.key))
                       FILTER (WHERE v_note AND t.target_table IS NULL AND s.delta <> 0
                           AND (v_cap IS NULL
                                OR s.target_id NOT IN (SELECT c.target_id FROM crowded AS c))),
                   CASE WHEN v_cap IS NOT NULL THEN
                       (SELECT json_agg(json_build_array(g.name, NULL))
                          FROM crowded AS c
                          JOIN pgcounters.targets AS g
                            ON g.id = c.target_id AND g.target_table IS NULL) END
              INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes,
                   v_crowded
              FROM summed s
              LEFT JOIN pgcounters.targets t ON t.id = s.target_id;
        ELSIF v_skip = '' THEN
            WITH claimed AS (
                DELETE FROM pgcounters.queue_unlogged AS q
                 WHERE q.id = ANY (ARRAY(SELECT id FROM pgcounters.queue_unlogged AS q
                                    ORDER BY id LIMIT p_limit FOR UPDATE SKIP LOCKED))
                RETURNING q.id, q.target_id, q.key, q.delta, q.created_at
            ), summed AS (
                SELECT target_id, key::text[] AS key, sum(delta) AS delta, count(*) AS n,
                       min(created_at) AS created_at, max(id) AS last_id
                  FROM claimed
                 GROUP BY target_id, claimed.key
            ), crowded AS (
                -- the counters with more keys than a batch lists: noted once, keys unlisted
                SELECT summed.target_id FROM summed
                 WHERE v_note AND v_cap IS NOT NULL AND summed.delta <> 0
                 GROUP BY summed.target_id HAVING count(*) > v_cap
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
                   NULL::bigint,
                   count(*) FILTER (WHERE t.id IS NULL
                       OR coalesce(array_length(s.key, 1), 0)
                          <> coalesce(array_length(t.key_types, 1), 0)),
                   max(s.last_id),
                   json_agg(json_build_array(t.name, s.key))
                       FILTER (WHERE v_note AND t.target_table IS NULL AND s.delta <> 0
                           AND (v_cap IS NULL
                                OR s.target_id NOT IN (SELECT c.target_id FROM crowded AS c))),
                   CASE WHEN v_cap IS NOT NULL THEN
                       (SELECT json_agg(json_build_array(g.name, NULL))
                          FROM crowded AS c
                          JOIN pgcounters.targets AS g
                            ON g.id = c.target_id AND g.target_table IS NULL) END
              INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes,
                   v_crowded
              FROM summed s
              LEFT JOIN pgcounters.targets t ON t.id = s.target_id;
        ELSE
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
                ), crowded AS (
                    -- the counters with more keys than a batch lists: noted once, keys unlisted
                    SELECT summed.target_id FROM summed
                     WHERE $3 AND $4 IS NOT NULL AND summed.delta <> 0
                     GROUP BY summed.target_id HAVING count(*) > $4
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
                       json_agg(json_build_array(t.name, s.key))
                           FILTER (WHERE $3 AND t.target_table IS NULL AND s.delta <> 0
                               AND ($4 IS NULL
                                    OR s.target_id NOT IN (SELECT c.target_id FROM crowded AS c))),
                       CASE WHEN $4 IS NOT NULL THEN
                           (SELECT json_agg(json_build_array(g.name, NULL))
                              FROM crowded AS c
                              JOIN pgcounters.targets AS g
                                ON g.id = c.target_id AND g.target_table IS NULL) END
                  FROM summed s
                  LEFT JOIN pgcounters.targets t ON t.id = s.target_id
            $q$, v_queue)
            INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes,
                   v_crowded
            USING p_limit, v_broken, v_note, v_cap;
        END IF;
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
            -- the batch's JSON array spliced onto the notes so far, as text (version 20):
            -- building jsonb and parsing the notes again cost a third of a batch's time
            PERFORM pg_catalog.set_config('pgcounters.changes',
                CASE WHEN coalesce(current_setting('pgcounters.changes', true), '') IN ('', '[]')
                     THEN v_changes::text
                     ELSE left(current_setting('pgcounters.changes', true), -1) || ', '
                          || substr(v_changes::text, 2) END, true);
        END IF;
        IF v_crowded IS NOT NULL THEN
            -- [name, null] for each counter of more keys than listed: "many keys"
            PERFORM pg_catalog.set_config('pgcounters.changes',
                CASE WHEN coalesce(current_setting('pgcounters.changes', true), '') IN ('', '[]')
                     THEN v_crowded::text
                     ELSE left(current_setting('pgcounters.changes', true), -1) || ', '
                          || substr(v_crowded::text, 2) END, true);
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
