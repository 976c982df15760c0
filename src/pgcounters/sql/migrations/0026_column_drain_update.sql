-- Version 26: the column part of a batch in one UPDATE when no row is busy.
--
-- _drain_columns (same arguments and results) locked every parent row of a
-- batch without waiting (FOR NO KEY UPDATE SKIP LOCKED) and then updated the
-- rows it had locked: two visits of each row, one WAL record for the lock and
-- one for the update. It now first tries one UPDATE of the parent rows under a
-- lock_timeout of 1 ms; a row another transaction holds stops that UPDATE within
-- 1 ms and it is rolled back (its row locks with it), and the counter then takes
-- the statement of version 20, which puts busy rows' deltas back in the queue.
-- The attempt is made only in sessions that set pgcounters.fast_column_drain to
-- on, for batches of at most 20,000 column keys and while the batch's parent rows
-- were taken less than half the session's deadlock_timeout ago. An application
-- session with a shorter deadlock_timeout, or an UPDATE slowed by the table's own
-- triggers, can still have its deadlock check run during the 1 ms wait and be the
-- one aborted: so the attempt is a choice, off by default, and without it the
-- drain never waits for a row. A table found with busy rows takes the locking
-- statement directly in the session's next batches, until one of them finds none
-- busy.

-- Apply the column part of a batch. For each counter (parent tables in name
-- order, drainers taking turns on a table), one UPDATE adds the deltas summed per
-- typed key to the parent rows, under a lock_timeout of 1 ms: a row another
-- transaction holds stops it within 1 ms (it is rolled back, row locks and all),
-- and the counter then takes the statement that locks the rows without waiting
-- (in key order), updates the rows it locked, and puts the deltas of rows another
-- transaction holds back into the queue (one delta per key, as old as its oldest).
-- The attempt is made only when the session sets pgcounters.fast_column_drain to
-- on, for batches of at most 20,000 keys, while the batch's first parent row was
-- taken less than half the deadlock_timeout ago (an application with the same
-- deadlock_timeout waiting for one of the batch's rows cannot reach its deadlock
-- check during the 1 ms wait; one with a shorter one can). A table found holding
-- busy rows goes straight to the locking statement in the session's next batches,
-- until one of them finds no row busy. The deltas of rows that no longer exist are discarded. A data error (a
-- sum out of range, a key that does not cast) aborts the statement: the batch
-- then takes the careful path of drain_queue (_lock_parents, _apply_column).
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
                           json_agg(json_build_array($3::text, ARRAY[a.key::text]))
                               FILTER (WHERE $4)
                      FROM applied AS a
                    $q$,
                    t.key_types[1]::regtype, t.target_key_column, v_table, t.target_column,
                    v_sum)
                INTO v_applied, v_changes
                USING p_columns, t.id, t.name, v_note;
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
                       (SELECT json_agg(json_build_array($3::text, ARRAY[l.key::text]))
                          FROM locked AS l WHERE $4)
                $q$,
                t.key_types[1]::regtype, t.target_key_column, v_table, t.target_column, v_queue,
                v_sum)
            INTO v_applied, v_busy, v_first, v_changes
            USING p_columns, t.id, t.name, v_note;
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
