-- Version 30: drain_all takes a backlog in one batch, as the worker and Counters.drain do.
--
-- A batch writes one row per distinct (counter, key) it holds, whatever the number of
-- deltas of each. A queue holding more deltas than batch_size is now drained in one
-- batch of all of them, up to the session's pgcounters.max_batch_size (500000 when unset;
-- equal to batch_size or less: every batch is of batch_size): a backlog over many keys
-- writes each key once instead of once per batch. The size is read from the span of the
-- queue's ids (two probes of its primary key), before each batch.

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
            IF v_max > batch_size THEN
                -- a queue holding more than a batch: all of it in one, up to v_max
                IF v_unlogged THEN
                    SELECT coalesce(max(q.id) - min(q.id) + 1, 0) INTO v_span
                      FROM pgcounters.queue_unlogged AS q;
                ELSE
                    SELECT coalesce(max(q.id) - min(q.id) + 1, 0) INTO v_span
                      FROM pgcounters.queue AS q;
                END IF;
            END IF;
            SELECT * INTO r
              FROM pgcounters.drain_queue(greatest(batch_size, least(v_span, v_max))::integer,
                                          v_unlogged);
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
