-- pgcounters schema, version 1.
--
-- Everything lives in the "pgcounters" schema. The runner (pgcounters/schema.py)
-- applies this file inside one transaction holding an advisory lock and records
-- the version in pgcounters.migrations.

CREATE SCHEMA IF NOT EXISTS pgcounters;

CREATE TABLE pgcounters.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- One row per declared counter ("target"). A target is either a named counter
-- whose values live in pgcounters.counters (target_table IS NULL), or a counter
-- column on a row of a user table, keyed by one column of that table.
CREATE TABLE pgcounters.targets (
    id                integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name              text NOT NULL UNIQUE
                      CONSTRAINT targets_name_format
                      CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_.:/-]{0,199}$'),
    key_types         text[] NOT NULL DEFAULT '{}'
                      CONSTRAINT targets_key_types_known
                      CHECK (key_types <@ ARRAY['bigint', 'uuid', 'text', 'date']
                             AND array_position(key_types, NULL) IS NULL
                             AND coalesce(array_length(key_types, 1), 0) <= 8),
    mode              text NOT NULL DEFAULT 'queued'
                      CONSTRAINT targets_mode_known
                      CHECK (mode IN ('queued', 'unlogged', 'direct')),
    target_schema     text,
    target_table      text,
    target_column     text,
    target_key_column text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT targets_column_target_complete CHECK (
        (target_table IS NULL AND target_schema IS NULL
         AND target_column IS NULL AND target_key_column IS NULL)
        OR (target_table IS NOT NULL AND target_schema IS NOT NULL
            AND target_column IS NOT NULL AND target_key_column IS NOT NULL
            AND array_length(key_types, 1) = 1))
);

-- Stored values of named counters. Keys are text arrays in a canonical form
-- (see pgcounters/keys.py): '{}' for a global counter, '{42}' for a row id,
-- '{42,2026-11-21}' for a composite key. No foreign key to targets: an FK check
-- would take a KEY SHARE lock on the target row for every new counter row.
CREATE TABLE pgcounters.counters (
    target_id integer NOT NULL,
    key       text[] NOT NULL,
    value     bigint NOT NULL,
    PRIMARY KEY (target_id, key)
) WITH (fillfactor = 70);

-- top-N by value for one counter
CREATE INDEX counters_top ON pgcounters.counters (target_id, value DESC);

