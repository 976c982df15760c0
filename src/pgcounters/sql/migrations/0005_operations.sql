-- pgcounters schema, version 5: running it in production.
--
-- * drain statistics, written once per batch, read by `pgcounters status`;
-- * a faster drain claim for the common case of one drainer per queue;
-- * optional, rate-limited wake-ups of the workers (LISTEN/NOTIFY).

-- ---------------------------------------------------------------------------
-- Drain statistics
-- ---------------------------------------------------------------------------

-- One row per (minute, queue, drainer backend): a batch adds to the row of its
-- own backend, so two drainers never wait on each other's statistics row.
-- Rows older than an hour are folded into one totals row per queue
-- (bucket '-infinity', pid 0), so the table stays a few hundred rows and the
-- totals keep growing (the Prometheus counters). Nothing is written when a
-- batch finds the queue empty.
CREATE TABLE pgcounters.drain_stats (
    bucket   timestamptz NOT NULL,
    unlogged boolean NOT NULL,
    pid      integer NOT NULL,
    batches  bigint NOT NULL,
    deltas   bigint NOT NULL,
    keys     bigint NOT NULL,
    seconds  double precision NOT NULL,
    PRIMARY KEY (bucket, unlogged, pid)
) WITH (fillfactor = 50);

CREATE FUNCTION pgcounters._record_drain(
    p_unlogged boolean, p_deltas bigint, p_keys bigint, p_seconds double precision
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_bucket timestamptz := date_trunc('minute', now());
    v_new boolean;
BEGIN
    INSERT INTO pgcounters.drain_stats AS s
           (bucket, unlogged, pid, batches, deltas, keys, seconds)
    VALUES (v_bucket, p_unlogged, pg_backend_pid(), 1, p_deltas, p_keys, p_seconds)
    ON CONFLICT (bucket, unlogged, pid) DO UPDATE
       SET batches = s.batches + 1,
           deltas = s.deltas + excluded.deltas,
           keys = s.keys + excluded.keys,
           seconds = s.seconds + excluded.seconds
    RETURNING (xmax = 0) INTO v_new;

    IF v_new THEN
        -- once a minute per drainer: fold old rows into the totals. SKIP LOCKED:
        -- two drainers pruning at once take disjoint rows and never wait.
        WITH old AS (
            DELETE FROM pgcounters.drain_stats d
             WHERE (d.bucket, d.unlogged, d.pid) IN (
                   SELECT o.bucket, o.unlogged, o.pid
                     FROM pgcounters.drain_stats o
                    WHERE o.bucket > '-infinity' AND o.bucket < v_bucket - interval '1 hour'
                      FOR UPDATE SKIP LOCKED)
            RETURNING d.unlogged, d.batches, d.deltas, d.keys, d.seconds
        )
        INSERT INTO pgcounters.drain_stats AS s
               (bucket, unlogged, pid, batches, deltas, keys, seconds)
        SELECT '-infinity', o.unlogged, 0, sum(o.batches), sum(o.deltas), sum(o.keys),
               sum(o.seconds)
          FROM old o
         GROUP BY o.unlogged
        ON CONFLICT (bucket, unlogged, pid) DO UPDATE
           SET batches = s.batches + excluded.batches,
               deltas = s.deltas + excluded.deltas,
               keys = s.keys + excluded.keys,
               seconds = s.seconds + excluded.seconds;
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------
-- Draining (replaces the version-1 function; same signature and result)
-- ---------------------------------------------------------------------------

-- Column counters whose table, counter column or key column no longer exists.
CREATE FUNCTION pgcounters._broken_targets() RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}')
      FROM pgcounters.targets AS t
     WHERE t.target_table IS NOT NULL
       AND (SELECT count(*) FROM pg_catalog.pg_attribute AS a
             WHERE a.attrelid = to_regclass(format('%I.%I', t.target_schema, t.target_table))
               AND a.attname IN (t.target_column, t.target_key_column)
               AND a.attnum > 0 AND NOT a.attisdropped)
           < CASE WHEN t.target_column = t.target_key_column THEN 1 ELSE 2 END
$$;

