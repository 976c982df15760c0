-- pgcounters schema, version 9: counter columns belong to pgcounters, and
-- counters are backfilled online.
--
-- A counter column of a user table is guarded by two row triggers compiled
-- with its spec (compiler.compile_guard): an UPDATE that changes the column
-- is refused unless the transaction-local setting pgcounters.applying is 'on',
-- and a new row starts at 0. Every pgcounters writer of a counter column (the
-- drain, reset_target, incr of a direct column counter, recount, the backfill,
-- the triggers of direct column counters) turns the setting on just before its
-- UPDATE and back off ('') right after. The setting is a guard against
-- ordinary writes (an ORM saving a stale object, an UPDATE typed in psql),
-- not a security boundary: any role may set it.

-- ---------------------------------------------------------------------------
-- Redefinition of pgcounters.drain_batch (version 5's body): the only change
-- is the two set_config calls around the UPDATE of each column target
-- (marked "guarded column write").
-- ---------------------------------------------------------------------------
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
            PERFORM set_config('pgcounters.applying', 'on', true);  -- guarded column write
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
            PERFORM set_config('pgcounters.applying', '', true);  -- guarded column write
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

-- ---------------------------------------------------------------------------
-- Redefinition of pgcounters.reset_target (version 2's body): set_config
-- around the UPDATE of a column target (marked "guarded column write").
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgcounters.reset_target(p_target_id integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t pgcounters.targets;
BEGIN
    SELECT * INTO t FROM pgcounters.targets WHERE id = p_target_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- as drop_counter: wait for the range drainers first (no deadlock with them)
    PERFORM pg_advisory_xact_lock(hashtext('pgcounters.drain'), 0),
            pg_advisory_xact_lock(hashtext('pgcounters.drain'), 1);
    DELETE FROM pgcounters.queue WHERE target_id = t.id;
    DELETE FROM pgcounters.queue_unlogged WHERE target_id = t.id;
    IF t.target_table IS NULL THEN
        DELETE FROM pgcounters.counters WHERE target_id = t.id;
    ELSE
        PERFORM set_config('pgcounters.applying', 'on', true);  -- guarded column write
        EXECUTE format('UPDATE %I.%I SET %I = 0 WHERE %I IS DISTINCT FROM 0',
            t.target_schema, t.target_table, t.target_column, t.target_column);
        PERFORM set_config('pgcounters.applying', '', true);  -- guarded column write
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------
-- Redefinition of pgcounters.incr (version 6's body): set_config around the
-- UPDATE of a direct column counter (marked "guarded column write").
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgcounters.incr(
    p_name text, p_key text[] DEFAULT '{}', p_delta bigint DEFAULT 1
)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_value bigint;
BEGIN
    PERFORM pgcounters._check_key(t, p_key);
    IF t.mode = 'queued' THEN
        INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (t.id, p_key, p_delta);
        RETURN NULL;
    ELSIF t.mode = 'unlogged' THEN
        INSERT INTO pgcounters.queue_unlogged (target_id, key, delta) VALUES (t.id, p_key, p_delta);
        RETURN NULL;
    ELSIF t.target_table IS NULL THEN
        RETURN pgcounters.add_direct(ARRAY[t.id], ARRAY[p_key::text], ARRAY[p_delta]);
    END IF;
    PERFORM set_config('pgcounters.applying', 'on', true);  -- guarded column write
    EXECUTE format(
        'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + $1 WHERE x.%I = $2::%s RETURNING x.%I',
        t.target_schema, t.target_table, t.target_column, t.target_column,
        t.target_key_column, t.key_types[1]::regtype, t.target_column)
    INTO v_value USING p_delta, p_key[1];
    PERFORM set_config('pgcounters.applying', '', true);  -- guarded column write
    RETURN v_value;
END;
$$;

-- ---------------------------------------------------------------------------
-- Online backfills (backfill.py): a counter added or changed over a table that
-- already has rows is recounted in batches of keys, one transaction each,
-- while the application writes. A row here means "stored values are not all
-- recomputed yet": keys up to cursor_key are (the batch that moved the cursor
-- committed them together), the others are read from the truth by exact
-- reads, or refused. The row is deleted by the batch that finds no key left.
-- ---------------------------------------------------------------------------
CREATE TABLE pgcounters.backfills (
    name text PRIMARY KEY,
    fingerprint text NOT NULL,
    cursor_key text[],
    keys_done bigint NOT NULL DEFAULT 0,
    requested_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- exact reads of an application role consult it
GRANT SELECT ON pgcounters.backfills TO PUBLIC;

-- Exact reads through the client (get, get_many) of a counter being backfilled:
-- called only when a backfill row exists, it refuses with its progress rather
-- than return a value that misses the rows written before the counter existed.
CREATE FUNCTION pgcounters._backfilling(p_target integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    b pgcounters.backfills;
BEGIN
    SELECT f.* INTO b FROM pgcounters.backfills AS f
      JOIN pgcounters.targets AS t ON t.name = f.name
     WHERE t.id = p_target;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'PCB01',
        MESSAGE = format('counter %s is being backfilled (%s keys done): its exact values '
                         'are ready when the backfill ends', b.name, b.keys_done),
        HINT = 'the worker, `pgcounters backfill` or `manage.py migrate` finishes it';
END;
$$;
-- every role that may read a counter runs it in its read (the permission is
-- checked when the statement starts, whichever branch runs): it only tells
-- what pgcounters.backfills, readable by all, already says
GRANT EXECUTE ON FUNCTION pgcounters._backfilling(integer) TO PUBLIC;

-- ---------------------------------------------------------------------------
-- Redefinition of pgcounters.get (version 7's body): refused while the
-- counter is backfilled (the line marked "backfill").
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgcounters.get(p_name text, p_key text[] DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_key text := p_key::text;
    v_stored bigint;
BEGIN
    PERFORM pgcounters._check_key(t, p_key);
    PERFORM pgcounters._backfilling(t.id);  -- backfill
    IF t.target_table IS NULL THEN
        SELECT value INTO v_stored FROM pgcounters.counters WHERE target_id = t.id AND key = p_key;
    ELSE
        EXECUTE format('SELECT x.%I FROM %I.%I AS x WHERE x.%I = $1::%s',
            t.target_column, t.target_schema, t.target_table,
            t.target_key_column, t.key_types[1]::regtype)
        INTO v_stored USING p_key[1];
    END IF;
    RETURN coalesce(v_stored, 0)
         + coalesce((SELECT sum(delta) FROM pgcounters.queue
                      WHERE target_id = t.id AND key = v_key), 0)
         + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                      WHERE target_id = t.id AND key = v_key), 0);
END;
$$;