-- The insert-only queue of deltas. User transactions only INSERT here:
-- they never lock a shared counter row.
CREATE TABLE pgcounters.queue (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    target_id  integer NOT NULL,
    key        text[] NOT NULL,
    delta      bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- exact reads sum the pending deltas of one key from this index
CREATE INDEX queue_target_key ON pgcounters.queue (target_id, key) INCLUDE (delta);

-- The opt-in UNLOGGED queue: several times faster to write, emptied by a
-- crash of PostgreSQL. Same shape as the logged queue.
CREATE UNLOGGED TABLE pgcounters.queue_unlogged (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    target_id  integer NOT NULL,
    key        text[] NOT NULL,
    delta      bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

CREATE INDEX queue_unlogged_target_key
    ON pgcounters.queue_unlogged (target_id, key) INCLUDE (delta);

-- What a drain batch carries over to column targets.
CREATE TYPE pgcounters.column_delta AS (target_id integer, key text, delta bigint);

-- ---------------------------------------------------------------------------
-- Declaring counters
-- ---------------------------------------------------------------------------

-- Declare a named counter. Idempotent for an identical declaration; a different
-- declaration under an existing name is an error (SQLSTATE PC001).
CREATE FUNCTION pgcounters.create_counter(
    p_name text,
    p_key_types text[] DEFAULT '{}',
    p_mode text DEFAULT 'queued'
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_existing pgcounters.targets;
    v_id integer;
BEGIN
    SELECT * INTO v_existing FROM pgcounters.targets WHERE name = p_name;
    IF FOUND THEN
        IF v_existing.key_types IS DISTINCT FROM p_key_types
           OR v_existing.mode IS DISTINCT FROM p_mode
           OR v_existing.target_table IS NOT NULL THEN
            RAISE EXCEPTION 'counter % already exists with another definition', p_name
                USING ERRCODE = 'PC001';
        END IF;
        RETURN v_existing.id;
    END IF;
    INSERT INTO pgcounters.targets (name, key_types, mode)
    VALUES (p_name, p_key_types, p_mode)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        -- a concurrent declaration won the race: compare with it
        RETURN pgcounters.create_counter(p_name, p_key_types, p_mode);
    END IF;
    RETURN v_id;
END;
$$;

-- Declare a counter kept in a column of a user table, keyed by one column
-- of that table (normally its primary key). The key type is read from the
-- catalog. Deltas for rows that no longer exist are discarded by the drain.
CREATE FUNCTION pgcounters.create_column_counter(
    p_name text,
    p_table regclass,
    p_column text,
    p_key_column text DEFAULT 'id',
    p_mode text DEFAULT 'queued'
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_schema text;
    v_table text;
    v_key_type text;
    v_col_type text;
    v_existing pgcounters.targets;
    v_id integer;
BEGIN
    SELECT n.nspname, c.relname INTO v_schema, v_table
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_table;

    SELECT format_type(a.atttypid, NULL) INTO v_col_type
      FROM pg_attribute a
     WHERE a.attrelid = p_table AND a.attname = p_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF v_col_type IS NULL THEN
        RAISE EXCEPTION 'column % does not exist in table %', p_column, p_table
            USING ERRCODE = 'PC002';
    END IF;
    IF v_col_type NOT IN ('bigint', 'integer', 'smallint') THEN
        RAISE EXCEPTION 'counter column %.% has type %; an integer type is required',
            p_table, p_column, v_col_type USING ERRCODE = 'PC002';
    END IF;

    SELECT CASE format_type(a.atttypid, NULL)
               WHEN 'bigint' THEN 'bigint' WHEN 'integer' THEN 'bigint'
               WHEN 'smallint' THEN 'bigint' WHEN 'uuid' THEN 'uuid'
               WHEN 'text' THEN 'text' WHEN 'character varying' THEN 'text'
               WHEN 'date' THEN 'date'
           END
      INTO v_key_type
      FROM pg_attribute a
     WHERE a.attrelid = p_table AND a.attname = p_key_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'key column % does not exist in table %', p_key_column, p_table
            USING ERRCODE = 'PC002';
    END IF;
    IF v_key_type IS NULL THEN
        RAISE EXCEPTION 'key column %.% has a type pgcounters cannot key on', p_table, p_key_column
            USING ERRCODE = 'PC002';
    END IF;

    SELECT * INTO v_existing FROM pgcounters.targets WHERE name = p_name;
    IF FOUND THEN
        IF v_existing.target_schema IS DISTINCT FROM v_schema
           OR v_existing.target_table IS DISTINCT FROM v_table
           OR v_existing.target_column IS DISTINCT FROM p_column
           OR v_existing.target_key_column IS DISTINCT FROM p_key_column
           OR v_existing.mode IS DISTINCT FROM p_mode THEN
            RAISE EXCEPTION 'counter % already exists with another definition', p_name
                USING ERRCODE = 'PC001';
        END IF;
        RETURN v_existing.id;
    END IF;

    INSERT INTO pgcounters.targets
        (name, key_types, mode, target_schema, target_table, target_column, target_key_column)
    VALUES (p_name, ARRAY[v_key_type], p_mode, v_schema, v_table, p_column, p_key_column)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RETURN pgcounters.create_column_counter(p_name, p_table, p_column, p_key_column, p_mode);
    END IF;
    RETURN v_id;
END;
$$;

-- Forget a counter: its declaration, stored values and pending deltas.
CREATE FUNCTION pgcounters.drop_counter(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    DELETE FROM pgcounters.targets WHERE name = p_name RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    -- wait for a drainer of each queue that claims by id range (schema version
    -- 5): it waits for rows without locking them first, a delete in another
    -- order than its own would deadlock with it
    PERFORM pg_advisory_xact_lock(hashtext('pgcounters.drain'), 0),
            pg_advisory_xact_lock(hashtext('pgcounters.drain'), 1);
    DELETE FROM pgcounters.counters WHERE target_id = v_id;
    DELETE FROM pgcounters.queue WHERE target_id = v_id;
    DELETE FROM pgcounters.queue_unlogged WHERE target_id = v_id;
    RETURN true;
END;
$$;

-- ---------------------------------------------------------------------------
-- Incrementing and reading from SQL (the Python client issues the equivalent
-- statements directly, with the target id cached, to save the lookup)
-- ---------------------------------------------------------------------------

CREATE FUNCTION pgcounters._target(p_name text) RETURNS pgcounters.targets
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v pgcounters.targets;
BEGIN
    SELECT * INTO v FROM pgcounters.targets WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown counter %', p_name USING ERRCODE = 'PC003';
    END IF;
    RETURN v;
END;
$$;

CREATE FUNCTION pgcounters._check_key(p_target pgcounters.targets, p_key text[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF coalesce(array_length(p_key, 1), 0) <> coalesce(array_length(p_target.key_types, 1), 0)
       OR array_position(p_key, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'counter % takes a key of (%), got %',
            p_target.name, array_to_string(p_target.key_types, ', '), p_key
            USING ERRCODE = 'PC004';
    END IF;
END;
$$;

-- Add p_delta to a counter. Queued and unlogged counters get a row in their
-- queue and return NULL; direct counters are updated in place and return the
-- new stored value.
CREATE FUNCTION pgcounters.incr(p_name text, p_key text[] DEFAULT '{}', p_delta bigint DEFAULT 1)
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
        INSERT INTO pgcounters.counters AS c (target_id, key, value)
        VALUES (t.id, p_key, p_delta)
        ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
        RETURNING c.value INTO v_value;
        RETURN v_value;
    ELSE
        EXECUTE format(
            'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + $1 WHERE x.%I = $2::%s RETURNING x.%I',
            t.target_schema, t.target_table, t.target_column, t.target_column,
            t.target_key_column, t.key_types[1]::regtype, t.target_column)
        INTO v_value USING p_delta, p_key[1];
        RETURN v_value;
    END IF;
END;
$$;

-- Exact value of one named counter: stored + pending, from one snapshot
--. Column targets are read by the Python client, which knows
-- the table; this function reads them too, with dynamic SQL.
CREATE FUNCTION pgcounters.get(p_name text, p_key text[] DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_stored bigint;
BEGIN
    PERFORM pgcounters._check_key(t, p_key);
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
                      WHERE target_id = t.id AND key = p_key), 0)
         + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                      WHERE target_id = t.id AND key = p_key), 0);
END;
$$;

-- ---------------------------------------------------------------------------
-- Draining
-- ---------------------------------------------------------------------------

-- Apply at most p_limit pending deltas of one queue, in the caller's
-- transaction (one batch = one transaction: the caller commits).
--
-- * The claim is `id = ANY(ARRAY(SELECT ... FOR UPDATE SKIP LOCKED))`, run
--   through EXECUTE so it is planned with the real limit each time: the
--   `id IN (subquery)` form was measured to plan a full scan of a large queue.
-- * Several drainers at once take disjoint rows (SKIP LOCKED).
-- * Deltas are summed per (target, key) before the upsert, so ON CONFLICT never
--   meets the same row twice, and applied in (target, key) order, so two
--   drainers lock counter rows in the same order and cannot deadlock.
-- * Named counters are upserted (a first delta creates the row); column targets
--   are updated in key order after their rows are locked in key order; deltas
--   for rows that no longer exist, or for dropped counters, are discarded.
CREATE FUNCTION pgcounters.drain_batch(
    p_limit integer DEFAULT 10000,
    p_unlogged boolean DEFAULT false,
    OUT deltas bigint,
    OUT keys bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text := CASE WHEN p_unlogged THEN 'queue_unlogged' ELSE 'queue' END;
    v_columns pgcounters.column_delta[];
    v_column_keys bigint;
    c record;
    t pgcounters.targets;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'batch size must be a positive integer, got %', p_limit
            USING ERRCODE = 'PC005';
    END IF;

    EXECUTE format($q$
        WITH claimed AS (
            DELETE FROM pgcounters.%1$I AS q
             WHERE q.id = ANY (ARRAY(
                   SELECT id FROM pgcounters.%1$I ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))
            RETURNING q.target_id, q.key, q.delta
        ), summed AS (
            SELECT target_id, key, sum(delta) AS delta, count(*) AS n
              FROM claimed
             GROUP BY target_id, key
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
                   FILTER (WHERE t.target_table IS NOT NULL AND s.delta <> 0)
          FROM summed s
          LEFT JOIN pgcounters.targets t ON t.id = s.target_id
    $q$, v_queue)
    INTO deltas, keys, v_columns
    USING p_limit;

    IF v_columns IS NULL THEN
        RETURN;
    END IF;

    FOR c IN
        SELECT d.target_id, array_agg(d.key) AS ks, array_agg(d.delta) AS ds
          FROM unnest(v_columns) AS d
         GROUP BY d.target_id
         ORDER BY d.target_id
    LOOP
        SELECT * INTO t FROM pgcounters.targets WHERE id = c.target_id;
        -- lock the parent rows in key order first: UPDATE ... FROM does not
        -- promise an order, and two drainers must lock in the same one
        EXECUTE format(
            'SELECT count(*) FROM (SELECT 1 FROM %I.%I AS x WHERE x.%I = ANY ($1::%s[])
              ORDER BY x.%I FOR NO KEY UPDATE OF x) AS locked',
            t.target_schema, t.target_table, t.target_key_column,
            t.key_types[1]::regtype, t.target_key_column)
        INTO v_column_keys USING c.ks;
        EXECUTE format(
            'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + d.delta
               FROM unnest($1::%s[], $2::bigint[]) AS d(key, delta)
              WHERE x.%I = d.key',
            t.target_schema, t.target_table, t.target_column, t.target_column,
            t.key_types[1]::regtype, t.target_key_column)
        USING c.ks, c.ds;
        GET DIAGNOSTICS v_column_keys = ROW_COUNT;
        keys := keys + v_column_keys;
    END LOOP;
END;
$$;