-- Apply at most p_limit pending deltas of one queue, in the caller's
-- transaction (one batch = one transaction: the caller commits).
--
-- The claim. A DELETE ... RETURNING hands each queue row to exactly one
-- transaction: a row deleted by a concurrent transaction is skipped (Read
-- Committed) or raises a serialization failure (Repeatable Read and above,
-- which the client retries), so no claim form can apply a delta twice. The
-- form decides who waits for whom and what it costs:
--
-- * the drainer that holds this queue's advisory lock (taken with "try", so
--   nobody waits for it) takes the seeds' range, ids min(id) .. min(id) +
--   p_limit - 1, with no row locks: one index range scan, one write per row.
--   Ids of rolled-back inserts or of rows another drainer took leave holes,
--   so a batch may hold fewer than p_limit deltas while more are queued:
--   callers drain until a batch finds nothing (Counters.drain does);
-- * any other drainer at the same time claims rows with `id = ANY(ARRAY(
--   SELECT ... FOR UPDATE SKIP LOCKED))`, which skips rows others hold but
--   writes every row twice (a lock, then the delete): measured at about 0.65x
--   the speed of the first form. If it takes rows inside the first drainer's
--   range, the first drainer waits for it and then skips them; if that left
--   its whole range empty, it claims again from the new head, so an empty
--   result means an empty queue (for this drainer), never a range taken by
--   another.
--
-- TRUNCATE of a counted table (reset_target) and drop_counter take the
-- queues' advisory locks (blocking) before they delete a counter's deltas: the
-- range claim waits for rows without locking them in id order, and a delete in
-- another order would deadlock with it.
--
-- A column counter whose table or columns no longer exist is left out of the
-- claim (its deltas stay queued, a WARNING says so): it would otherwise fail
-- every batch and stop every other counter with it.
--
-- Both run through EXECUTE so the plan uses the real limit (the `id IN
-- (subquery)` form was measured to plan a full scan of a large queue), keep
-- the index on id, sum per (target, key) so ON CONFLICT never meets a row
-- twice, and upsert in (target, key) order so drainers cannot deadlock on
-- counter rows.
CREATE OR REPLACE FUNCTION pgcounters.drain_batch(
    p_limit integer DEFAULT 10000,
    p_unlogged boolean DEFAULT false,
    OUT deltas bigint,
    OUT keys bigint
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
    v_columns pgcounters.column_delta[];
    v_column_keys bigint;
    c record;
    t pgcounters.targets;
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

    v_sole := pg_try_advisory_xact_lock(hashtext('pgcounters.drain'), p_unlogged::integer);
    IF v_sole THEN
        v_claim := 'q.id BETWEEN (SELECT lo FROM head) AND (SELECT lo FROM head) + $1 - 1';
    ELSE
        v_claim := 'q.id = ANY (ARRAY(SELECT id FROM pgcounters.%1$I AS q WHERE true'
                   || v_skip || ' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))';
    END IF;

    LOOP
    EXECUTE format($q$
        WITH head AS MATERIALIZED (
            SELECT min(id) AS lo FROM pgcounters.%1$I AS q WHERE true $q$ || v_skip || $q$
        ), claimed AS (
            DELETE FROM pgcounters.%1$I AS q
             WHERE $q$ || v_claim || v_skip || $q$
            RETURNING q.target_id, q.key, q.delta
        ), summed AS (
            -- the queues' keys are text from version 7 on (text[] before): one
            -- cast per key, to the counters table's text[]
            SELECT target_id, key::text[] AS key, sum(delta) AS delta, count(*) AS n
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
               array_agg((s.target_id, s.key[1], s.delta)::pgcounters.column_delta)
                   FILTER (WHERE t.target_table IS NOT NULL AND s.delta <> 0),
               $q$ || CASE WHEN v_sole THEN '(SELECT lo FROM head)' ELSE 'NULL::bigint' END || $q$
          FROM summed s
          LEFT JOIN pgcounters.targets t ON t.id = s.target_id
    $q$, v_queue)
    INTO deltas, keys, v_columns, v_head
    USING p_limit, v_broken;
    -- a range found empty while the queue was not: another drainer held it and
    -- took it; claim again from the new head (each round sees a newer snapshot)
    EXIT WHEN deltas > 0 OR v_head IS NULL;
    END LOOP;

    IF v_columns IS NOT NULL THEN
        -- lock the parent rows first, each table's rows in one pass in key order
        -- (tables in name order): UPDATE ... FROM does not promise an order, and
        -- every drainer and recount must lock in the same one. A pass per counter
        -- would not do when two counters live in one table (a count and a sum
        -- of the same comments): the passes interleave, and deadlock.
        FOR c IN
            SELECT g.target_schema AS s, g.target_table AS r, g.target_key_column AS k,
                   g.key_types[1] AS key_type, array_agg(d.key) AS ks
              FROM unnest(v_columns) AS d
              JOIN pgcounters.targets AS g ON g.id = d.target_id
             GROUP BY 1, 2, 3, 4
             ORDER BY 1, 2, 3, 4
        LOOP
            EXECUTE format(
                'SELECT count(*) FROM (SELECT 1 FROM %I.%I AS x WHERE x.%I = ANY ($1::%s[])
                  ORDER BY x.%I FOR NO KEY UPDATE OF x) AS locked',
                c.s, c.r, c.k, c.key_type::regtype, c.k)
            INTO v_column_keys USING c.ks;
        END LOOP;
        FOR c IN
            SELECT d.target_id, array_agg(d.key) AS ks, array_agg(d.delta) AS ds
              FROM unnest(v_columns) AS d
             GROUP BY d.target_id
             ORDER BY d.target_id
        LOOP
            SELECT * INTO t FROM pgcounters.targets WHERE id = c.target_id;
            -- summed again after the cast: texts of one typed value (written by
            -- hand into the queue) must add up, UPDATE ... FROM applies one match
            EXECUTE format(
                'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + d.delta
                   FROM (SELECT u.key, sum(u.delta)::bigint AS delta
                           FROM unnest($1::%s[], $2::bigint[]) AS u(key, delta)
                          GROUP BY u.key) AS d
                  WHERE x.%I = d.key',
                t.target_schema, t.target_table, t.target_column, t.target_column,
                t.key_types[1]::regtype, t.target_key_column)
            USING c.ks, c.ds;
            GET DIAGNOSTICS v_column_keys = ROW_COUNT;
            keys := keys + v_column_keys;
        END LOOP;
    END IF;

    IF deltas > 0 THEN
        PERFORM pgcounters._record_drain(
            p_unlogged, deltas, keys,
            extract(epoch FROM clock_timestamp() - v_started)::double precision);
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------
-- Wake-ups (optional): NOTIFY the workers when deltas arrive, at most once per
-- interval, never once per delta (a NOTIFY takes a global lock at commit).
-- ---------------------------------------------------------------------------

-- The time of the last wake-up, in epoch milliseconds. A sequence because it
-- is not transactional: every transaction sees the latest value whatever its
-- snapshot or isolation level, and setting it takes no lock held to commit.
CREATE SEQUENCE pgcounters.wakeup_clock AS bigint MINVALUE 0 START 0;

-- Statement-level trigger on the queues; TG_ARGV[0] is the interval in ms.
-- A statement within the interval of the last wake-up reads one sequence and
-- returns. Two transactions at the same instant may both notify; the rate
-- stays bounded by the interval. A wake-up sent by a transaction that rolls
-- back is lost: the workers' polling covers it.
CREATE FUNCTION pgcounters._wake_drainers() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
    IF v_now - (SELECT last_value FROM pgcounters.wakeup_clock) < TG_ARGV[0]::bigint THEN
        RETURN NULL;
    END IF;
    PERFORM setval('pgcounters.wakeup_clock', v_now),
            pg_notify('pgcounters_queue', TG_TABLE_NAME);
    RETURN NULL;
END;
$$;

-- Install (or re-time) the wake-up triggers on both queues.
CREATE FUNCTION pgcounters.enable_wakeups(p_every interval DEFAULT interval '100 milliseconds')
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ms bigint := ceil(extract(epoch FROM p_every) * 1000)::bigint;
    v_queue text;
BEGIN
    IF v_ms IS NULL OR v_ms < 1 OR v_ms > 3600000 THEN
        RAISE EXCEPTION 'the wake-up interval must be between 1 ms and 1 hour, got %', p_every
            USING ERRCODE = 'PC006';
    END IF;
    FOREACH v_queue IN ARRAY ARRAY['queue', 'queue_unlogged'] LOOP
        EXECUTE format(
            'CREATE OR REPLACE TRIGGER pgcounters_wakeup AFTER INSERT ON pgcounters.%I
               FOR EACH STATEMENT EXECUTE FUNCTION pgcounters._wake_drainers(%L)',
            v_queue, v_ms);
    END LOOP;
END;
$$;

-- Remove the wake-up triggers. True if they were installed.
CREATE FUNCTION pgcounters.disable_wakeups() RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_found boolean;
BEGIN
    SELECT count(*) > 0 INTO v_found
      FROM pg_trigger
     WHERE tgname = 'pgcounters_wakeup'
       AND tgrelid IN ('pgcounters.queue'::regclass, 'pgcounters.queue_unlogged'::regclass);
    DROP TRIGGER IF EXISTS pgcounters_wakeup ON pgcounters.queue;
    DROP TRIGGER IF EXISTS pgcounters_wakeup ON pgcounters.queue_unlogged;
    RETURN v_found;
END;
$$;

-- The wake-up interval in milliseconds, NULL when wake-ups are off.
CREATE FUNCTION pgcounters.wakeup_interval_ms() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT min(convert_from(substring(t.tgargs FROM 1 FOR position('\x00'::bytea IN t.tgargs) - 1),
                            'UTF8')::bigint)
      FROM pg_trigger t
     WHERE t.tgname = 'pgcounters_wakeup'
       AND t.tgrelid IN ('pgcounters.queue'::regclass, 'pgcounters.queue_unlogged'::regclass);
$$;
