-- Version 22: the drain's batch statement is planned once a session.
--
-- drain_queue built its claim-sum-upsert statement as text and ran it with
-- EXECUTE, so PostgreSQL parsed and planned it on every batch: most of the cost
-- of a small batch (a worker under a steady load drains a few dozen deltas at a
-- time). When no column counter is broken (the usual case), the statement is now
-- one of four static statements (logged or unlogged queue; the sole drainer's
-- range claim or the SKIP LOCKED claim of any other), whose plans PL/pgSQL keeps
-- for the session. With a broken counter the dynamic statement runs as before.
-- Same signature, same results.

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
                       FILTER (WHERE v_note AND t.target_table IS NULL AND s.delta <> 0)
              INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes
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
                       FILTER (WHERE v_note AND t.target_table IS NULL AND s.delta <> 0)
              INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes
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
                       FILTER (WHERE v_note AND t.target_table IS NULL AND s.delta <> 0)
              INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes
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
                       FILTER (WHERE v_note AND t.target_table IS NULL AND s.delta <> 0)
              INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes
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
                           FILTER (WHERE $3 AND t.target_table IS NULL AND s.delta <> 0)
                  FROM summed s
                  LEFT JOIN pgcounters.targets t ON t.id = s.target_id
            $q$, v_queue)
            INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes
            USING p_limit, v_broken, v_note;
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
