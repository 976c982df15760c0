-- The pgcounters schema: every table, index, type, function, trigger, grant and
-- seeded row as the migrations in sql/migrations leave it, by topic.
-- version: 32
--
-- A fresh install runs this file in one transaction under an advisory lock
-- (pgcounters/schema.py) and records every migration up to the version above
-- as applied; a database with an older schema is upgraded by the migrations
-- themselves. tests/test_schema_sql.py builds the schema both ways and
-- compares the catalogs object by object: a change of the schema is a new
-- migration AND the same change here, and that test names what differs.
--
-- Function bodies are checked when they run, not when they are created (for this
-- transaction), so objects appear in topic order: a function may name one defined below.
SET LOCAL check_function_bodies = off;

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


-- =============================================================================
-- Versions
-- =============================================================================

-- Everything lives in the schema pgcounters.
CREATE SCHEMA IF NOT EXISTS pgcounters;

-- The migrations recorded as applied: the installed version is max(version).
CREATE TABLE pgcounters.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);


-- =============================================================================
-- Counters, their values and their queues
-- =============================================================================
-- A delta is (target, key, delta). A target is a named counter, whose values live
-- in pgcounters.counters, or a counter column on a row of a user table. Keys are
-- text arrays in a canonical form ('{}', '{42}', '{42,2026-11-21}', see
-- pgcounters/keys.py). No foreign key points at targets: an FK check would take a
-- KEY SHARE lock on the target row for every write.

-- One row per declared counter ("target"): a named counter (target_table IS
-- NULL), or a counter column of a user table keyed by one column of that table.
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
            AND array_length(key_types, 1) = 1)),
    -- a sum of decimals: its values are kept in units of 10^-scale (NULL: integers)
    scale             integer CHECK (scale BETWEEN 0 AND 18)
);

-- Stored values of named counters, one row per (counter, key).
CREATE TABLE pgcounters.counters (
    target_id integer NOT NULL,
    key       text[] NOT NULL,
    value     bigint NOT NULL,
    PRIMARY KEY (target_id, key),
    -- The rank band of the value: 0 for -16 .. 15, then one band per power of two,
    -- mirrored below zero; monotonic in the value, so the N greatest values are among
    -- the rows of the N first rows' bands. An update that keeps a value in its band
    -- (most of them) is heap-only and touches no index.
    band      smallint GENERATED ALWAYS AS ((
        CASE WHEN value >= 0 THEN 1 ELSE -1 END
        * width_bucket(CASE WHEN value >= 0 THEN value ELSE -(value + 1) END, '{
            16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072,
            262144, 524288, 1048576, 2097152, 4194304, 8388608, 16777216, 33554432, 67108864,
            134217728, 268435456, 536870912, 1073741824, 2147483648, 4294967296, 8589934592,
            17179869184, 34359738368, 68719476736, 137438953472, 274877906944, 549755813888,
            1099511627776, 2199023255552, 4398046511104, 8796093022208, 17592186044416,
            35184372088832, 70368744177664, 140737488355328, 281474976710656, 562949953421312,
            1125899906842624, 2251799813685248, 4503599627370496, 9007199254740992,
            18014398509481984, 36028797018963968, 72057594037927936, 144115188075855872,
            288230376151711744, 576460752303423488, 1152921504606846976, 2305843009213693952,
            4611686018427387904
        }'::bigint[])
    )::smallint) STORED
) WITH (fillfactor = 70, parallel_workers = 0);
-- (no parallel plans: the planner would start workers for a large counter's top-N
-- scan, about 13 ms of start-up against 0.13 ms for the plain index scan)

-- Top-N of one counter: ORDER BY band DESC, value DESC, key is the order by value;
-- this index gives the bands from the top, an incremental sort orders each band.
CREATE INDEX counters_rank ON pgcounters.counters (target_id, band DESC);

-- The insert-only queue of deltas: user transactions only INSERT here, they
-- never lock a shared counter row. The key is the text of its array ('{42}').
CREATE TABLE pgcounters.queue (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    target_id  integer NOT NULL,
    key        text NOT NULL,
    delta      bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
        vacuum_truncate = false);
-- (VACUUM leaves the file's size as it is: truncating a drained queue to no pages took a
-- lock that made writers wait, and left the planner a queue of no pages, whose reads a
-- sequential scan plan then served while the queue grew again)

-- Exact reads sum the pending deltas of one key from this index.
CREATE INDEX queue_target_key ON pgcounters.queue (target_id, key) INCLUDE (delta);

-- The opt-in UNLOGGED queue: several times faster to write, emptied by a crash
-- of PostgreSQL. Same shape as the logged queue.
CREATE UNLOGGED TABLE pgcounters.queue_unlogged (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    target_id  integer NOT NULL,
    key        text NOT NULL,
    delta      bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
        vacuum_truncate = false);
-- (VACUUM leaves the file's size as it is: truncating a drained queue to no pages took a
-- lock that made writers wait, and left the planner a queue of no pages, whose reads a
-- sequential scan plan then served while the queue grew again)

-- Exact reads sum the pending deltas of one key from this index.
CREATE INDEX queue_unlogged_target_key
    ON pgcounters.queue_unlogged (target_id, key) INCLUDE (delta);

-- The names of dropped counters, so that a delta written for a dropped id (by
-- a long-lived client that cached it, or a transaction that committed after
-- the drop) is set aside under its counter's name, and a replay by name can
-- send it to a counter re-created under that name.
CREATE TABLE pgcounters.dropped_targets (
    id         integer PRIMARY KEY,
    name       text NOT NULL,
    dropped_at timestamptz NOT NULL DEFAULT now()
);

-- Trigger function: remember the name of a dropped counter.
CREATE FUNCTION pgcounters._remember_dropped() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
BEGIN
    INSERT INTO pgcounters.dropped_targets (id, name) VALUES (OLD.id, OLD.name)
    ON CONFLICT (id) DO UPDATE SET name = excluded.name, dropped_at = excluded.dropped_at;
    RETURN NULL;
END;
$$;

-- Every deleted target is remembered in dropped_targets.
CREATE TRIGGER targets_remember_dropped AFTER DELETE ON pgcounters.targets
    FOR EACH ROW EXECUTE FUNCTION pgcounters._remember_dropped();


-- =============================================================================
-- Declaring counters
-- =============================================================================

-- Refuse a counter's definition before it is written: a name that is not one (PC007), key
-- types or a mode pgcounters does not know (PC002). The checks of pgcounters.targets,
-- with pgcounters' own errors.
CREATE FUNCTION pgcounters._check_definition(p_name text, p_key_types text[], p_mode text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z_][A-Za-z0-9_.:/-]{0,199}$' THEN
        RAISE EXCEPTION 'invalid counter name %: a letter or _ first, then letters, digits '
                        'and _ . : / -, at most 200 characters',
            coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'PC007';
    END IF;
    IF p_key_types IS NULL OR array_ndims(p_key_types) > 1
       OR NOT p_key_types <@ ARRAY['bigint', 'uuid', 'text', 'date']
       OR array_position(p_key_types, NULL) IS NOT NULL OR cardinality(p_key_types) > 8 THEN
        RAISE EXCEPTION 'counter %: key types are at most 8 of bigint, uuid, text and date, got %',
            p_name, coalesce(p_key_types::text, 'NULL')
            USING ERRCODE = 'PC002';
    END IF;
    IF p_mode IS NULL OR p_mode NOT IN ('queued', 'unlogged', 'direct') THEN
        RAISE EXCEPTION 'counter %: the mode is queued, unlogged or direct, got %',
            p_name, coalesce(quote_literal(p_mode), 'NULL')
            USING ERRCODE = 'PC002';
    END IF;
END;
$$;

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
    PERFORM pgcounters._check_definition(p_name, p_key_types, p_mode);
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
    PERFORM pgcounters._check_definition(p_name, '{}', p_mode);
    IF p_table IS NULL THEN
        RAISE EXCEPTION 'counter %: a counter column needs its table, got NULL', p_name
            USING ERRCODE = 'PC002';
    END IF;
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
    -- the triggers that named its id stop doing so when this commits (version 29); the
    -- list's lock is taken last, after the drainers' locks
    PERFORM pgcounters.refresh_target_ids();
    RETURN true;
END;
$$;

-- The target id of a declared counter, declaring it on first use. Triggers call
-- this once per statement, so a trigger works as soon as it is installed,
-- whatever delivered it (pgcounters.triggers or a Django migration). A changed
-- mode is taken over (the queue drains into the same place); any other
-- difference is an error (PC001).
CREATE FUNCTION pgcounters.ensure_target(
    p_name text,
    p_key_types text[],
    p_mode text,
    p_schema text DEFAULT NULL,
    p_table text DEFAULT NULL,
    p_column text DEFAULT NULL,
    p_key_column text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    t pgcounters.targets;
BEGIN
    SELECT * INTO t FROM pgcounters.targets WHERE name = p_name;
    IF FOUND
       AND t.target_schema IS NOT DISTINCT FROM p_schema
       AND t.target_table IS NOT DISTINCT FROM p_table
       AND t.target_column IS NOT DISTINCT FROM p_column
       AND t.target_key_column IS NOT DISTINCT FROM p_key_column
       AND t.key_types = p_key_types THEN
        IF t.mode <> p_mode THEN
            UPDATE pgcounters.targets SET mode = p_mode WHERE id = t.id;
        END IF;
        RETURN t.id;
    END IF;
    IF p_table IS NULL THEN
        RETURN pgcounters.create_counter(p_name, p_key_types, p_mode);
    END IF;
    RETURN pgcounters.create_column_counter(
        p_name, format('%I.%I', p_schema, p_table)::regclass, p_column, p_key_column, p_mode);
END;
$$;


-- =============================================================================
-- Keys
-- =============================================================================
-- Every SQL entry point that takes a key (incr, get, add_direct) casts each part
-- to the counter's key type and keeps its canonical text ('+7' and '007' are 7,
-- an upper-case UUID is the lower-case one, '2026-1-5' is 2026-01-05), or
-- refuses the key (PC004). A key's text must not depend on a session setting:
-- dates are keyed and written through date_key and date_text.

-- The target of a counter name, or PC003.
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

-- Refuse (PC004) a key whose number of parts is not the counter's.
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


-- The canonical text[] of p_key for a counter, or PC004. The text of each part
-- is what the Python client writes: a bigint in decimal, a lower-case
-- hyphenated UUID, an ISO date (YYYY-MM-DD, whatever DateStyle says), text as
-- given. Only ISO dates are read (year-month-day): other date spellings depend
-- on DateStyle. No exception block: validity is checked before each cast, so
-- a call costs no subtransaction.
CREATE FUNCTION pgcounters._canonical_key(p_target pgcounters.targets, p_key text[])
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_out text[] := '{}';
    v_part text;
    v_type text;
    v_num numeric;
    v_ymd text[];
    v_date date;
    i integer;
BEGIN
    -- several dimensions first: array_position below fails on them
    IF p_key IS NULL OR array_ndims(p_key) > 1
       OR coalesce(array_length(p_key, 1), 0) <> coalesce(array_length(p_target.key_types, 1), 0)
    THEN
        RAISE EXCEPTION 'counter % takes a key of (%), got %',
            p_target.name, array_to_string(p_target.key_types, ', '), coalesce(p_key::text, 'NULL')
            USING ERRCODE = 'PC004';
    END IF;
    IF array_position(p_key, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'counter % takes a key of (%), got %',
            p_target.name, array_to_string(p_target.key_types, ', '), coalesce(p_key::text, 'NULL')
            USING ERRCODE = 'PC004';
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_key, 1), 0) LOOP
        v_part := p_key[i];
        v_type := p_target.key_types[i];
        IF v_type = 'bigint' THEN
            IF v_part !~ '^\s*[+-]?[0-9]{1,30}\s*$' THEN
                RAISE EXCEPTION 'counter %: key part % is not a valid bigint',
                    p_target.name, quote_literal(v_part) USING ERRCODE = 'PC004';
            END IF;
            v_num := btrim(v_part)::numeric;
            IF v_num < -9223372036854775808 OR v_num > 9223372036854775807 THEN
                RAISE EXCEPTION 'counter %: key part % is out of the bigint range',
                    p_target.name, v_part USING ERRCODE = 'PC004';
            END IF;
            v_out := v_out || v_num::bigint::text;
        ELSIF v_type = 'uuid' THEN
            IF v_part !~* '^\s*\{?[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}\}?\s*$'
            THEN
                RAISE EXCEPTION 'counter %: key part % is not a valid uuid',
                    p_target.name, quote_literal(v_part) USING ERRCODE = 'PC004';
            END IF;
            v_out := v_out || btrim(v_part)::uuid::text;
        ELSIF v_type = 'date' THEN
            v_ymd := regexp_match(v_part, '^\s*([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})\s*$');
            IF v_ymd IS NULL OR v_ymd[2]::integer NOT BETWEEN 1 AND 12
               OR v_ymd[3]::integer < 1 OR v_ymd[1]::integer < 1 THEN
                RAISE EXCEPTION 'counter %: key part % is not a valid date (YYYY-MM-DD)',
                    p_target.name, quote_literal(v_part) USING ERRCODE = 'PC004';
            END IF;
            v_date := make_date(v_ymd[1]::integer, v_ymd[2]::integer, 1) + (v_ymd[3]::integer - 1);
            IF extract(month FROM v_date) <> v_ymd[2]::integer THEN
                RAISE EXCEPTION 'counter %: key part % is not a valid date (YYYY-MM-DD)',
                    p_target.name, quote_literal(v_part) USING ERRCODE = 'PC004';
            END IF;
            v_out := v_out || to_char(v_date, 'YYYY-MM-DD');
        ELSE
            IF length(v_part) > 1000 THEN
                RAISE EXCEPTION 'counter %: a text key part has at most 1000 characters',
                    p_target.name USING ERRCODE = 'PC004';
            END IF;
            v_out := v_out || v_part;
        END IF;
    END LOOP;
    RETURN v_out;
END;
$$;

-- Whether a key is already in its canonical form for the given key types.
CREATE FUNCTION pgcounters._is_canonical(p_types text[], p_key text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(bool_and(CASE t.kind
               WHEN 'bigint' THEN k.part ~ '^-?(0|[1-9][0-9]*)$'
               WHEN 'uuid' THEN k.part ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
               WHEN 'date' THEN k.part ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$'
               ELSE true END), true)
      FROM unnest(p_types) WITH ORDINALITY AS t(kind, i)
      JOIN unnest(p_key) WITH ORDINALITY AS k(part, i) USING (i)
$$;

-- The date that keys a value: a date as it is, a timestamp's date, the date of
-- a timestamptz in UTC (whatever the session's TimeZone). The first three are
-- plain SQL expressions that the planner inlines: no function call per row.
CREATE FUNCTION pgcounters.date_key(p_value date) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT p_value $$;

-- The date key of a timestamp: its date.
CREATE FUNCTION pgcounters.date_key(p_value timestamp) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT p_value::date $$;

-- The date key of a timestamptz: its date in UTC.
CREATE FUNCTION pgcounters.date_key(p_value timestamptz) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT (p_value AT TIME ZONE 'UTC')::date $$;

-- Text parsed as a date the same way in every session: ISO input ('2026-11-21')
-- always parses alike; for other forms the field order is fixed to
-- year-month-day, not the session's DateStyle.
CREATE FUNCTION pgcounters.date_key(p_value text) RETURNS date
LANGUAGE sql STABLE PARALLEL SAFE SET datestyle TO 'ISO, YMD'
AS $$ SELECT p_value::date $$;

-- The canonical text of a date key: ISO 8601 (what Python's date.isoformat()
-- and PostgreSQL's ISO DateStyle write), whatever the session's DateStyle.
CREATE FUNCTION pgcounters.date_text(p_value date) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN NOT isfinite(p_value) THEN p_value::text  -- 'infinity', '-infinity' in every style
        WHEN p_value < date '0001-01-01' THEN to_char(p_value, 'YYYY-MM-DD') || ' BC'
        ELSE to_char(p_value, 'YYYY-MM-DD')
    END
$$;


-- =============================================================================
-- Incrementing and reading from SQL
-- =============================================================================
-- The Python client issues the equivalent statements itself, with the target id
-- cached, to save the lookup.

-- Add p_delta to a counter. Queued and unlogged counters get a row in their
-- queue and return NULL; direct counters are updated (named ones through
-- add_direct) and return the new stored value. A key already in canonical form
-- for a queued or unlogged counter is queued after one lookup; every other call
-- canonicalises (or refuses) the key first. A sum of decimals is refused: add to
-- it with incr_decimal.
CREATE FUNCTION pgcounters.incr(
    p_name text, p_key text[] DEFAULT '{}', p_delta bigint DEFAULT 1
)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t pgcounters.targets;
    v_id integer;
    v_mode text;
    v_types text[];
    v_scale integer;
    v_parts integer := cardinality(p_key);
    v_key text[];
    v_value bigint;
BEGIN
    SELECT c.id, c.mode, c.key_types, c.scale INTO v_id, v_mode, v_types, v_scale
      FROM pgcounters.targets AS c WHERE c.name = p_name;
    -- the fast path: a queued or unlogged counter whose key reads as the canonical function
    -- would write it (a bigint in decimal without leading zeros and at most 18
    -- digits, a lower-case hyphenated uuid, a text of at most 1000 characters)
    IF v_mode IN ('queued', 'unlogged') AND p_delta IS NOT NULL AND v_scale IS NULL
       AND cardinality(v_types) = v_parts
       AND (v_parts = 0 OR (v_parts <= 3 AND array_ndims(p_key) = 1 AND array_lower(p_key, 1) = 1
            AND CASE v_types[1]
                   WHEN 'bigint' THEN p_key[1] ~ '^(0|-?[1-9][0-9]{0,17})$'
                   WHEN 'uuid' THEN p_key[1]
                       ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                   WHEN 'text' THEN length(p_key[1]) <= 1000
                   ELSE false END
            AND (v_parts < 2 OR CASE v_types[2]
                   WHEN 'bigint' THEN p_key[2] ~ '^(0|-?[1-9][0-9]{0,17})$'
                   WHEN 'uuid' THEN p_key[2]
                       ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                   WHEN 'text' THEN length(p_key[2]) <= 1000
                   ELSE false END)
            AND (v_parts < 3 OR CASE v_types[3]
                   WHEN 'bigint' THEN p_key[3] ~ '^(0|-?[1-9][0-9]{0,17})$'
                   WHEN 'uuid' THEN p_key[3]
                       ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                   WHEN 'text' THEN length(p_key[3]) <= 1000
                   ELSE false END))) THEN
        IF v_mode = 'queued' THEN
            INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (v_id, p_key, p_delta);
        ELSE
            INSERT INTO pgcounters.queue_unlogged (target_id, key, delta)
            VALUES (v_id, p_key, p_delta);
        END IF;
        RETURN NULL;
    END IF;
    -- every other call, as in version 13
    IF p_delta IS NULL THEN  -- refused before anything is written (version 28)
        RAISE EXCEPTION 'pgcounters.incr needs a delta: got NULL for counter %', p_name
            USING ERRCODE = 'PCT01';
    END IF;
    t := pgcounters._target(p_name);
    v_key := pgcounters._canonical_key(t, p_key);
    IF t.scale IS NOT NULL THEN  -- decimal
        RAISE EXCEPTION 'counter % sums decimals: add to it with pgcounters.incr_decimal', t.name
            USING ERRCODE = 'PC002';
    END IF;
    IF t.mode = 'queued' THEN
        INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (t.id, v_key, p_delta);
        RETURN NULL;
    ELSIF t.mode = 'unlogged' THEN
        INSERT INTO pgcounters.queue_unlogged (target_id, key, delta) VALUES (t.id, v_key, p_delta);
        RETURN NULL;
    ELSIF t.target_table IS NULL THEN
        RETURN pgcounters.add_direct(ARRAY[t.id], ARRAY[v_key::text], ARRAY[p_delta]);
    END IF;
    -- direct column counter: one row, locked by this UPDATE (the plain UPDATE it replaces)
    PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
    EXECUTE format(
        'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + $1 WHERE x.%I = $2::%s RETURNING x.%I',
        t.target_schema, t.target_table, t.target_column, t.target_column,
        t.target_key_column, t.key_types[1]::regtype, t.target_column)
    INTO v_value USING p_delta, v_key[1];
    PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
    -- the changed row's key noted for a reporting worker, as the Python client notes it
    -- (version 28)
    IF v_value IS NOT NULL AND p_delta <> 0 THEN
        PERFORM pgcounters.note_direct(t.id, ARRAY[v_key[1]]);
    END IF;
    RETURN v_value;
END;
$$;

-- Refuse (PC008) a change of a counter that would leave the bigint range.
CREATE FUNCTION pgcounters._overflow(p_target integer, p_key text[], p_value bigint,
    p_delta bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RAISE EXCEPTION 'counter % key %: % + % leaves the range of its values (bigint)',
        coalesce((SELECT t.name FROM pgcounters.targets AS t WHERE t.id = p_target),
                 '#' || p_target), p_key, p_value, p_delta
        USING ERRCODE = 'PC008';
END;
$$;

-- The new value of a stored value of a named counter after a delta; one outside the bigint
-- range is refused (PC008, _overflow) naming the counter and the key. Inlined by the
-- planner: _overflow runs only for such a sum.
CREATE FUNCTION pgcounters._added(p_value bigint, p_delta bigint, p_target integer,
    p_key text[])
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN (p_delta > 0 AND p_value > 9223372036854775807 - p_delta)
                  OR (p_delta < 0 AND p_value < (-9223372036854775807 - 1) - p_delta)
                THEN pgcounters._overflow(p_target, p_key, p_value, p_delta)
                ELSE p_value + p_delta END
$$;

-- Add deltas to named counters in direct mode: p_targets[i] gets p_deltas[i]
-- under key p_keys[i] (canonical keys come out unchanged). Rows are applied summed
-- per (target, key), in (target, key) order, so two callers cannot deadlock.
-- Targets that are not named direct counters are refused (PC003 unknown, PC004
-- wrong key), nothing is written. Returns the new value of the last (target, key)
-- in that order. The client and the triggers call this: an application role needs
-- no write right on pgcounters.counters.
CREATE FUNCTION pgcounters.add_direct(p_targets integer[], p_keys text[], p_deltas bigint[])
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    v_value bigint;
    v_key text[];
    v_target pgcounters.targets;
    v_keys text[] := '{}';
    i integer;
BEGIN
    IF coalesce(array_length(p_targets, 1), 0) <> coalesce(array_length(p_keys, 1), 0)
       OR coalesce(array_length(p_targets, 1), 0) <> coalesce(array_length(p_deltas, 1), 0) THEN
        RAISE EXCEPTION 'add_direct needs as many keys and deltas as targets'
            USING ERRCODE = 'PC004';
    END IF;
    IF array_length(p_targets, 1) = 1 AND p_keys[1] ~ '^\{-?(0|[1-9][0-9]{0,17})\}$' THEN
        -- one increment with one integer key already canonical (the client's, a
        -- trigger's): no cast to check, no subtransaction
        SELECT * INTO v_target FROM pgcounters.targets WHERE id = p_targets[1];
        IF NOT FOUND OR v_target.mode <> 'direct' OR v_target.target_table IS NOT NULL THEN
            RAISE EXCEPTION 'counter id % is not a named counter in direct mode', p_targets[1]
                USING ERRCODE = 'PC003';
        END IF;
        IF v_target.key_types = '{bigint}' AND p_deltas[1] IS NOT NULL THEN
            INSERT INTO pgcounters.counters AS c (target_id, key, value)
            VALUES (v_target.id, p_keys[1]::text[], p_deltas[1])
            ON CONFLICT (target_id, key)
            DO UPDATE SET value = pgcounters._added(c.value, excluded.value, c.target_id, c.key)
            RETURNING c.value INTO v_value;
            IF p_deltas[1] <> 0 AND pgcounters._direct_listened() THEN
                INSERT INTO pgcounters.direct_changes (target_id, keys)
                VALUES (v_target.id, ARRAY[p_keys[1]]);
            END IF;
            RETURN v_value;
        END IF;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_targets, 1), 0) LOOP
        IF v_target.id IS DISTINCT FROM p_targets[i] THEN
            SELECT * INTO v_target FROM pgcounters.targets WHERE id = p_targets[i];
            IF NOT FOUND OR v_target.mode <> 'direct' OR v_target.target_table IS NOT NULL THEN
                RAISE EXCEPTION 'counter id % is not a named counter in direct mode', p_targets[i]
                    USING ERRCODE = 'PC003';
            END IF;
        END IF;
        IF p_keys[i] IS NULL THEN
            v_key := NULL;
        ELSE
            BEGIN
                v_key := p_keys[i]::text[];
            EXCEPTION WHEN invalid_text_representation THEN
                RAISE EXCEPTION 'counter %: key % is not an array literal',
                    v_target.name, quote_literal(p_keys[i]) USING ERRCODE = 'PC004';
            END;
        END IF;
        v_keys := v_keys || pgcounters._canonical_key(v_target, v_key)::text;
    END LOOP;
    IF array_length(p_targets, 1) = 1 THEN
        -- one increment (Counters.incr): as fast as a plain upsert
        IF p_deltas[1] IS NULL THEN
            RETURN NULL;
        END IF;
        INSERT INTO pgcounters.counters AS c (target_id, key, value)
        VALUES (v_target.id, v_keys[1]::text[], p_deltas[1])
        ON CONFLICT (target_id, key)
            DO UPDATE SET value = pgcounters._added(c.value, excluded.value, c.target_id, c.key)
        RETURNING c.value INTO v_value;
        IF p_deltas[1] <> 0 AND pgcounters._direct_listened() THEN
            INSERT INTO pgcounters.direct_changes (target_id, keys) VALUES (v_target.id, v_keys);
        END IF;
        RETURN v_value;
    END IF;
    WITH summed AS (
        SELECT d.target_id, d.key::text[] AS key, sum(d.delta)::bigint AS delta
          FROM unnest(p_targets, v_keys, p_deltas) AS d(target_id, key, delta)
         GROUP BY 1, 2
    ), applied AS (
        INSERT INTO pgcounters.counters AS c (target_id, key, value)
        SELECT s.target_id, s.key, s.delta FROM summed AS s
         WHERE s.delta IS NOT NULL
         ORDER BY s.target_id, s.key
        ON CONFLICT (target_id, key)
            DO UPDATE SET value = pgcounters._added(c.value, excluded.value, c.target_id, c.key)
        RETURNING c.target_id, c.key, c.value
    )
    SELECT a.value INTO v_value FROM applied AS a ORDER BY a.target_id DESC, a.key DESC LIMIT 1;
    IF pgcounters._direct_listened() THEN
        -- one row per counter of the call, its keys in one array (version 20): the keys
        -- whose summed delta changed something (+1 and -1 on a key change nothing)
        INSERT INTO pgcounters.direct_changes (target_id, keys)
        SELECT s.target_id, array_agg(s.key)
          FROM (SELECT d.target_id, d.key
                  FROM unnest(p_targets, v_keys, p_deltas) AS d(target_id, key, delta)
                 GROUP BY d.target_id, d.key
                HAVING sum(d.delta) <> 0) AS s
         GROUP BY s.target_id;
    END IF;
    RETURN v_value;
END;
$$;

-- Exact value of one counter: stored + pending, from one snapshot. Refused while
-- the counter is backfilled. On a hot standby (which cannot plan a statement that
-- names an unlogged table, whose rows it does not have) it sums the logged queue
-- only, and refuses the exact read of an unlogged counter (PCR01). A sum of
-- decimals is read with get_decimal.
CREATE FUNCTION pgcounters.get(p_name text, p_key text[] DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
BEGIN
    IF t.scale IS NOT NULL THEN
        RAISE EXCEPTION 'counter % sums decimals: read it with pgcounters.get_decimal', t.name
            USING ERRCODE = 'PC002';
    END IF;
    RETURN pgcounters._exact_units(t, p_key)::bigint;
END;
$$;


-- The n highest stored values of a counter, highest first (ties by key): the
-- order of the Python client's top. Stored values only: deltas not yet drained
-- are not ranked. A counter column is ranked from its table (a NULL as 0).
-- Values are numeric, so that a sum of decimals reads as one.
CREATE FUNCTION pgcounters.top(p_name text, p_n bigint DEFAULT 10)
RETURNS TABLE (key text[], value numeric)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
BEGIN
    IF p_n IS NULL OR p_n < 0 THEN
        RAISE EXCEPTION 'n must be zero or more, got %', coalesce(p_n::text, 'NULL')
            USING ERRCODE = 'PCT01';
    END IF;
    IF t.target_table IS NULL THEN
        -- the band is monotonic in the value: this is ORDER BY value DESC, key,
        -- read from the index on (target_id, band DESC); periods no longer kept left out
        RETURN QUERY
            SELECT c.key, pgcounters.unscaled(c.value, coalesce(t.scale, 0))
              FROM pgcounters.counters AS c
             WHERE c.target_id = t.id
               AND pgcounters._kept(c.key[cardinality(c.key)],
                                    (SELECT pgcounters._first_kept(t.id)))
             ORDER BY c.band DESC, c.value DESC, c.key COLLATE "C"
             LIMIT p_n;
    ELSE
        RETURN QUERY EXECUTE format(
            'SELECT ARRAY[x.%1$I::text], coalesce(x.%2$I, 0)::numeric FROM %3$I.%4$I AS x'
            ' ORDER BY x.%2$I DESC NULLS LAST, x.%1$I LIMIT $1',
            t.target_key_column, t.target_column, t.target_schema, t.target_table)
            USING p_n;
    END IF;
END;
$$;

-- The exact values (stored + pending) of many keys of one counter, one row per
-- key in the order given, each key canonical: p_keys is a two-dimensional array,
-- one key per row ('{{1,2026-11-21},{2,2026-11-21}}'), or, for a counter with a
-- one-part key, a plain array of keys ('{1,2,3}'). Values are numeric (a sum of
-- decimals reads as one).
CREATE FUNCTION pgcounters.get_many(p_name text, p_keys text[])
RETURNS TABLE (key text[], value numeric)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_parts integer := coalesce(array_length(t.key_types, 1), 0);
    v_key text[];
    v_canonical text[];
BEGIN
    IF p_keys IS NULL OR cardinality(p_keys) = 0 THEN
        RETURN;
    END IF;
    IF v_parts = 0 THEN
        RAISE EXCEPTION 'counter % is global (it takes no key): read it with pgcounters.get',
            t.name
            USING ERRCODE = 'PC004';
    END IF;
    IF array_ndims(p_keys) = 1 AND v_parts = 1 THEN
        FOR i IN array_lower(p_keys, 1) .. array_upper(p_keys, 1) LOOP
            v_canonical := pgcounters._canonical_key(t, ARRAY[p_keys[i]]);
            key := v_canonical;
            value := pgcounters.unscaled(pgcounters._exact_units(t, v_canonical),
                                         coalesce(t.scale, 0));
            RETURN NEXT;
        END LOOP;
    ELSIF array_ndims(p_keys) = 2 THEN
        FOREACH v_key SLICE 1 IN ARRAY p_keys LOOP
            v_canonical := pgcounters._canonical_key(t, v_key);
            key := v_canonical;
            value := pgcounters.unscaled(pgcounters._exact_units(t, v_canonical),
                                         coalesce(t.scale, 0));
            RETURN NEXT;
        END LOOP;
    ELSE
        RAISE EXCEPTION 'counter % takes a key of (%): give its keys as an array of '
                        'arrays, one key each (''{{...},{...}}'')',
            t.name, array_to_string(t.key_types, ', ')
            USING ERRCODE = 'PC004';
    END IF;
END;
$$;

-- =============================================================================
-- Sums of decimals
-- =============================================================================

-- A sum of a numeric(p, s) column is kept exactly as a whole number of 10^-s
-- units (pgcounters.targets.scale = s): the triggers enqueue scaled sums, the
-- queues and the drain stay bigint, and reads scale the units back.

-- A sum of decimals as a whole number of 10^-p_scale units. A value with more
-- decimal places, or one the bigint range cannot hold, is refused (PC021):
-- rounding it would make the counter drift.
CREATE FUNCTION pgcounters.scaled(p_value numeric, p_scale integer, p_name text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_units numeric := p_value * (10::numeric ^ p_scale);
BEGIN
    IF v_units <> trunc(v_units) THEN
        RAISE EXCEPTION USING ERRCODE = 'PC021',
            MESSAGE = format('counter %s sums values with %s decimal places: %s has more',
                             p_name, p_scale, p_value),
            HINT = 'give the summed column the scale of the counter, or round the values';
    END IF;
    IF v_units NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
        RAISE EXCEPTION USING ERRCODE = 'PC021',
            MESSAGE = format('counter %s: a change of %s leaves the range of its values '
                             '(%s decimal places, 18 digits in all)', p_name, p_value, p_scale);
    END IF;
    RETURN v_units::bigint;
END;
$$;

-- A number of 10^-p_scale units as a decimal with p_scale decimal places
-- (exact: a product, never a division). Inlined by the planner.
CREATE FUNCTION pgcounters.unscaled(p_units numeric, p_scale integer) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT round(p_units * (10::numeric ^ (-p_scale)), p_scale)
$$;

-- In a probe (planned, never run): true when column p_column of p_table is
-- numeric with p_scale decimal places, else an error. Declared IMMUTABLE so
-- that the planner evaluates it, with its constant arguments, while it plans
-- the probe: a later change of the column's scale (numeric(10,2) to
-- numeric(10,3), or to another type) then stops the probe from planning, and
-- the schema-change guard refuses it.
CREATE FUNCTION pgcounters.decimal_scale_is(p_table regclass, p_column name, p_scale integer)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_type oid;
    v_typmod integer;
BEGIN
    SELECT a.atttypid, a.atttypmod INTO v_type, v_typmod
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = p_table AND a.attname = p_column AND NOT a.attisdropped;
    IF v_type IS DISTINCT FROM 'numeric'::regtype OR v_typmod < 4
       OR ((v_typmod - 4) & 65535) <> p_scale THEN
        RAISE EXCEPTION USING ERRCODE = 'PC020',
            MESSAGE = format('column %s of %s is %s, not numeric with %s decimal places',
                             p_column, p_table,
                             coalesce(pg_catalog.format_type(v_type, v_typmod), 'gone'), p_scale);
    END IF;
    RETURN true;
END;
$$;

-- ensure_target (version 2) for a decimal counter: the target records its
-- scale when it is created; a counter column must be numeric with that scale
-- (create_column_counter takes integer columns only). A counter that exists
-- with another scale (or as an integer counter) is another definition (PC001):
-- its values and pending deltas are in other units.
CREATE FUNCTION pgcounters.ensure_decimal_target(
    p_scale integer,
    p_name text,
    p_key_types text[],
    p_mode text,
    p_schema text DEFAULT NULL,
    p_table text DEFAULT NULL,
    p_column text DEFAULT NULL,
    p_key_column text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_existed boolean;
    v_id integer;
    v_scale integer;
    v_relation regclass;
    v_type text;
BEGIN
    SELECT true, t.scale INTO v_existed, v_scale FROM pgcounters.targets AS t WHERE t.name = p_name;
    IF v_existed IS NULL AND p_table IS NOT NULL THEN
        v_relation := format('%I.%I', p_schema, p_table)::regclass;
        SELECT format_type(a.atttypid, a.atttypmod) INTO v_type
          FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid = v_relation AND a.attname = p_column AND a.attnum > 0
           AND NOT a.attisdropped;
        IF coalesce(v_type, '') <> 'numeric'
           AND coalesce(v_type, '') NOT LIKE 'numeric(%,' || p_scale || ')' THEN
            RAISE EXCEPTION USING ERRCODE = 'PC002',
                MESSAGE = format('counter column %s.%s is %s: the sum of %s has %s decimal '
                                 'places, its column must be numeric(p, %s)', v_relation,
                                 p_column, coalesce(v_type, 'missing'), p_name, p_scale, p_scale);
        END IF;
        INSERT INTO pgcounters.targets (name, key_types, mode, target_schema, target_table,
                                        target_column, target_key_column, scale)
        VALUES (p_name, p_key_types, p_mode, p_schema, p_table, p_column, p_key_column, p_scale)
        ON CONFLICT (name) DO NOTHING;
        SELECT true, t.scale INTO v_existed, v_scale
          FROM pgcounters.targets AS t WHERE t.name = p_name;
    END IF;
    v_id := pgcounters.ensure_target(p_name, p_key_types, p_mode, p_schema, p_table, p_column,
                                     p_key_column);
    IF v_existed IS NULL THEN
        UPDATE pgcounters.targets SET scale = p_scale WHERE id = v_id;
    ELSIF v_scale IS DISTINCT FROM p_scale THEN
        RAISE EXCEPTION USING ERRCODE = 'PC001',
            MESSAGE = format('counter %s exists with %s: it is declared now with %s decimal '
                             'places', p_name,
                             CASE WHEN v_scale IS NULL THEN 'integer values'
                                  ELSE format('%s decimal places', v_scale) END, p_scale),
            HINT = 'drop the counter (pgcounters drop) and install it again, or give it '
                   'another name';
    END IF;
    RETURN v_id;
END;
$$;

-- The exact value of one key in units (stored + pending, from one snapshot):
-- get's body, with a decimal counter column read in units.
CREATE FUNCTION pgcounters._exact_units(t pgcounters.targets, p_key text[]) RETURNS numeric
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_key text[] := pgcounters._canonical_key(t, p_key);
    v_text text := v_key::text;
    v_standby boolean := pg_is_in_recovery();
    v_stored numeric;
    v_pending numeric;
BEGIN
    IF v_standby AND t.mode = 'unlogged' THEN
        RAISE EXCEPTION 'counter % is unlogged: its pending deltas exist only on the primary, '
                        'read it there (its stored value is readable here)', t.name
            USING ERRCODE = 'PCR01';
    END IF;
    PERFORM pgcounters._backfilling(t.id);
    -- a period a counter per period no longer keeps reads 0, whatever is stored or queued
    IF t.target_table IS NULL
       AND NOT pgcounters._kept(v_key[cardinality(v_key)], pgcounters._first_kept(t.id)) THEN
        RETURN 0;
    END IF;
    IF t.target_table IS NULL THEN
        SELECT value INTO v_stored FROM pgcounters.counters WHERE target_id = t.id AND key = v_key;
    ELSE
        EXECUTE format('SELECT x.%I * %s FROM %I.%I AS x WHERE x.%I = $1::%s',
            t.target_column, 10::numeric ^ coalesce(t.scale, 0),
            t.target_schema, t.target_table, t.target_key_column, t.key_types[1]::regtype)
        INTO v_stored USING v_key[1];
    END IF;
    v_pending := coalesce((SELECT sum(delta) FROM pgcounters.queue
                            WHERE target_id = t.id AND key = v_text), 0);
    IF NOT v_standby THEN
        v_pending := v_pending + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                                            WHERE target_id = t.id AND key = v_text), 0);
    END IF;
    RETURN coalesce(v_stored, 0) + v_pending;
END;
$$;

-- The exact value of any counter as a decimal (an integer counter's too).
CREATE FUNCTION pgcounters.get_decimal(p_name text, p_key text[] DEFAULT '{}') RETURNS numeric
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
BEGIN
    RETURN pgcounters.unscaled(pgcounters._exact_units(t, p_key), coalesce(t.scale, 0));
END;
$$;

-- Add a decimal to a counter; for an integer counter the delta must be whole.
-- Returns the new value of a direct counter (NULL for a queued one), as incr.
CREATE FUNCTION pgcounters.incr_decimal(
    p_name text, p_key text[] DEFAULT '{}', p_delta numeric DEFAULT 1
)
RETURNS numeric
LANGUAGE plpgsql AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_key text[] := pgcounters._canonical_key(t, p_key);
    v_units bigint := pgcounters.scaled(p_delta, coalesce(t.scale, 0), p_name);
    v_value numeric;
BEGIN
    IF t.scale IS NULL THEN
        RETURN pgcounters.incr(p_name, p_key, v_units);
    ELSIF t.mode = 'queued' THEN
        INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (t.id, v_key, v_units);
        RETURN NULL;
    ELSIF t.mode = 'unlogged' THEN
        INSERT INTO pgcounters.queue_unlogged (target_id, key, delta) VALUES (t.id, v_key, v_units);
        RETURN NULL;
    ELSIF t.target_table IS NULL THEN
        RETURN pgcounters.unscaled(
            pgcounters.add_direct(ARRAY[t.id], ARRAY[v_key::text], ARRAY[v_units]), t.scale);
    END IF;
    PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
    EXECUTE format(
        'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + $1 WHERE x.%I = $2::%s RETURNING x.%I',
        t.target_schema, t.target_table, t.target_column, t.target_column,
        t.target_key_column, t.key_types[1]::regtype, t.target_column)
    INTO v_value USING pgcounters.unscaled(v_units, t.scale), v_key[1];
    PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
    RETURN v_value;
END;
$$;


-- =============================================================================
-- Draining
-- =============================================================================
-- A drain batch claims deltas from one queue, sums them per (target, key) and
-- applies them in (target, key) order, in the caller's transaction: two drainers
-- lock counter rows in the same order and cannot deadlock. The drain never waits
-- on a row lock an application may hold (busy parent rows keep their deltas
-- queued), and a delta that cannot be applied is set aside in the quarantine
-- while the rest of its batch is applied.

-- What a batch carries to column counters: one row per (target, key part)
-- with the summed delta (numeric: a sum may leave the bigint range, which is
-- found when it is applied), the number of deltas and the oldest one's time.
CREATE TYPE pgcounters.batch_delta AS (
    target_id integer, key text, delta numeric, n bigint, created_at timestamptz
);

-- One queued delta, as claimed (the careful path keeps them one by one).
CREATE TYPE pgcounters.claimed_delta AS (
    id bigint, target_id integer, key text, delta bigint, created_at timestamptz
);

-- A delta for a column counter, as the first drain carried it (no function uses it now).
CREATE TYPE pgcounters.column_delta AS (target_id integer, key text, delta bigint);

-- Change notifications (version 17): a drain batch of a session that sets
-- pgcounters.note_changes to 'on' adds the keys it changed to the transaction's
-- setting pgcounters.changes, a JSON array of [counter name, key parts] pairs
-- (a key may appear more than once), through set_config. The setting is local
-- to the transaction and follows its subtransactions: a part of the batch that
-- rolls back leaves no trace, and the caller reads it before the batch commits.

-- One batch of one queue (drain_queue), returning the deltas applied and the
-- counter values changed. Deltas left busy or set aside are reported by drain_queue.
CREATE FUNCTION pgcounters.drain_batch(
    p_limit integer DEFAULT 10000,
    p_unlogged boolean DEFAULT false,
    OUT deltas bigint,
    OUT keys bigint
)
LANGUAGE sql AS $$
    SELECT d.deltas, d.keys FROM pgcounters.drain_queue(p_limit, p_unlogged) AS d
$$;

-- Apply at most p_limit pending deltas of one queue, in the caller's
-- transaction (one batch = one transaction: the caller commits). Returns:
--   deltas       deltas applied;
--   keys         counter values (rows) changed;
--   busy         deltas left queued because an application holds their
--                parent row (queued again, as one delta per key);
--   quarantined  deltas set aside in pgcounters.quarantine;
--   ahead        when some were left busy: whether deltas queued before them
--                remain (a drain that finds only busy deltas and nothing
--                ahead of them is done for now).
--
-- The claim: the holder of the queue's advisory lock takes a range of ids
-- without row locks, any other drainer claims with SKIP LOCKED; a column
-- counter whose table or columns are gone is left out. Then:
--
-- * named counters are upserted in (target, key) order in the claim's
--   statement. Only drainers and recount lock these rows, all in key order;
-- * parent rows of column counters are taken with SKIP LOCKED (the drain never
--   waits on an application's lock, so it is never a party to a deadlock);
--   busy rows keep their deltas queued for a later batch;
-- * if anything in the batch cannot be applied (a data error), the whole
--   batch is taken again on a careful path: one (target, key) at a time, each
--   in a subtransaction, and the deltas of a failing one go to the
--   quarantine with the error. The fast path costs one subtransaction per
--   batch; the careful one runs only for a batch holding a bad delta, which
--   leaves the queue with it.
CREATE FUNCTION pgcounters.drain_queue(
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

-- Drain both queues to empty, committing after every batch (batch_size deltas, or a
-- queue holding more in one batch of up to pgcounters.max_batch_size, 500000 when
-- unset), the queues taking turns: CALL pgcounters.drain_all(); from psql
-- or cron. Each batch is drain_queue, which never waits on a row an application
-- holds: deltas of such rows stay queued (busy) for a later drain. A procedure
-- that commits cannot run inside a transaction block: it refuses to (PC005).
-- Returns the deltas applied, the deltas left busy by the last batch of each
-- queue, and the deltas set aside in the quarantine.
CREATE PROCEDURE pgcounters.drain_all(
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

-- The careful path of drain_queue: claim the batch again (its fast attempt was
-- rolled back), then apply one (target, key) at a time, each in a
-- subtransaction; a data error sets that key's deltas aside with the error.
-- Returns the deltas claimed (applied, left busy and set aside together).
CREATE FUNCTION pgcounters._drain_carefully(
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
CREATE FUNCTION pgcounters._drain_columns(
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

-- Lock, without waiting, the rows of one parent table keyed by p_keys (texts
-- of the key type), in key order. locked: the keys of the rows now locked by
-- this transaction; busy: keys of rows that exist but another transaction
-- holds. Keys of rows that do not exist are in neither.
CREATE FUNCTION pgcounters._lock_parents(
    p_schema text, p_table text, p_key_column text, p_key_type text, p_keys text[],
    OUT locked text[], OUT busy text[]
)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(
        'SELECT coalesce(array_agg(l.k::text ORDER BY l.k), ''{}'') FROM (
           SELECT x.%I AS k FROM %I.%I AS x WHERE x.%I = ANY ($1::%s[])
            ORDER BY x.%I FOR NO KEY UPDATE OF x SKIP LOCKED) AS l',
        p_key_column, p_schema, p_table, p_key_column, p_key_type::regtype, p_key_column)
    INTO locked USING p_keys;
    busy := '{}';
    IF cardinality(locked) < cardinality(p_keys) THEN
        -- fewer rows than keys: rows that are gone, or busy (another transaction
        -- holds them, or inserted them and has not committed)
        EXECUTE format(
            'SELECT coalesce(array_agg(w.u::text ORDER BY w.u), ''{}'')
               FROM (SELECT DISTINCT u FROM unnest($1::%s[]) AS u) AS w
              WHERE w.u <> ALL ($2::%s[])
                AND EXISTS (SELECT 1 FROM %I.%I AS x WHERE x.%I = w.u)',
            p_key_type::regtype, p_key_type::regtype, p_schema, p_table, p_key_column)
        INTO busy USING p_keys, locked;
    END IF;
END;
$$;

-- THE one place where the drain writes a counter column of a user table:
-- add p_deltas[i] to the row keyed p_keys[i] (texts of the key type, summed
-- per typed key), for keys in p_locked only (rows this transaction has
-- locked). pgcounters.applying is 'on' for the UPDATE only, so a guard on the
-- table can tell pgcounters' writes from anyone else's. Returns rows updated.
CREATE FUNCTION pgcounters._apply_column(
    p_target pgcounters.targets, p_keys text[], p_deltas numeric[], p_locked text[]
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_rows bigint;
BEGIN
    PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
    EXECUTE format(
        'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + %s
           FROM (SELECT u.key, sum(u.delta)::bigint AS delta
                   FROM unnest($1::%s[], $2::numeric[]) AS u(key, delta)
                  WHERE u.key = ANY ($3::%s[])
                  GROUP BY u.key) AS d
          WHERE x.%I = d.key',
        p_target.target_schema, p_target.target_table, p_target.target_column,
        p_target.target_column,
        CASE WHEN p_target.scale IS NULL THEN 'd.delta'  -- scale
             ELSE format('pgcounters.unscaled(d.delta, %s)', p_target.scale) END,
        p_target.key_types[1]::regtype,
        p_target.key_types[1]::regtype, p_target.target_key_column)
    USING p_keys, p_deltas, p_locked;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
    RETURN v_rows;
END;
$$;

-- Errors of the data, which a later attempt would meet again: the delta is set
-- aside. Anything else (deadlock, serialization failure, lock or statement
-- timeout, lost privileges, a full disk) aborts the batch, which is retried whole.
CREATE FUNCTION pgcounters._quarantinable(p_sqlstate text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT left(p_sqlstate, 2) IN ('22', '23') OR p_sqlstate IN ('PC003', 'PC004', 'P0001')
$$;

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


-- =============================================================================
-- The quarantine
-- =============================================================================

-- Deltas the drain could not apply, one row per queued delta, with the error.
-- `pgcounters quarantine list | replay | discard` works on it; a replay moves
-- rows back into their queue (after the cause is fixed), a discard deletes them.
CREATE TABLE pgcounters.quarantine (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    target_id      integer NOT NULL,
    counter        text,            -- its name when set aside (NULL: no such counter)
    key            text NOT NULL,   -- as it was queued
    delta          bigint NOT NULL,
    unlogged       boolean NOT NULL,
    created_at     timestamptz NOT NULL,
    quarantined_at timestamptz NOT NULL DEFAULT now(),
    sqlstate       text NOT NULL,
    error          text NOT NULL
);

-- The set-aside deltas of one counter, oldest first.
CREATE INDEX quarantine_target ON pgcounters.quarantine (target_id, id);

-- Move set-aside deltas back into their queues (after their cause was fixed):
-- the given ids, or all of one counter's (by name, also a counter re-created
-- under that name: its deltas go to the counter of that name now), or all.
-- Returns the number of deltas moved.
CREATE FUNCTION pgcounters.replay_quarantined(
    p_ids bigint[] DEFAULT NULL, p_counter text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    WITH taken AS (
        DELETE FROM pgcounters.quarantine AS q
         WHERE (p_ids IS NULL OR q.id = ANY (p_ids))
           AND (p_counter IS NULL OR q.counter = p_counter)
           -- a delta of a counter dropped and not declared again stays set aside: back
           -- in the queue, the next drain would only set it aside again (version 29)
           AND (EXISTS (SELECT 1 FROM pgcounters.targets AS t WHERE t.id = q.target_id)
                OR EXISTS (SELECT 1 FROM pgcounters.targets AS t WHERE t.name = q.counter))
        RETURNING q.id, q.target_id, q.counter, q.key, q.delta, q.unlogged, q.created_at
    ), routed AS (
        SELECT k.id, coalesce(t.id, k.target_id) AS target_id, k.key, k.delta, k.unlogged,
               k.created_at
          FROM taken AS k
          LEFT JOIN pgcounters.targets AS old ON old.id = k.target_id
          LEFT JOIN pgcounters.targets AS t ON old.id IS NULL AND t.name = k.counter
    ), logged AS (
        INSERT INTO pgcounters.queue (target_id, key, delta, created_at)
        SELECT r.target_id, r.key, r.delta, r.created_at FROM routed AS r
         WHERE NOT r.unlogged ORDER BY r.id
        RETURNING 1
    ), unlogged AS (
        INSERT INTO pgcounters.queue_unlogged (target_id, key, delta, created_at)
        SELECT r.target_id, r.key, r.delta, r.created_at FROM routed AS r
         WHERE r.unlogged ORDER BY r.id
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM logged) + (SELECT count(*) FROM unlogged) INTO v_n;
    RETURN v_n;
END;
$$;

-- Delete set-aside deltas: the given ids, or all of one counter's, or all.
CREATE FUNCTION pgcounters.discard_quarantined(
    p_ids bigint[] DEFAULT NULL, p_counter text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    DELETE FROM pgcounters.quarantine AS q
     WHERE (p_ids IS NULL OR q.id = ANY (p_ids))
       AND (p_counter IS NULL OR q.counter = p_counter);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;


-- =============================================================================
-- Drain statistics and retries
-- =============================================================================

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
    busy     bigint NOT NULL DEFAULT 0,
    quarantined bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket, unlogged, pid)
) WITH (fillfactor = 50);

-- Add one batch to the statistics (without the deltas left busy or set aside; kept for code that calls it).
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

-- Add one batch to the statistics, with the deltas left busy and set aside.
CREATE FUNCTION pgcounters._record_drain(
    p_unlogged boolean, p_deltas bigint, p_keys bigint, p_seconds double precision,
    p_busy bigint, p_quarantined bigint
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_bucket timestamptz := date_trunc('minute', now());
    v_new boolean;
BEGIN
    INSERT INTO pgcounters.drain_stats AS s
           (bucket, unlogged, pid, batches, deltas, keys, seconds, busy, quarantined)
    VALUES (v_bucket, p_unlogged, pg_backend_pid(), 1, p_deltas, p_keys, p_seconds,
            p_busy, p_quarantined)
    ON CONFLICT (bucket, unlogged, pid) DO UPDATE
       SET batches = s.batches + 1,
           deltas = s.deltas + excluded.deltas,
           keys = s.keys + excluded.keys,
           seconds = s.seconds + excluded.seconds,
           busy = s.busy + excluded.busy,
           quarantined = s.quarantined + excluded.quarantined
    RETURNING (xmax = 0) INTO v_new;

    IF v_new THEN
        WITH old AS (
            DELETE FROM pgcounters.drain_stats d
             WHERE (d.bucket, d.unlogged, d.pid) IN (
                   SELECT o.bucket, o.unlogged, o.pid
                     FROM pgcounters.drain_stats o
                    WHERE o.bucket > '-infinity' AND o.bucket < v_bucket - interval '1 hour'
                      FOR UPDATE SKIP LOCKED)
            RETURNING d.unlogged, d.batches, d.deltas, d.keys, d.seconds, d.busy, d.quarantined
        )
        INSERT INTO pgcounters.drain_stats AS s
               (bucket, unlogged, pid, batches, deltas, keys, seconds, busy, quarantined)
        SELECT '-infinity', o.unlogged, 0, sum(o.batches), sum(o.deltas), sum(o.keys),
               sum(o.seconds), sum(o.busy), sum(o.quarantined)
          FROM old o
         GROUP BY o.unlogged
        ON CONFLICT (bucket, unlogged, pid) DO UPDATE
           SET batches = s.batches + excluded.batches,
               deltas = s.deltas + excluded.deltas,
               keys = s.keys + excluded.keys,
               seconds = s.seconds + excluded.seconds,
               busy = s.busy + excluded.busy,
               quarantined = s.quarantined + excluded.quarantined;
    END IF;
END;
$$;

-- Batches that PostgreSQL aborted (deadlock, serialization failure, lock or
-- statement timeout) and that were retried, per operation and reason.
CREATE TABLE pgcounters.retries (
    operation text NOT NULL,
    reason    text NOT NULL,
    retries   bigint NOT NULL DEFAULT 0,
    last_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation, reason)
);

-- Count one retried batch of an operation, by reason.
CREATE FUNCTION pgcounters.record_retry(p_operation text, p_reason text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO pgcounters.retries AS r (operation, reason, retries)
    VALUES (p_operation, p_reason, 1)
    ON CONFLICT (operation, reason) DO UPDATE SET retries = r.retries + 1, last_at = now()
$$;


-- =============================================================================
-- Wake-ups of the workers (LISTEN/NOTIFY, rate-limited, optional)
-- =============================================================================

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
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
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


-- =============================================================================
-- Declared counters (kept by triggers)
-- =============================================================================
-- A counter spec (pgcounters/specs.py) says what to count; the compiler
-- (pgcounters/compiler.py) turns it into statement-level triggers on the
-- counted table, which call the functions below. The spec is recorded in
-- pgcounters.specs, so that verify, recount and status work from the database
-- alone.

-- Declared specs: the definition (JSON, see CounterSpec.to_json), the
-- fingerprint of the triggers compiled from it, the probe (a query reading what
-- the triggers read, planned after each ALTER TABLE of the source), the delta of
-- a set of rows (for descendants of the source), and what the counter does with
-- writes of replica-mode sessions.
CREATE TABLE pgcounters.specs (
    name        text PRIMARY KEY,
    fingerprint text NOT NULL,
    definition  jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    probe       text,
    rows_delta  text,
    replica_writes text NOT NULL DEFAULT 'flag' CHECK (replica_writes IN ('flag', 'count'))
);

-- Progress of recounts, so that an interrupted recount resumes where it stopped.
CREATE TABLE pgcounters.recounts (
    name        text PRIMARY KEY,
    cursor_key  text[],
    keys_done   bigint NOT NULL DEFAULT 0,
    keys_fixed  bigint NOT NULL DEFAULT 0,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);

-- Backfills requested for declared counters, and their progress (cursor_key).
CREATE TABLE pgcounters.backfills (
    name text PRIMARY KEY,
    fingerprint text NOT NULL,
    cursor_key text[],
    keys_done bigint NOT NULL DEFAULT 0,
    requested_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- the counter's stale mark as the first batch started: cleared at the end if unchanged
    stale_since timestamptz,
    stale_statements bigint
);

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

-- True when counting is paused in this session for the named counter
-- (pgcounters.paused = 'all' or a comma-separated list of names), for a role
-- that may pause; PC error for any other role. One expression without FROM
-- (version 25): PostgreSQL inlines it into each trigger's IF, no function call.
CREATE FUNCTION pgcounters.is_paused(p_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN coalesce(current_setting('pgcounters.paused', true), '') = '' THEN false
        WHEN current_setting('pgcounters.paused', true) = 'all'
             OR p_name = ANY (string_to_array(current_setting('pgcounters.paused', true), ','))
            THEN pgcounters._check_may_pause()
        ELSE false
    END
$$;

-- The roles that may pause counting besides the schema's owner and superusers
-- (pgcounters.paused is meant for a bulk import followed by a recount; for any
-- other role the setting is refused at the first counted write).
CREATE TABLE pgcounters.pausers (
    role_name name PRIMARY KEY,
    granted_at timestamptz NOT NULL DEFAULT now()
);

-- Raises for a role that may not pause counting (called only when the
-- setting names the counter: the unpaused path costs nothing more).
CREATE FUNCTION pgcounters._check_may_pause() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pg_catalog.pg_has_role(current_user,
            (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n
              WHERE n.nspname = 'pgcounters'), 'USAGE')
       OR EXISTS (SELECT 1 FROM pgcounters.pausers AS p
                   WHERE pg_catalog.pg_has_role(current_user, p.role_name, 'USAGE')) THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'role % may not pause counting (pgcounters.paused is set)',
            quote_ident(current_user)
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Unset pgcounters.paused, or have the owner run pgcounters.grant_pause(role).';
END;
$$;

-- Let p_role pause counting for its own session (bulk imports). Returns the
-- statements run, as the other grant functions do.
CREATE FUNCTION pgcounters.grant_pause(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgcounters._for_role(p_role, '{}');
    INSERT INTO pgcounters.pausers (role_name) VALUES (p_role) ON CONFLICT DO NOTHING;
    RETURN ARRAY[format('INSERT INTO pgcounters.pausers (role_name) VALUES (%L)', p_role)];
END;
$$;

-- TRUNCATE of a counted table resets its counter. TRUNCATE ONLY of a table
-- whose inheritance children keep rows leaves those rows counting: zero is not
-- the truth then, and the TRUNCATE is refused.
CREATE FUNCTION pgcounters.reset_target(p_target_id integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t pgcounters.targets;
    v_source regclass;
    v_left boolean;
BEGIN
    SELECT * INTO t FROM pgcounters.targets WHERE id = p_target_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT to_regclass(format('%I.%I', s.definition -> 'source' ->> 'schema',
                              s.definition -> 'source' ->> 'table'))
      INTO v_source FROM pgcounters.specs AS s WHERE s.name = t.name;
    IF v_source IS NOT NULL THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', v_source) INTO v_left;
        IF v_left THEN
            RAISE EXCEPTION 'TRUNCATE ONLY %: rows of its inheritance children still count in %',
                    v_source, t.name
                USING ERRCODE = 'PC020',
                      HINT = 'TRUNCATE the table with its children (without ONLY), or DELETE '
                             'FROM ONLY it: its rows then leave the counts one by one.';
        END IF;
    END IF;
    -- as drop_counter: wait for the range drainers first (no deadlock with them)
    PERFORM pg_advisory_xact_lock(hashtext('pgcounters.drain'), 0),
            pg_advisory_xact_lock(hashtext('pgcounters.drain'), 1);
    DELETE FROM pgcounters.queue WHERE target_id = t.id;
    DELETE FROM pgcounters.queue_unlogged WHERE target_id = t.id;
    IF t.target_table IS NULL THEN
        DELETE FROM pgcounters.counters WHERE target_id = t.id;
    ELSE
        PERFORM set_config('pgcounters.applying', 'on', true);  -- a counter column's write
        EXECUTE format('UPDATE %I.%I SET %I = 0 WHERE %I IS DISTINCT FROM 0',
            t.target_schema, t.target_table, t.target_column, t.target_column);
        PERFORM set_config('pgcounters.applying', '', true);
    END IF;
END;
$$;

-- The summed value of a probe, refused at planning unless it is of an integer
-- type (numeric and floating-point values have no implicit cast to bigint).
CREATE FUNCTION pgcounters.integer_value(p_value bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT p_value $$;

-- The counters whose probe does not plan any more on table p_table, with the
-- error: [name, message] pairs. Only counters whose triggers are installed on
-- that table with their recorded fingerprint are probed.
CREATE FUNCTION pgcounters.broken_specs(p_table regclass) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    s record;
    v_broken text[] := '{}';
BEGIN
    FOR s IN
        SELECT sp.name, sp.probe
          FROM pgcounters.specs AS sp
         WHERE sp.probe IS NOT NULL
           -- its triggers installed on p_table, the table it counts or a table of
           -- its path (event=via1_insert, ...) ...
           AND (EXISTS (
               SELECT 1 FROM pg_catalog.pg_trigger AS t
                 JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid
                WHERE t.tgrelid = p_table AND NOT t.tgisinternal
                  AND (position(format('-- pgcounters spec fingerprint=%s event=insert name=%s',
                                       sp.fingerprint, sp.name) IN p.prosrc) > 0
                       OR p.prosrc ~ format('-- pgcounters spec fingerprint=%s event=via\d_insert ',
                                            sp.fingerprint)))
           -- ... or installed, and p_table the parent table that holds its column
             OR (EXISTS (
                   SELECT 1 FROM pgcounters.targets AS g
                    WHERE g.name = sp.name AND g.target_table IS NOT NULL
                      AND to_regclass(format('%I.%I', g.target_schema, g.target_table)) = p_table)
                 AND EXISTS (
                   SELECT 1 FROM pg_catalog.pg_trigger AS t
                     JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid
                    WHERE NOT t.tgisinternal
                      AND position(format('-- pgcounters spec fingerprint=%s event=insert name=%s',
                                          sp.fingerprint, sp.name) IN p.prosrc) > 0)))
         ORDER BY sp.name
    LOOP
        BEGIN
            EXECUTE 'EXPLAIN ' || s.probe;
        EXCEPTION WHEN OTHERS THEN
            v_broken := v_broken || ARRAY[s.name, SQLERRM];
        END;
    END LOOP;
    RETURN v_broken;
END;
$$;


-- =============================================================================
-- Counted tables in trees (partitions, inheritance) and the DDL guards
-- =============================================================================

-- The recorded counters whose triggers are installed on their source table,
-- with that table and the triggers (name, function, event, transition tables).
CREATE FUNCTION pgcounters._installed_on_source(p_name text)
RETURNS TABLE (name text, root oid, target_id integer, rows_delta text, trigger_name name,
               function_oid oid, event text, old_table name, new_table name)
LANGUAGE sql STABLE AS $$
    SELECT s.name, r.oid, t.id, s.rows_delta, tg.tgname, tg.tgfoid,
           substring(p.prosrc FROM 'event=(\w+)'), tg.tgoldtable, tg.tgnewtable
      FROM pgcounters.specs AS s
      JOIN pgcounters.targets AS t ON t.name = s.name
      JOIN pg_catalog.pg_class AS r
        ON r.oid = to_regclass(format('%I.%I', s.definition -> 'source' ->> 'schema',
                                      s.definition -> 'source' ->> 'table'))
      JOIN pg_catalog.pg_trigger AS tg ON tg.tgrelid = r.oid AND NOT tg.tgisinternal
      JOIN pg_catalog.pg_proc AS p ON p.oid = tg.tgfoid
     WHERE (p_name IS NULL OR s.name = p_name)
       AND s.rows_delta IS NOT NULL
       AND position(format('-- pgcounters spec fingerprint=%s event=', s.fingerprint)
                    IN p.prosrc) > 0
       AND position(format(' name=%s', s.name) || E'\n' IN p.prosrc) > 0
       -- the counting triggers (not the guards a counter column's table carries)
       AND substring(p.prosrc FROM 'event=(\w+)') IN ('insert', 'update', 'delete', 'truncate')
$$;

-- Every table below p_root in its tree of partitions and inheritance children.
CREATE FUNCTION pgcounters._descendants(p_root oid) RETURNS SETOF oid
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE d(relid) AS (
        SELECT i.inhrelid FROM pg_catalog.pg_inherits AS i WHERE i.inhparent = p_root
        UNION
        SELECT i.inhrelid FROM pg_catalog.pg_inherits AS i JOIN d ON i.inhparent = d.relid
    )
    SELECT relid FROM d
$$;

-- Make the counters (one, or all with NULL) follow their tables' trees: a
-- descendant without the counter's triggers gets them and its rows counted; a
-- table with them that left the tree loses them and its rows' contribution.
-- With p_apply false, only report. Returns what was (or would be) done.
CREATE FUNCTION pgcounters.follow_descendants(p_name text DEFAULT NULL, p_apply boolean DEFAULT true)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    d oid;
    tg record;
    v_done text[] := '{}';
BEGIN
    IF p_apply THEN
        -- the triggers this creates and alters are its own: the DDL guard lets them be
        PERFORM set_config('pgcounters.following', 'on', true);
    END IF;
    FOR c IN
        SELECT DISTINCT i.name, i.root, i.target_id, i.rows_delta,
               (SELECT j.trigger_name FROM pgcounters._installed_on_source(i.name) AS j
                 WHERE j.event = 'insert' LIMIT 1) AS marker
          FROM pgcounters._installed_on_source(p_name) AS i
         ORDER BY i.name
    LOOP
        CONTINUE WHEN c.marker IS NULL;
        -- tables that joined the tree
        FOR d IN
            SELECT x FROM pgcounters._descendants(c.root) AS x
             WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger AS t
                                WHERE t.tgrelid = x AND t.tgname = c.marker)
             ORDER BY x
        LOOP
            v_done := v_done || format('count %s in %s', d::regclass, c.name);
            CONTINUE WHEN NOT p_apply;
            PERFORM set_config('pgcounters.applying', 'on', true);  -- a counter column's write
            EXECUTE format(c.rows_delta, d::regclass) USING c.target_id, 1;
            PERFORM set_config('pgcounters.applying', '', true);
            FOR tg IN
                SELECT * FROM pgcounters._installed_on_source(c.name) ORDER BY trigger_name
            LOOP
                IF tg.event = 'truncate' THEN
                    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %s FOR EACH STATEMENT'
                                   ' EXECUTE FUNCTION pgcounters._truncate_descendant(%L)',
                                   tg.trigger_name, d::regclass, c.name);
                ELSE
                    EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s %s FOR EACH STATEMENT'
                                   ' EXECUTE FUNCTION %s()',
                                   tg.trigger_name, upper(tg.event), d::regclass,
                                   CASE WHEN tg.old_table IS NULL AND tg.new_table IS NULL THEN ''
                                        ELSE 'REFERENCING'
                                             || CASE WHEN tg.old_table IS NULL THEN ''
                                                     ELSE format(' OLD TABLE AS %I', tg.old_table)
                                                END
                                             || CASE WHEN tg.new_table IS NULL THEN ''
                                                     ELSE format(' NEW TABLE AS %I', tg.new_table)
                                                END
                                   END,
                                   tg.function_oid::regproc);
                END IF;
            END LOOP;
        END LOOP;
        -- tables that left it
        FOR d IN
            SELECT t.tgrelid FROM pg_catalog.pg_trigger AS t
             WHERE t.tgname = c.marker AND t.tgrelid <> c.root
               AND t.tgrelid NOT IN (SELECT x FROM pgcounters._descendants(c.root) AS x)
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_trigger AS u
                            WHERE u.tgrelid = t.tgrelid
                              AND u.tgfoid = 'pgcounters._truncate_descendant'::regproc)
             ORDER BY 1
        LOOP
            v_done := v_done || format('uncount %s from %s', d::regclass, c.name);
            CONTINUE WHEN NOT p_apply;
            PERFORM set_config('pgcounters.applying', 'on', true);  -- a counter column's write
            EXECUTE format(c.rows_delta, d::regclass) USING c.target_id, -1;
            PERFORM set_config('pgcounters.applying', '', true);
            FOR tg IN
                SELECT * FROM pgcounters._installed_on_source(c.name) ORDER BY trigger_name
            LOOP
                EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', tg.trigger_name, d::regclass);
            END LOOP;
        END LOOP;
    END LOOP;
    IF p_apply THEN
        PERFORM pgcounters._sync_replica_writes();
        PERFORM set_config('pgcounters.following', '', true);
    END IF;
    RETURN v_done;
END;
$$;

-- BEFORE TRUNCATE of a descendant: its rows leave the counts (TRUNCATE of the
-- counted table itself resets the counter after it).
CREATE FUNCTION pgcounters._truncate_descendant() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_sql text;
    v_target integer;
BEGIN
    IF pgcounters.is_paused(TG_ARGV[0]) THEN
        RETURN NULL;
    END IF;
    SELECT s.rows_delta, t.id INTO v_sql, v_target
      FROM pgcounters.specs AS s JOIN pgcounters.targets AS t ON t.name = s.name
     WHERE s.name = TG_ARGV[0];
    IF v_sql IS NULL THEN
        RAISE EXCEPTION 'counter % counts table % but is not recorded: install it again',
                TG_ARGV[0], TG_RELID::regclass
            USING ERRCODE = 'PC020';
    END IF;
    PERFORM set_config('pgcounters.applying', 'on', true);  -- a counter column's write
    EXECUTE format(v_sql, TG_RELID::regclass) USING v_target, -1;
    PERFORM set_config('pgcounters.applying', '', true);
    RETURN NULL;
END;
$$;

-- Every change of a table's place in a tree goes through CREATE TABLE (a new
-- partition or child) or ALTER TABLE (ATTACH, DETACH, INHERIT, NO INHERIT):
-- follow it when the table is, or was, part of a counted tree; then refuse a
-- change that breaks a counter (the probes).
CREATE FUNCTION pgcounters._guard_ddl() RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    c record;
    v_broken text[];
BEGIN
    IF to_regclass('pgcounters.specs') IS NULL
       OR current_setting('pgcounters.following', true) = 'on' THEN
        RETURN;  -- the schema is being dropped, or this is pgcounters following a tree
    END IF;
    IF EXISTS (
        SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() AS d
         WHERE d.classid = 'pg_catalog.pg_class'::regclass
           AND (EXISTS (SELECT 1 FROM pg_catalog.pg_inherits AS i
                         WHERE i.inhrelid = d.objid OR i.inhparent = d.objid)
                OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger AS t
                            WHERE t.tgrelid = d.objid
                              AND t.tgfoid = 'pgcounters._truncate_descendant'::regproc)))
    THEN
        PERFORM pgcounters.follow_descendants();
    END IF;
    IF TG_TAG <> 'ALTER TABLE' THEN
        RETURN;
    END IF;
    FOR c IN
        SELECT DISTINCT d.objid
          FROM pg_catalog.pg_event_trigger_ddl_commands() AS d
         WHERE d.classid = 'pg_catalog.pg_class'::regclass
    LOOP
        v_broken := pgcounters.broken_specs(c.objid::regclass);
        IF cardinality(v_broken) > 0 THEN
            RAISE EXCEPTION 'this change to table % breaks counter %: %',
                    c.objid::regclass, v_broken[1], v_broken[2]
                USING ERRCODE = 'PC020',
                      HINT = 'Remove the counter''s triggers (or declare it anew) in the same '
                             'transaction, before the change; then install it again.';
        END IF;
    END LOOP;
END;
$$;

-- DROP TABLE of a descendant still in a counted tree: its rows would leave the
-- counts unseen (they cannot be read any more when the drop is reported).
CREATE FUNCTION pgcounters._guard_drop() RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    v_table text;
BEGIN
    IF to_regclass('pgcounters.specs') IS NULL THEN
        RETURN;
    END IF;
    WITH dropped AS (SELECT * FROM pg_catalog.pg_event_trigger_dropped_objects()),
    sources AS (
        SELECT format('%I.%I', s.definition -> 'source' ->> 'schema',
                      s.definition -> 'source' ->> 'table') AS identity
          FROM pgcounters.specs AS s
    )
    SELECT f.object_identity INTO v_table
      FROM dropped AS f
     WHERE f.object_type = 'table'
       AND f.object_identity NOT IN (SELECT identity FROM sources)
       -- a descendant carries the counter's BEFORE TRUNCATE trigger
       AND EXISTS (SELECT 1 FROM dropped AS o
                    WHERE o.object_type = 'trigger'
                      -- pgc_<name>_trn, or pgtrigger_pgc_<name>_trn_<id> when Django's
                      -- migrations delivered the counter's triggers
                      AND split_part(o.object_identity, ' on ', 1) ~ '(^|_)pgc_.*_trn(_[0-9a-f]+)?$'
                      AND split_part(o.object_identity, ' on ', 1) <> 'pgc_replica_watch_trn'
                      AND substr(o.object_identity,
                                 length(split_part(o.object_identity, ' on ', 1)) + 5)
                          = f.object_identity)
       -- dropping the counted table itself takes the whole tree: nothing to refuse
       AND NOT EXISTS (SELECT 1 FROM dropped AS r
                        WHERE r.object_type = 'table'
                          AND r.object_identity IN (SELECT identity FROM sources))
     LIMIT 1;
    IF v_table IS NOT NULL THEN
        RAISE EXCEPTION 'dropping % would take rows out of a counted table unseen', v_table
            USING ERRCODE = 'PC020',
                  HINT = 'Detach it first (ALTER TABLE ... DETACH PARTITION, or NO INHERIT): '
                         'its rows leave the counts; then drop it.';
    END IF;
END;
$$;

-- The guards, as event triggers. PostgreSQL lets only a superuser create one:
-- installed by another role, the guards are left out and drift reports what
-- they would have caught (broken counters, descendants not counted).
DO $$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EVENT TRIGGER pgcounters_guard_ddl ON ddl_command_end
            WHEN TAG IN ('ALTER TABLE', 'CREATE TABLE')
            EXECUTE FUNCTION pgcounters._guard_ddl();
        CREATE EVENT TRIGGER pgcounters_guard_drop ON sql_drop
            WHEN TAG IN ('DROP TABLE')
            EXECUTE FUNCTION pgcounters._guard_drop();
    END IF;
END;
$$;


-- =============================================================================
-- Writes of replica-mode sessions
-- =============================================================================

-- Counters that missed writes, until a recount of them starts.
CREATE TABLE pgcounters.stale_counters (
    name       text PRIMARY KEY,
    reason     text NOT NULL,
    since      timestamptz NOT NULL DEFAULT now(),
    statements bigint NOT NULL DEFAULT 1
);

-- Fires for a statement of a replica-mode session on a counted table (or one
-- of its descendants): each counter of the table that does not count such
-- writes is recorded as stale.
CREATE FUNCTION pgcounters._replica_write() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
BEGIN
    IF current_setting('session_replication_role') <> 'replica' THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgcounters.stale_counters AS sc (name, reason)
    SELECT DISTINCT i.name,
           format('%s written with session_replication_role = replica', TG_RELID::regclass)
      FROM pgcounters._installed_on_source(NULL) AS i
      JOIN pgcounters.specs AS s ON s.name = i.name
     WHERE s.replica_writes = 'flag'
       AND (i.root = TG_RELID OR TG_RELID IN (SELECT pgcounters._descendants(i.root)))
     ORDER BY 1
    ON CONFLICT (name) DO UPDATE SET statements = sc.statements + 1;
    RETURN NULL;
END;
$$;

-- Bring every counted table in line: the watch triggers on each table that
-- carries a counter's triggers (and on no other), and each counter's triggers
-- enabled in origin mode ('flag') or in every mode ('count'). The watch
-- triggers are enabled in replica mode only (version 25; before, in every mode
-- with the same WHEN): in any other session PostgreSQL skips them without
-- evaluating their condition, which cost every statement of a counted table
-- about 1 µs.
CREATE FUNCTION pgcounters._sync_replica_writes() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT t.tgrelid::regclass AS tbl
          FROM pg_catalog.pg_trigger AS t JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid
         WHERE NOT t.tgisinternal
           AND p.prosrc ~ '-- pgcounters spec fingerprint=\w+ event=(insert|update|delete|truncate) '
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger AS w
                            WHERE w.tgrelid = t.tgrelid AND w.tgname = 'pgc_replica_watch')
         ORDER BY 1
    LOOP
        EXECUTE format('CREATE TRIGGER pgc_replica_watch AFTER INSERT OR UPDATE OR DELETE ON %s'
                       ' FOR EACH STATEMENT'
                       ' WHEN (pg_catalog.current_setting(''session_replication_role'') = ''replica'')'
                       ' EXECUTE FUNCTION pgcounters._replica_write()', r.tbl);
        EXECUTE format('CREATE TRIGGER pgc_replica_watch_trn AFTER TRUNCATE ON %s'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION pgcounters._replica_write()', r.tbl);
        EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER pgc_replica_watch', r.tbl);
        EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER pgc_replica_watch_trn', r.tbl);
    END LOOP;
    -- the watch triggers an earlier version enabled in every mode
    FOR r IN
        SELECT w.tgrelid::regclass AS tbl, w.tgname
          FROM pg_catalog.pg_trigger AS w
         WHERE w.tgname IN ('pgc_replica_watch', 'pgc_replica_watch_trn')
           AND w.tgfoid = 'pgcounters._replica_write'::regproc
           AND w.tgenabled = 'A'
         ORDER BY 1, 2
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER %I', r.tbl, r.tgname);
    END LOOP;
    FOR r IN
        SELECT w.tgrelid::regclass AS tbl
          FROM pg_catalog.pg_trigger AS w
         WHERE w.tgname = 'pgc_replica_watch'
           AND NOT EXISTS (
               SELECT 1 FROM pg_catalog.pg_trigger AS t JOIN pg_catalog.pg_proc AS p
                   ON p.oid = t.tgfoid
                WHERE t.tgrelid = w.tgrelid AND NOT t.tgisinternal
                  AND p.prosrc
                      ~ '-- pgcounters spec fingerprint=\w+ event=(insert|update|delete|truncate) ')
         ORDER BY 1
    LOOP
        EXECUTE format('DROP TRIGGER pgc_replica_watch ON %s', r.tbl);
        EXECUTE format('DROP TRIGGER IF EXISTS pgc_replica_watch_trn ON %s', r.tbl);
    END LOOP;
    -- each counter's triggers, on its table and every descendant, in its mode
    FOR r IN
        SELECT t.tgrelid::regclass AS tbl, t.tgname,
               CASE s.replica_writes WHEN 'count' THEN 'ALWAYS' ELSE '' END AS enable
          FROM pgcounters.specs AS s
          JOIN pgcounters._installed_on_source(NULL) AS i ON i.name = s.name
          JOIN pg_catalog.pg_trigger AS t
            ON t.tgname = i.trigger_name
           AND (t.tgrelid = i.root OR t.tgrelid IN (SELECT pgcounters._descendants(i.root)))
         WHERE t.tgenabled <> 'D'
           AND t.tgenabled <> CASE s.replica_writes WHEN 'count' THEN 'A' ELSE 'O' END
         ORDER BY 1, 2
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE %s TRIGGER %I', r.tbl, r.enable, r.tgname);
    END LOOP;
END;
$$;

-- Choose what a counter does with replica-mode writes: 'flag' or 'count'.
CREATE FUNCTION pgcounters.set_replica_writes(p_name text, p_mode text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_mode IS NULL OR p_mode NOT IN ('flag', 'count') THEN
        RAISE EXCEPTION 'replica writes are ''flag'' or ''count'', not %', quote_nullable(p_mode)
            USING ERRCODE = 'PC002';
    END IF;
    UPDATE pgcounters.specs SET replica_writes = p_mode WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no counter spec named % is recorded', quote_nullable(p_name)
            USING ERRCODE = 'PC003';
    END IF;
    PERFORM pgcounters.follow_descendants(p_name);
END;
$$;


-- =============================================================================
-- Counters per period (time buckets)
-- =============================================================================
-- A declared counter may count per key per period (hour, day, week, month) of a
-- timestamp column in an IANA time zone: the period is the last part of its key
-- (the local date a day, week or month starts on; the UTC instant an hour starts
-- at), and its recorded spec says the period, the zone and how many are kept.

-- The key part of a day, week or month: the local date (in p_zone) its period
-- starts on. A timestamp without time zone is read as wall-clock time in p_zone.
CREATE FUNCTION pgcounters.bucket_date(p_value timestamptz, p_period text, p_zone text)
RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc(p_period, p_value AT TIME ZONE p_zone)::date
$$;

-- The key part of a day, week or month of a wall-clock time (already local).
CREATE FUNCTION pgcounters.bucket_date(p_value timestamp, p_period text, p_zone text)
RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc(p_period, p_value)::date
$$;

-- The key part of a day, week or month of a date (its own day).
CREATE FUNCTION pgcounters.bucket_date(p_value date, p_period text, p_zone text)
RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc(p_period, p_value::timestamp)::date
$$;

-- The key part of a period that starts at p_start: the local date for a day, week
-- or month, the UTC instant for an hour (fixed width: its text order is time order).
CREATE FUNCTION pgcounters.bucket_text(p_period text, p_zone text, p_start timestamptz)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_period = 'hour'
                THEN to_char(p_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                ELSE to_char(p_start AT TIME ZONE p_zone, 'YYYY-MM-DD') END
$$;

-- The key part of an hour: the instant the hour (in p_zone: the two 02:00 hours of
-- a night when clocks go back are two hours) starts at, in UTC.
CREATE FUNCTION pgcounters.bucket_hour(p_value timestamptz, p_zone text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT pgcounters.bucket_text('hour', p_zone, date_trunc('hour', p_value, p_zone))
$$;

-- The key part of the hour of a wall-clock time in p_zone.
CREATE FUNCTION pgcounters.bucket_hour(p_value timestamp, p_zone text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT pgcounters.bucket_hour(p_value AT TIME ZONE p_zone, p_zone)
$$;

-- The key part of the first hour of a date in p_zone.
CREATE FUNCTION pgcounters.bucket_hour(p_value date, p_zone text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT pgcounters.bucket_hour(p_value::timestamp AT TIME ZONE p_zone, p_zone)
$$;

-- The periods whose start lies in [p_from, p_to), in time order: the instant each
-- starts at and its key part. Days, weeks and months step in local time (a day
-- when clocks change has 23 or 25 hours); hours are the distinct hours of p_zone.
CREATE FUNCTION pgcounters.bucket_periods(
    p_period text, p_zone text, p_from timestamptz, p_to timestamptz)
RETURNS TABLE (period_start timestamptz, bucket text)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT s.start, pgcounters.bucket_text(p_period, p_zone, s.start)
      FROM (SELECT l AT TIME ZONE p_zone AS start
              FROM generate_series(date_trunc(p_period, p_from AT TIME ZONE p_zone),
                                   p_to AT TIME ZONE p_zone,
                                   ('1 ' || p_period)::interval) AS l
             WHERE p_period <> 'hour'
            UNION
            SELECT date_trunc('hour', x, p_zone)
              FROM generate_series(date_trunc('hour', p_from, p_zone), p_to,
                                   interval '15 minutes') AS x
             WHERE p_period = 'hour') AS s
     WHERE s.start >= p_from AND s.start < p_to
     ORDER BY s.start
$$;

-- The start of the first period kept when p_keep periods are (the current one
-- included); -infinity when all are (p_keep NULL). The current period is the one
-- of the clock: the setting pgcounters.now when set (as for quotas), else now().
CREATE FUNCTION pgcounters.bucket_horizon(p_period text, p_zone text, p_keep integer)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_keep IS NULL THEN '-infinity'::timestamptz
        WHEN p_period = 'hour'
            THEN date_trunc('hour', c.now, p_zone) - (p_keep - 1) * interval '1 hour'
        ELSE (date_trunc(p_period, c.now AT TIME ZONE p_zone)
              - (p_keep - 1) * ('1 ' || p_period)::interval) AT TIME ZONE p_zone
    END
      FROM (SELECT coalesce(nullif(current_setting('pgcounters.now', true), '')::timestamptz,
                            now()) AS now) AS c
$$;

-- The key part of the first period a counter keeps when it counts per period and keeps a
-- number of periods (its recorded spec's keep): the period of the clock (the setting
-- pgcounters.now when set, else now()) and the keep - 1 before it. '' for every other
-- counter: every key of it is kept. Read with _kept.
CREATE FUNCTION pgcounters._first_kept(p_target integer) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_def jsonb;
BEGIN
    SELECT s.definition -> 'bucket' INTO v_def
      FROM pgcounters.targets AS t JOIN pgcounters.specs AS s ON s.name = t.name
     WHERE t.id = p_target;
    IF jsonb_typeof(v_def -> 'keep') IS DISTINCT FROM 'number' THEN
        RETURN '';
    END IF;
    RETURN pgcounters.bucket_text(v_def ->> 'period', v_def ->> 'time_zone',
               pgcounters.bucket_horizon(v_def ->> 'period', v_def ->> 'time_zone',
                                         (v_def ->> 'keep')::integer));
END;
$$;

-- Whether a key is in the periods its counter keeps: p_period is the key's last part (its
-- period, NULL for the empty key), p_first_kept _first_kept of the counter. A period's key
-- part is of fixed width, so its order as text in byte order is the order of time. Every
-- key is kept when p_first_kept is ''. Each argument is used once: the planner inlines it
-- whatever the caller passes.
CREATE FUNCTION pgcounters._kept(p_period text, p_first_kept text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(p_period, '') COLLATE "C" >= p_first_kept COLLATE "C"
$$;

-- The periods of a counter counted per period, from its recorded spec: its
-- period, zone and kept periods (NULL: all), the first period kept. Refused
-- (PC003) for an unknown counter, (PC002) for one not counted per period.
CREATE FUNCTION pgcounters._bucket(p_name text, OUT period text, OUT zone text,
    OUT keep integer, OUT horizon timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_def jsonb;
BEGIN
    PERFORM pgcounters._target(p_name);
    SELECT s.definition -> 'bucket' INTO v_def FROM pgcounters.specs AS s WHERE s.name = p_name;
    IF v_def IS NULL OR jsonb_typeof(v_def) <> 'object' THEN
        RAISE EXCEPTION 'counter % is not counted per period (it has no bucket)', p_name
            USING ERRCODE = 'PC002';
    END IF;
    period := v_def ->> 'period';
    zone := v_def ->> 'time_zone';
    keep := (v_def ->> 'keep')::integer;
    horizon := pgcounters.bucket_horizon(period, zone, keep);
END;
$$;

-- Refuse (PCT01) a range that is not one: both ends given, from before to, and at
-- most 100000 periods between them; true for one that is.
CREATE FUNCTION pgcounters._check_range(p_period text, p_from timestamptz, p_to timestamptz)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_longest interval := CASE p_period WHEN 'hour' THEN interval '100000 hours'
                                        WHEN 'week' THEN interval '700000 days'
                                        WHEN 'month' THEN interval '3100000 days'
                                        ELSE interval '100000 days' END;
BEGIN
    IF p_from IS NULL OR p_to IS NULL OR NOT isfinite(p_from) OR NOT isfinite(p_to) THEN
        RAISE EXCEPTION 'a range needs a finite start and end, got % to %',
            coalesce(p_from::text, 'NULL'), coalesce(p_to::text, 'NULL')
            USING ERRCODE = 'PCT01';
    END IF;
    IF p_from > p_to THEN
        RAISE EXCEPTION 'a range starts before it ends, got % to %', p_from, p_to
            USING ERRCODE = 'PCT01';
    END IF;
    IF p_to - p_from > v_longest THEN
        RAISE EXCEPTION 'a range spans at most 100000 periods' USING ERRCODE = 'PCT01';
    END IF;
    RETURN true;
END;
$$;

-- The key of a counter counted per period without its period part, canonical.
CREATE FUNCTION pgcounters._bucket_prefix(p_target pgcounters.targets, p_key text[])
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_target pgcounters.targets := p_target;
    v_parts integer := array_length(p_target.key_types, 1);
BEGIN
    v_target.key_types := p_target.key_types[1:v_parts - 1];
    IF coalesce(array_length(p_key, 1), 0) = 0 AND v_parts = 1 THEN
        RETURN '{}';
    END IF;
    RETURN pgcounters._canonical_key(v_target, p_key);
END;
$$;

-- Exact values (stored + pending, one snapshot) of some keys of a counter; p_keys
-- are the texts of the keys' arrays, as the queues keep them. Each key is looked up
-- in the indexes of the counters and of the queues. On a hot standby the logged
-- queue only (and an unlogged counter is refused, PCR01). Refused while the counter
-- is backfilled.
CREATE FUNCTION pgcounters._exact_values(p_target pgcounters.targets, p_keys text[])
RETURNS TABLE (key text[], value bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM pgcounters._backfilling(p_target.id);
    IF NOT pg_is_in_recovery() THEN
        RETURN QUERY
            SELECT k.k::text[],
                   (coalesce((SELECT c.value FROM pgcounters.counters AS c
                               WHERE c.target_id = p_target.id AND c.key = k.k::text[]), 0)
                  + coalesce((SELECT sum(q.delta) FROM pgcounters.queue AS q
                               WHERE q.target_id = p_target.id AND q.key = k.k), 0)
                  + coalesce((SELECT sum(q.delta) FROM pgcounters.queue_unlogged AS q
                               WHERE q.target_id = p_target.id AND q.key = k.k), 0))::bigint
              FROM unnest(p_keys) AS k(k);
    ELSIF p_target.mode = 'unlogged' THEN
        RAISE EXCEPTION 'counter % is unlogged: its pending deltas exist only on the primary, '
                        'read it there (its stored value is readable here)', p_target.name
            USING ERRCODE = 'PCR01';
    ELSE
        RETURN QUERY
            SELECT k.k::text[],
                   (coalesce((SELECT c.value FROM pgcounters.counters AS c
                               WHERE c.target_id = p_target.id AND c.key = k.k::text[]), 0)
                  + coalesce((SELECT sum(q.delta) FROM pgcounters.queue AS q
                               WHERE q.target_id = p_target.id AND q.key = k.k), 0))::bigint
              FROM unnest(p_keys) AS k(k);
    END IF;
END;
$$;

-- One value per period of [p_from, p_to) for one key (without its period part) of a
-- counter counted per period, zero-filled, in time order: exact (stored + pending,
-- one snapshot). Periods before the first one kept read 0.
CREATE FUNCTION pgcounters.get_series(p_name text, p_key text[], p_from timestamptz,
    p_to timestamptz)
RETURNS TABLE (period_start timestamptz, value bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_target pgcounters.targets;
    v_period text;
    v_zone text;
    v_keep integer;
    v_horizon timestamptz;
    v_prefix text[];
BEGIN
    v_target := pgcounters._target(p_name);
    SELECT * INTO v_period, v_zone, v_keep, v_horizon FROM pgcounters._bucket(p_name);
    v_prefix := pgcounters._bucket_prefix(v_target, p_key);
    PERFORM pgcounters._check_range(v_period, p_from, p_to);
    RETURN QUERY
        WITH p AS MATERIALIZED (
            SELECT x.period_start AS s, (v_prefix || x.bucket)::text AS k
              FROM pgcounters.bucket_periods(v_period, v_zone, p_from, p_to) AS x),
        v AS (SELECT e.key::text AS k, e.value
                FROM pgcounters._exact_values(v_target,
                         ARRAY(SELECT p.k FROM p WHERE p.s >= v_horizon)) AS e)
        SELECT p.s, CASE WHEN p.s >= v_horizon THEN coalesce(v.value, 0) ELSE 0 END::bigint
          FROM p LEFT JOIN v ON v.k = p.k
         ORDER BY p.s;
END;
$$;

-- The exact value of one key (without its period part) of a counter counted per
-- period over the periods of [p_from, p_to): stored + pending, one snapshot.
CREATE FUNCTION pgcounters.get_range(p_name text, p_key text[], p_from timestamptz,
    p_to timestamptz) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_target pgcounters.targets;
    v_period text;
    v_zone text;
    v_keep integer;
    v_horizon timestamptz;
    v_prefix text[];
BEGIN
    v_target := pgcounters._target(p_name);
    SELECT * INTO v_period, v_zone, v_keep, v_horizon FROM pgcounters._bucket(p_name);
    v_prefix := pgcounters._bucket_prefix(v_target, p_key);
    PERFORM pgcounters._check_range(v_period, p_from, p_to);
    RETURN (SELECT coalesce(sum(e.value), 0)::bigint
              FROM pgcounters._exact_values(v_target,
                       ARRAY(SELECT (v_prefix || x.bucket)::text
                               FROM pgcounters.bucket_periods(v_period, v_zone,
                                        greatest(p_from, v_horizon), p_to) AS x)) AS e);
END;
$$;

-- The p_n keys (without their period part) with the highest exact values over the
-- periods of [p_from, p_to) (stored + pending, one snapshot), highest first, ties
-- by key. Reads every value of the counter in the range: for dashboards.
CREATE FUNCTION pgcounters.top_range(p_name text, p_from timestamptz, p_to timestamptz,
    p_n bigint DEFAULT 10)
RETURNS TABLE (key text[], value bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_target pgcounters.targets;
    v_period text;
    v_zone text;
    v_keep integer;
    v_horizon timestamptz;
    v_part integer;
    v_buckets text[];
BEGIN
    v_target := pgcounters._target(p_name);
    SELECT * INTO v_period, v_zone, v_keep, v_horizon FROM pgcounters._bucket(p_name);
    v_part := array_length(v_target.key_types, 1);
    PERFORM pgcounters._check_range(v_period, p_from, p_to);
    IF p_n IS NULL OR p_n < 0 THEN
        RAISE EXCEPTION 'n must be zero or more, got %', coalesce(p_n::text, 'NULL')
            USING ERRCODE = 'PCT01';
    END IF;
    PERFORM pgcounters._backfilling(v_target.id);
    v_buckets := ARRAY(SELECT x.bucket FROM pgcounters.bucket_periods(v_period, v_zone,
                           greatest(p_from, v_horizon), p_to) AS x);
    IF pg_is_in_recovery() AND v_target.mode = 'unlogged' THEN
        RAISE EXCEPTION 'counter % is unlogged: its pending deltas exist only on the primary, '
                        'read it there', p_name USING ERRCODE = 'PCR01';
    ELSIF pg_is_in_recovery() THEN
        RETURN QUERY
            SELECT u.k[1:v_part - 1], sum(u.v)::bigint FROM (
                SELECT c.key AS k, c.value AS v FROM pgcounters.counters AS c
                 WHERE c.target_id = v_target.id AND c.key[v_part] = ANY (v_buckets)
                UNION ALL
                SELECT q.key::text[], q.delta FROM pgcounters.queue AS q
                 WHERE q.target_id = v_target.id
                   AND (q.key::text[])[v_part] = ANY (v_buckets)) AS u
             GROUP BY 1 ORDER BY 2 DESC, u.k[1:v_part - 1] COLLATE "C" LIMIT p_n;
    ELSE
        RETURN QUERY
            SELECT u.k[1:v_part - 1], sum(u.v)::bigint FROM (
                SELECT c.key AS k, c.value AS v FROM pgcounters.counters AS c
                 WHERE c.target_id = v_target.id AND c.key[v_part] = ANY (v_buckets)
                UNION ALL
                SELECT q.key::text[], q.delta FROM pgcounters.queue AS q
                 WHERE q.target_id = v_target.id
                   AND (q.key::text[])[v_part] = ANY (v_buckets)
                UNION ALL
                SELECT q.key::text[], q.delta FROM pgcounters.queue_unlogged AS q
                 WHERE q.target_id = v_target.id
                   AND (q.key::text[])[v_part] = ANY (v_buckets)) AS u
             GROUP BY 1 ORDER BY 2 DESC, u.k[1:v_part - 1] COLLATE "C" LIMIT p_n;
    END IF;
END;
$$;

-- The exact values of one key (p_key, without its period part) of a counter per period
-- over a range of its periods, from the period whose key part is p_first to the one
-- whose key part is p_last, stored + pending, one snapshot: one row per period that has
-- a value (its key part, its value). Each table is read in one index range scan: a
-- period's key part is of fixed width (digits and separators at the same places), so
-- its order as text is the order of time under any collation, and the keys of one key's
-- periods lie between the two keys of those periods. The queues keep a key as the text
-- of its array, which may interleave with other keys' under a collation: those are left
-- out by their head. Periods no longer kept are left out. One row of NULLs (and no
-- other) when the counter's periods are no longer p_bucket (the recorded definition the
-- key parts were made from). Refused while the counter is backfilled; on a hot standby the
-- logged queue only (an unlogged counter is refused, PCR01). Planned once a session
-- (generic plan): the statement is the same for every range.
CREATE FUNCTION pgcounters._range_values(p_target integer, p_name text, p_bucket jsonb,
    p_key text[], p_first text, p_last text)
RETURNS TABLE (bucket text, value bigint)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_def jsonb;
    v_first_kept text;
    v_head text := rtrim((p_key || '{x}'::text[])::text, 'x}');
    v_low text[] := p_key || p_first;
    v_high text[] := p_key || p_last;
    v_part integer := coalesce(array_length(p_key, 1), 0) + 1;
BEGIN
    SELECT s.definition -> 'bucket' INTO v_def FROM pgcounters.specs AS s
     WHERE s.name = p_name;
    IF v_def IS DISTINCT FROM p_bucket THEN
        RETURN QUERY SELECT NULL::text, NULL::bigint;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pgcounters.backfills AS f WHERE f.name = p_name) THEN
        PERFORM pgcounters._backfilling(p_target);
    END IF;
    v_first_kept := pgcounters._first_kept(p_target);
    IF NOT pg_is_in_recovery() THEN
        RETURN QUERY
            SELECT u.b, sum(u.v)::bigint FROM (
                SELECT c.key[v_part] AS b, c.value AS v FROM pgcounters.counters AS c
                 WHERE c.target_id = p_target AND c.key BETWEEN v_low AND v_high
                UNION ALL
                SELECT (q.key::text[])[v_part], q.delta FROM pgcounters.queue AS q
                 WHERE q.target_id = p_target AND q.key BETWEEN v_low::text AND v_high::text
                   AND starts_with(q.key, v_head)
                UNION ALL
                SELECT (q.key::text[])[v_part], q.delta FROM pgcounters.queue_unlogged AS q
                 WHERE q.target_id = p_target AND q.key BETWEEN v_low::text AND v_high::text
                   AND starts_with(q.key, v_head)) AS u
             WHERE pgcounters._kept(u.b, v_first_kept)
             GROUP BY u.b;
    ELSIF (SELECT t.mode FROM pgcounters.targets AS t WHERE t.id = p_target) = 'unlogged' THEN
        RAISE EXCEPTION 'counter % is unlogged: its pending deltas exist only on the primary, '
                        'read it there (its stored value is readable here)', p_name
            USING ERRCODE = 'PCR01';
    ELSE
        RETURN QUERY
            SELECT u.b, sum(u.v)::bigint FROM (
                SELECT c.key[v_part] AS b, c.value AS v FROM pgcounters.counters AS c
                 WHERE c.target_id = p_target AND c.key BETWEEN v_low AND v_high
                UNION ALL
                SELECT (q.key::text[])[v_part], q.delta FROM pgcounters.queue AS q
                 WHERE q.target_id = p_target AND q.key BETWEEN v_low::text AND v_high::text
                   AND starts_with(q.key, v_head)) AS u
             WHERE pgcounters._kept(u.b, v_first_kept)
             GROUP BY u.b;
    END IF;
END;
$$;

-- The exact value of one key of a counter per period over a range of its periods, read
-- as _range_values reads (one index range scan of each table, one snapshot, planned once
-- a session); NULL when the counter's periods are no longer p_bucket.
CREATE FUNCTION pgcounters._range_sum(p_target integer, p_name text, p_bucket jsonb,
    p_key text[], p_first text, p_last text)
RETURNS bigint
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_def jsonb;
    v_first_kept text;
    v_sum bigint;
    v_low text[] := p_key || p_first;
    v_high text[] := p_key || p_last;
BEGIN
    SELECT s.definition -> 'bucket' INTO v_def FROM pgcounters.specs AS s
     WHERE s.name = p_name;
    IF v_def IS DISTINCT FROM p_bucket THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM pgcounters.backfills AS f WHERE f.name = p_name) THEN
        PERFORM pgcounters._backfilling(p_target);
    END IF;
    -- the periods no longer kept are left out: the range starts at the first kept
    v_first_kept := pgcounters._first_kept(p_target);
    IF NOT pgcounters._kept(p_first, v_first_kept) THEN
        v_low := p_key || v_first_kept;
    END IF;
    IF NOT pg_is_in_recovery() THEN
        SELECT coalesce((SELECT sum(c.value) FROM pgcounters.counters AS c
                          WHERE c.target_id = p_target AND c.key BETWEEN v_low AND v_high), 0)
             + coalesce((SELECT sum(q.delta) FROM pgcounters.queue AS q
                          WHERE q.target_id = p_target
                            AND q.key BETWEEN v_low::text AND v_high::text
                            AND starts_with(q.key, rtrim((p_key || '{x}'::text[])::text, 'x}'))), 0)
             + coalesce((SELECT sum(q.delta) FROM pgcounters.queue_unlogged AS q
                          WHERE q.target_id = p_target
                            AND q.key BETWEEN v_low::text AND v_high::text
                            AND starts_with(q.key, rtrim((p_key || '{x}'::text[])::text, 'x}'))), 0)
          INTO v_sum;
    ELSIF (SELECT t.mode FROM pgcounters.targets AS t WHERE t.id = p_target) = 'unlogged' THEN
        RAISE EXCEPTION 'counter % is unlogged: its pending deltas exist only on the primary, '
                        'read it there (its stored value is readable here)', p_name
            USING ERRCODE = 'PCR01';
    ELSE
        SELECT coalesce((SELECT sum(c.value) FROM pgcounters.counters AS c
                          WHERE c.target_id = p_target AND c.key BETWEEN v_low AND v_high), 0)
             + coalesce((SELECT sum(q.delta) FROM pgcounters.queue AS q
                          WHERE q.target_id = p_target
                            AND q.key BETWEEN v_low::text AND v_high::text
                            AND starts_with(q.key, rtrim((p_key || '{x}'::text[])::text, 'x}'))), 0)
          INTO v_sum;
    END IF;
    RETURN v_sum;
END;
$$;

-- Retention: delete at most p_limit stored values of periods before the first one
-- kept, of every counter that keeps a number of periods. Rows another transaction
-- holds (a drain, a direct write) are skipped, never waited for: the next call takes
-- them. Deltas of such periods still queued are applied by the drain, and their rows
-- deleted by a later call; no read counts them (reads start at the first period kept).
-- Returns the number of values deleted.
CREATE FUNCTION pgcounters.drop_expired_buckets(p_limit integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    s record;
    v_first text;
    v_left bigint := p_limit;
    v_done bigint;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit must be a positive number of values, got %',
            coalesce(p_limit::text, 'NULL') USING ERRCODE = 'PCT01';
    END IF;
    FOR s IN
        SELECT t.id, array_length(t.key_types, 1) AS parts,
               sp.definition -> 'bucket' ->> 'period' AS period,
               sp.definition -> 'bucket' ->> 'time_zone' AS zone,
               (sp.definition -> 'bucket' ->> 'keep')::integer AS keep
          FROM pgcounters.specs AS sp JOIN pgcounters.targets AS t ON t.name = sp.name
         WHERE jsonb_typeof(sp.definition -> 'bucket' -> 'keep') = 'number'
         ORDER BY t.id
    LOOP
        EXIT WHEN v_left <= 0;
        v_first := pgcounters._first_kept(s.id);
        DELETE FROM pgcounters.counters AS c
         WHERE c.target_id = s.id
           AND c.key IN (SELECT x.key FROM pgcounters.counters AS x
                          WHERE x.target_id = s.id
                            AND NOT pgcounters._kept(x.key[cardinality(x.key)], v_first)
                          ORDER BY x.key LIMIT v_left FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS v_done = ROW_COUNT;
        v_left := v_left - v_done;
    END LOOP;
    RETURN p_limit - v_left;
END;
$$;


-- =============================================================================
-- Quotas and rate limits
-- =============================================================================
-- A quota is a named budget of calls per subject (a customer, a user, an API
-- key, an IP address: any non-blank string) and per window of time. A window is
-- a calendar day (the default), week or month in a time zone, correct across
-- DST changes, or a fixed number of seconds aligned to the Unix epoch.
--
-- Limits are valid over time ranges (tstzrange); an exclusion constraint keeps
-- two limits of the same quota and subject from overlapping. A subject without
-- a limit of its own gets the quota's default limit (none: no call allowed).
--
-- register_call decides inside ONE upsert of the usage row: the SET clause sees
-- the current row, locked, and computes the decision from it. A decision read
-- from a CTE or a prior SELECT lets concurrent callers through past the limit.
--
-- The quotas' clock is now(), unless the setting pgcounters.now holds an
-- instant (SET pgcounters.now = '2026-03-10 12:34:56+00'), so that windows can
-- be exercised at chosen instants.
--
-- SQLSTATEs of class PC, subclass Q: PCQ01 unknown quota, PCQ02 bad quota
-- definition, PCQ03 quota redefined with another window, PCQ04 bad limit,
-- PCQ05 overlapping limits, PCQ06 bad subject, PCQ07 bad cost, PCQ08 bad report
-- or purge argument.

-- The exclusion constraint of quota_limits compares quota_id and subject with
-- "=" in a GiST index: btree_gist (a trusted extension) provides those operator classes.
-- It lives in a schema of its own, so that its functions do not swamp pgcounters' own
-- (`\df pgcounters.*`).
CREATE SCHEMA IF NOT EXISTS pgcounters_btree_gist;
CREATE EXTENSION IF NOT EXISTS btree_gist WITH SCHEMA pgcounters_btree_gist;

-- One row per quota: its window and default limit.
CREATE TABLE pgcounters.quotas (
    id             integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text NOT NULL UNIQUE
                   CONSTRAINT quotas_name_format
                   CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_.:/-]{0,199}$'),
    -- 'day', 'week', 'month': calendar windows in time_zone; 'fixed': window_seconds;
    -- 'sliding': any span of window_seconds, counted in buckets of bucket_seconds
    period         text NOT NULL DEFAULT 'day'
                   CONSTRAINT quotas_period_known
                   CHECK (period IN ('day', 'week', 'month', 'fixed', 'sliding')),
    window_seconds bigint,
    time_zone      text NOT NULL DEFAULT 'UTC',
    -- the limit of subjects without a limit of their own; NULL: they get no call
    default_limit  bigint
                   CONSTRAINT quotas_default_limit_positive CHECK (default_limit > 0),
    -- keep one row per call in quota_log (off by default)
    log_calls      boolean NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- the width of a sliding window's buckets, in seconds
    bucket_seconds bigint,
    CONSTRAINT quotas_window_complete CHECK (
        (period IN ('fixed', 'sliding')) = (window_seconds IS NOT NULL)
        AND coalesce(window_seconds, 1) > 0),
    CONSTRAINT quotas_buckets CHECK (
        (period = 'sliding') = (bucket_seconds IS NOT NULL)
        AND (bucket_seconds IS NULL
             OR (bucket_seconds > 0 AND window_seconds % bucket_seconds = 0
                 AND window_seconds / bucket_seconds <= 1000)))
);

-- Limits per subject, valid over a time range. No two limits of one quota and
-- subject overlap. The GiST index of the constraint also finds the limit in
-- force for (quota, subject, instant).
CREATE TABLE pgcounters.quota_limits (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    quota_id  integer NOT NULL REFERENCES pgcounters.quotas (id) ON DELETE CASCADE,
    subject   text NOT NULL
              CONSTRAINT quota_limits_subject_format
              CHECK (btrim(subject) <> '' AND length(subject) <= 1000),
    calls     bigint NOT NULL CONSTRAINT quota_limits_calls_positive CHECK (calls > 0),
    valid     tstzrange NOT NULL DEFAULT '[,)'
              CONSTRAINT quota_limits_valid_not_empty CHECK (NOT isempty(valid)),
    CONSTRAINT quota_limits_no_overlap
        EXCLUDE USING gist (quota_id WITH =, subject WITH =, valid WITH &&)
);

-- One row per (quota, subject, window): what the subject used and tried.
-- Only columns outside every index change on a call, and fillfactor 60 leaves
-- room on the page for the new row version, so the updates stay HOT (no index
-- write, pruned in the page). No foreign key: an FK check would lock the quota
-- row on every call.
CREATE TABLE pgcounters.quota_usage (
    quota_id     integer NOT NULL,
    subject      text NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    call_limit   bigint NOT NULL,   -- the limit in force at the latest call
    used         bigint NOT NULL,   -- units granted (a grant never exceeds the limit)
    attempts     bigint NOT NULL,   -- calls made, granted or not
    rejected     bigint NOT NULL,   -- calls refused
    last_allowed boolean NOT NULL,  -- the decision of the latest call
    PRIMARY KEY (quota_id, subject, window_start)
) WITH (fillfactor = 60);

-- purge of old windows
CREATE INDEX quota_usage_window_end ON pgcounters.quota_usage (window_end);

-- The optional request log: one row per call of a quota whose log_calls is on,
-- with request details as jsonb. Append-only and time ordered, so the purge
-- index is a BRIN (tiny, cheap to maintain).
CREATE TABLE pgcounters.quota_log (
    quota_id integer NOT NULL,
    subject  text NOT NULL,
    at       timestamptz NOT NULL,
    cost     bigint NOT NULL,
    allowed  boolean NOT NULL,
    details  jsonb
);

-- The log of one subject, in time order.
CREATE INDEX quota_log_subject ON pgcounters.quota_log (quota_id, subject, at);

-- Purge of old log rows.
CREATE INDEX quota_log_at ON pgcounters.quota_log USING brin (at);

-- One row per (sliding quota, subject): its buckets, newest first. granted[i],
-- tried[i] and refused[i] are the units granted, the calls made and the calls
-- refused in bucket head - i + 1. Updates leave the indexed columns alone
-- except expires_at, which moves once per bucket.
CREATE TABLE pgcounters.quota_sliding_usage (
    quota_id     integer NOT NULL,
    subject      text NOT NULL,
    head         bigint NOT NULL,        -- the newest bucket: floor(epoch / bucket_seconds)
    expires_at   timestamptz NOT NULL,   -- when every bucket has left the window
    granted      bigint[] NOT NULL,
    tried        bigint[] NOT NULL,
    refused      bigint[] NOT NULL,
    call_limit   bigint NOT NULL,        -- the limit in force at the latest call
    last_allowed boolean NOT NULL,       -- the decision of the latest call
    PRIMARY KEY (quota_id, subject)
) WITH (fillfactor = 60);

-- purge of idle subjects
CREATE INDEX quota_sliding_usage_expires_at ON pgcounters.quota_sliding_usage (expires_at);

-- The window [start, end) of a quota that contains the instant p_at. Calendar
-- windows are computed on the local wall clock of p_time_zone and converted
-- back, so a day is 23 or 25 hours long on DST changes; the session's TimeZone
-- setting plays no part. Fixed windows are aligned to the Unix epoch. Both are
-- single expressions in SQL functions, which the planner inlines; they are
-- STABLE, not IMMUTABLE, because extract() from a timestamptz is STABLE (a
-- function declared more strictly than its body is not inlined).
CREATE FUNCTION pgcounters.quota_window_start(
    p_period text, p_window_seconds bigint, p_time_zone text, p_at timestamptz
) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_period = 'fixed'
                THEN to_timestamp(floor(extract(epoch FROM p_at) / p_window_seconds)
                                  * p_window_seconds)
                ELSE date_trunc(p_period, p_at AT TIME ZONE p_time_zone) AT TIME ZONE p_time_zone
           END
$$;

-- The end of the window that starts at p_start.
CREATE FUNCTION pgcounters.quota_window_end(
    p_period text, p_window_seconds bigint, p_time_zone text, p_start timestamptz
) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE p_period
           WHEN 'fixed' THEN p_start + make_interval(secs => p_window_seconds)
           WHEN 'day' THEN ((p_start AT TIME ZONE p_time_zone) + interval '1 day')
                           AT TIME ZONE p_time_zone
           WHEN 'week' THEN ((p_start AT TIME ZONE p_time_zone) + interval '1 week')
                            AT TIME ZONE p_time_zone
           ELSE ((p_start AT TIME ZONE p_time_zone) + interval '1 month') AT TIME ZONE p_time_zone
           END
$$;

-- The quota of a name, or PCQ01.
CREATE FUNCTION pgcounters._quota(p_name text) RETURNS pgcounters.quotas
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v pgcounters.quotas;
BEGIN
    SELECT * INTO v FROM pgcounters.quotas WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown quota %', coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'PCQ01';
    END IF;
    RETURN v;
END;
$$;

-- Refuse (PCQ06) a blank or overlong subject.
CREATE FUNCTION pgcounters._check_subject(p_subject text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_subject IS NULL OR btrim(p_subject) = '' OR length(p_subject) > 1000 THEN
        RAISE EXCEPTION 'a quota subject must be a non-blank string of at most 1000 characters, got %',
            coalesce(quote_literal(left(p_subject, 40)), 'NULL')
            USING ERRCODE = 'PCQ06';
    END IF;
END;
$$;

-- p_ring moved p_by buckets on: the p_by newest are new (zero), as many of the
-- oldest leave.
CREATE FUNCTION pgcounters._ring_shift(p_ring bigint[], p_by bigint) RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_by <= 0 THEN p_ring
                WHEN p_by >= cardinality(p_ring)
                THEN array_fill(0::bigint, ARRAY[cardinality(p_ring)])
                ELSE array_fill(0::bigint, ARRAY[p_by::integer])
                     || p_ring[1 : cardinality(p_ring) - p_by::integer]
           END
$$;

-- The buckets of a subject after one call in bucket p_bucket costing p_cost
-- under p_limit, and the decision. A call from a bucket older than p_head (a
-- transaction that started earlier than one that has called already) is
-- counted in p_head: later, never earlier, than it happened.
CREATE FUNCTION pgcounters._sliding_step(
    p_head bigint,
    p_granted bigint[],
    p_tried bigint[],
    p_refused bigint[],
    p_bucket bigint,
    p_cost bigint,
    p_limit bigint,
    OUT head bigint,
    OUT granted bigint[],
    OUT tried bigint[],
    OUT refused bigint[],
    OUT allowed boolean
)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    head := greatest(p_head, p_bucket);
    granted := pgcounters._ring_shift(p_granted, head - p_head);
    tried := pgcounters._ring_shift(p_tried, head - p_head);
    refused := pgcounters._ring_shift(p_refused, head - p_head);
    allowed := (SELECT coalesce(sum(x), 0) FROM unnest(granted) AS x) + p_cost <= p_limit;
    tried[1] := tried[1] + 1;
    IF allowed THEN
        granted[1] := granted[1] + p_cost;
    ELSE
        refused[1] := refused[1] + 1;
    END IF;
END;
$$;

-- Seconds from p_at until the start of the first bucket at which a call of
-- p_cost fits under p_limit again (p_allowed: until the oldest granted units
-- leave the window), given the buckets granted (newest first, newest p_head).
CREATE FUNCTION pgcounters._sliding_retry(
    p_granted bigint[], p_head bigint, p_bucket_seconds bigint, p_cost bigint,
    p_limit bigint, p_allowed boolean, p_at timestamptz
) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_n integer := cardinality(p_granted);
    v_left numeric := (SELECT coalesce(sum(x), 0) FROM unnest(p_granted) AS x);
    v_j integer := 1;
BEGIN
    -- after j more buckets, the j oldest have left the window
    WHILE v_j < v_n LOOP
        v_left := v_left - p_granted[v_n - v_j + 1];
        EXIT WHEN (p_allowed AND p_granted[v_n - v_j + 1] > 0)
               OR (NOT p_allowed AND v_left + p_cost <= p_limit);
        v_j := v_j + 1;
    END LOOP;
    RETURN greatest(extract(epoch FROM to_timestamp((p_head + v_j) * p_bucket_seconds) - p_at),
                    0)::double precision;
END;
$$;

-- Declare a quota, or change the default limit and logging of an existing one.
-- Redefining the window of an existing quota is refused (PCQ03): the usage
-- rows already counted belong to the old windows.
CREATE FUNCTION pgcounters.define_quota(
    p_name text,
    p_default_limit bigint DEFAULT NULL,
    p_period text DEFAULT 'day',
    p_window_seconds bigint DEFAULT NULL,
    p_time_zone text DEFAULT 'UTC',
    p_log_calls boolean DEFAULT false,
    p_bucket_seconds bigint DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_zone text;
    v_buckets bigint := p_bucket_seconds;
    v_existing pgcounters.quotas;
    v_id integer;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z_][A-Za-z0-9_.:/-]{0,199}$' THEN
        RAISE EXCEPTION 'invalid quota name %: use 1-200 characters of letters, digits and '
            '_ . : / -, starting with a letter or _', coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'PCQ02';
    END IF;
    IF p_default_limit IS NOT NULL AND p_default_limit <= 0 THEN
        RAISE EXCEPTION 'the default limit of quota % must be positive (or NULL for none), got %',
            p_name, p_default_limit USING ERRCODE = 'PCQ04';
    END IF;
    IF p_period IS NULL OR p_period NOT IN ('day', 'week', 'month', 'fixed', 'sliding') THEN
        RAISE EXCEPTION 'the window of quota % must be day, week, month, fixed or sliding, got %',
            p_name, coalesce(p_period, 'NULL') USING ERRCODE = 'PCQ02';
    END IF;
    IF p_period <> 'sliding' AND p_bucket_seconds IS NOT NULL THEN
        RAISE EXCEPTION 'a % window of quota % takes no bucket width', p_period, p_name
            USING ERRCODE = 'PCQ02';
    END IF;
    IF p_period IN ('fixed', 'sliding') THEN
        IF p_window_seconds IS NULL OR p_window_seconds <= 0 THEN
            RAISE EXCEPTION 'a % window of quota % needs a positive number of seconds, got %',
                p_period, p_name, coalesce(p_window_seconds::text, 'NULL')
                USING ERRCODE = 'PCQ02';
        END IF;
        IF p_time_zone IS DISTINCT FROM 'UTC' AND p_time_zone IS NOT NULL THEN
            RAISE EXCEPTION '% windows of quota % are aligned to the Unix epoch and take no '
                'time zone (got %); time zones apply to day, week and month windows',
                p_period, p_name, quote_literal(p_time_zone) USING ERRCODE = 'PCQ02';
        END IF;
        v_zone := 'UTC';
        IF p_period = 'sliding' THEN
            -- by default 60 buckets, or the widest whole number of seconds below a
            -- sixtieth of the window that divides it
            IF v_buckets IS NULL THEN
                v_buckets := greatest(p_window_seconds / 60, 1);
                WHILE p_window_seconds % v_buckets <> 0 LOOP
                    v_buckets := v_buckets - 1;
                END LOOP;
            END IF;
            IF v_buckets <= 0 OR p_window_seconds % v_buckets <> 0
               OR p_window_seconds / v_buckets > 1000 THEN
                RAISE EXCEPTION 'the buckets of the sliding window of quota % must be a whole '
                    'number of seconds dividing its % seconds into at most 1000, got %',
                    p_name, p_window_seconds, v_buckets USING ERRCODE = 'PCQ02';
            END IF;
        END IF;
    ELSE
        IF p_window_seconds IS NOT NULL THEN
            RAISE EXCEPTION 'a % window of quota % takes no number of seconds', p_period, p_name
                USING ERRCODE = 'PCQ02';
        END IF;
        v_zone := coalesce(p_time_zone, 'UTC');
        -- IANA names only: PostgreSQL also accepts POSIX forms such as 'UTC+5',
        -- whose sign is the opposite of ISO 8601's
        IF v_zone <> 'UTC' AND NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = v_zone)
        THEN
            RAISE EXCEPTION 'unknown time zone % for quota %: use an IANA name such as '
                '''Europe/Berlin''', quote_literal(v_zone), p_name USING ERRCODE = 'PCQ02';
        END IF;
    END IF;

    INSERT INTO pgcounters.quotas
        (name, period, window_seconds, time_zone, default_limit, log_calls, bucket_seconds)
    VALUES (p_name, p_period, p_window_seconds, v_zone, p_default_limit,
            coalesce(p_log_calls, false), v_buckets)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN v_id;
    END IF;

    SELECT * INTO v_existing FROM pgcounters.quotas WHERE name = p_name FOR UPDATE;
    IF v_existing.period IS DISTINCT FROM p_period
       OR v_existing.window_seconds IS DISTINCT FROM p_window_seconds
       OR v_existing.time_zone IS DISTINCT FROM v_zone
       OR (p_bucket_seconds IS NOT NULL
           AND v_existing.bucket_seconds IS DISTINCT FROM p_bucket_seconds) THEN
        RAISE EXCEPTION 'quota % already exists with another window', p_name
            USING ERRCODE = 'PCQ03';
    END IF;
    UPDATE pgcounters.quotas
       SET default_limit = p_default_limit,
           log_calls = coalesce(p_log_calls, false)
     WHERE id = v_existing.id;
    RETURN v_existing.id;
END;
$$;

-- Forget a quota with its limits, usage and log.
CREATE FUNCTION pgcounters.drop_quota(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    DELETE FROM pgcounters.quotas WHERE name = p_name RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM pgcounters.quota_usage WHERE quota_id = v_id;
    DELETE FROM pgcounters.quota_sliding_usage WHERE quota_id = v_id;
    DELETE FROM pgcounters.quota_log WHERE quota_id = v_id;
    RETURN true;   -- quota_limits go by ON DELETE CASCADE
END;
$$;

-- A limit's time range as the command line prints it: -inf and inf for unbounded ends
-- (PostgreSQL's own text of an unbounded range is "(,)").
CREATE FUNCTION pgcounters._range_text(p_range tstzrange) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_range IS NULL THEN NULL
                ELSE format('[%s, %s)', coalesce(lower(p_range)::text, '-inf'),
                            coalesce(upper(p_range)::text, 'inf')) END
$$;

-- Give a subject a limit over [p_from, p_until) (NULL: unbounded). A range
-- that overlaps another limit of the same quota and subject is refused
-- (PCQ05) and nothing is written.
CREATE FUNCTION pgcounters.set_limit(
    p_quota text,
    p_subject text,
    p_calls bigint,
    p_from timestamptz DEFAULT NULL,
    p_until timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q pgcounters.quotas := pgcounters._quota(p_quota);
    v_range tstzrange;
    v_other tstzrange;
    v_id bigint;
BEGIN
    PERFORM pgcounters._check_subject(p_subject);
    IF p_calls IS NULL OR p_calls <= 0 THEN
        RAISE EXCEPTION 'a limit of quota % must be a positive number of calls, got %',
            p_quota, coalesce(p_calls::text, 'NULL') USING ERRCODE = 'PCQ04';
    END IF;
    IF p_from IS NOT NULL AND p_until IS NOT NULL AND p_until <= p_from THEN
        RAISE EXCEPTION 'a limit must end after it starts, got [%, %)', p_from, p_until
            USING ERRCODE = 'PCQ04';
    END IF;
    v_range := tstzrange(p_from, p_until, '[)');
    BEGIN
        INSERT INTO pgcounters.quota_limits (quota_id, subject, calls, valid)
        VALUES (q.id, p_subject, p_calls, v_range)
        RETURNING id INTO v_id;
    EXCEPTION WHEN exclusion_violation THEN
        SELECT valid INTO v_other FROM pgcounters.quota_limits
         WHERE quota_id = q.id AND subject = p_subject AND valid && v_range
         ORDER BY lower(valid) NULLS FIRST LIMIT 1;
        RAISE EXCEPTION 'the limit % of quota % for subject % overlaps the existing limit %',
            pgcounters._range_text(v_range), p_quota, quote_literal(p_subject),
            coalesce(pgcounters._range_text(v_other), '(concurrent)')
            USING ERRCODE = 'PCQ05';
    END;
    RETURN v_id;
END;
$$;

-- Remove limits of a subject: the one with id p_id, or all of them (p_id NULL).
-- Returns how many were removed.
CREATE FUNCTION pgcounters.remove_limits(p_quota text, p_subject text, p_id bigint DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    q pgcounters.quotas := pgcounters._quota(p_quota);
    v_n integer;
BEGIN
    PERFORM pgcounters._check_subject(p_subject);
    DELETE FROM pgcounters.quota_limits
     WHERE quota_id = q.id AND subject = p_subject AND (p_id IS NULL OR id = p_id);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- Register a call of p_subject costing p_cost in the window containing p_at
-- (the quotas' clock when NULL); returns whether it is allowed and the usage.
CREATE FUNCTION pgcounters.register_call(
    p_quota text,
    p_subject text,
    p_cost bigint DEFAULT 1,
    p_at timestamptz DEFAULT NULL,
    p_details jsonb DEFAULT NULL,
    p_async_commit boolean DEFAULT false,
    OUT allowed boolean,
    OUT used bigint,
    OUT attempts bigint,
    OUT call_limit bigint,
    OUT window_start timestamptz,
    OUT window_end timestamptz,
    OUT retry_after double precision
)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    -- p_at, else the clock: the setting pgcounters.now when set, else now()
    v_at timestamptz := coalesce(p_at, nullif(current_setting('pgcounters.now', true), '')::timestamptz,
                                 now());
    v_id integer;
    v_log boolean;
    v_period text;
    v_seconds bigint;
    v_zone text;
    v_limit bigint;
    v_width bigint;
    v_bucket bigint;
    v_zeros bigint[];
    v_first record;
    v_granted bigint[];
    v_head bigint;
BEGIN
    IF p_cost IS NULL OR p_cost <= 0 THEN
        RAISE EXCEPTION 'the cost of a call must be a positive number of units, got %',
            coalesce(p_cost::text, 'NULL') USING ERRCODE = 'PCQ07';
    END IF;
    IF p_subject IS NULL OR btrim(p_subject) = '' OR length(p_subject) > 1000 THEN
        PERFORM pgcounters._check_subject(p_subject);  -- raises PCQ06
    END IF;

    SELECT q.id, q.log_calls, q.period, q.window_seconds, q.time_zone, q.bucket_seconds,
           coalesce((SELECT l.calls FROM pgcounters.quota_limits AS l
                      WHERE l.quota_id = q.id AND l.subject = p_subject AND l.valid @> v_at),
                    q.default_limit, 0)
      INTO v_id, v_log, v_period, v_seconds, v_zone, v_width, v_limit
      FROM pgcounters.quotas AS q
     WHERE q.name = p_quota;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown quota %', coalesce(quote_literal(p_quota), 'NULL')
            USING ERRCODE = 'PCQ01';
    END IF;

    IF v_period = 'sliding' THEN
        v_bucket := floor(extract(epoch FROM v_at) / v_width)::bigint;
        v_zeros := array_fill(0::bigint, ARRAY[(v_seconds / v_width + 1)::integer]);
        v_first := pgcounters._sliding_step(
            v_bucket, v_zeros, v_zeros, v_zeros, v_bucket, p_cost, v_limit);
        -- the decision is made in the SET clause, from the row locked
        INSERT INTO pgcounters.quota_sliding_usage AS u
            (quota_id, subject, head, expires_at, granted, tried, refused,
             call_limit, last_allowed)
        VALUES (v_id, p_subject, v_bucket,
                to_timestamp((v_bucket + 1) * v_width + v_seconds),
                v_first.granted, v_first.tried, v_first.refused, v_limit, v_first.allowed)
        ON CONFLICT ON CONSTRAINT quota_sliding_usage_pkey DO UPDATE
           SET (head, expires_at, granted, tried, refused, call_limit, last_allowed) =
               (SELECT s.head, to_timestamp((s.head + 1) * v_width + v_seconds),
                       s.granted, s.tried, s.refused, excluded.call_limit, s.allowed
                  FROM pgcounters._sliding_step(u.head, u.granted, u.tried, u.refused,
                                                excluded.head, p_cost,
                                                excluded.call_limit) AS s)
        RETURNING u.last_allowed, u.granted, u.head, u.call_limit,
                  (SELECT sum(x) FROM unnest(u.tried) AS x)::bigint
             INTO allowed, v_granted, v_head, call_limit, attempts;
        used := (SELECT sum(x) FROM unnest(v_granted) AS x)::bigint;
        window_start := to_timestamp((v_head - v_seconds / v_width) * v_width);
        window_end := to_timestamp((v_head + 1) * v_width);
        retry_after := pgcounters._sliding_retry(
            v_granted, v_head, v_width, p_cost, call_limit, allowed, v_at);
    ELSE
        window_start := pgcounters.quota_window_start(v_period, v_seconds, v_zone, v_at);
        window_end := pgcounters.quota_window_end(v_period, v_seconds, v_zone, window_start);

        INSERT INTO pgcounters.quota_usage AS u
            (quota_id, subject, window_start, window_end, call_limit,
             used, attempts, rejected, last_allowed)
        VALUES (v_id, p_subject, window_start, window_end, v_limit,
                CASE WHEN p_cost <= v_limit THEN p_cost ELSE 0 END,
                1,
                CASE WHEN p_cost <= v_limit THEN 0 ELSE 1 END,
                p_cost <= v_limit)
        ON CONFLICT ON CONSTRAINT quota_usage_pkey DO UPDATE
           SET call_limit = excluded.call_limit,
               used = CASE WHEN u.used + p_cost <= excluded.call_limit
                           THEN u.used + p_cost ELSE u.used END,
               attempts = u.attempts + 1,
               rejected = u.rejected
                          + CASE WHEN u.used + p_cost <= excluded.call_limit THEN 0 ELSE 1 END,
               last_allowed = u.used + p_cost <= excluded.call_limit
        RETURNING u.last_allowed, u.used, u.attempts, u.call_limit
             INTO allowed, used, attempts, call_limit;
        retry_after := greatest(extract(epoch FROM window_end - v_at), 0);
    END IF;

    IF v_log THEN
        INSERT INTO pgcounters.quota_log (quota_id, subject, at, cost, allowed, details)
        VALUES (v_id, p_subject, v_at, p_cost, allowed, p_details);
    END IF;
    IF p_async_commit THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END;
$$;

-- The usage of a subject in the window containing p_at, without registering a
-- call (zeros when it made none).
CREATE FUNCTION pgcounters.quota_status(
    p_quota text,
    p_subject text,
    p_at timestamptz DEFAULT NULL,
    OUT used bigint,
    OUT attempts bigint,
    OUT rejected bigint,
    OUT call_limit bigint,
    OUT window_start timestamptz,
    OUT window_end timestamptz
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q pgcounters.quotas := pgcounters._quota(p_quota);
    -- p_at, else the clock: the setting pgcounters.now when set, else now()
    v_at timestamptz := coalesce(p_at, nullif(current_setting('pgcounters.now', true), '')::timestamptz,
                                 now());
    v_bucket bigint;
    v_row pgcounters.quota_sliding_usage;
BEGIN
    PERFORM pgcounters._check_subject(p_subject);
    call_limit := coalesce(
        (SELECT l.calls FROM pgcounters.quota_limits AS l
          WHERE l.quota_id = q.id AND l.subject = p_subject AND l.valid @> v_at),
        q.default_limit, 0);
    IF q.period = 'sliding' THEN
        v_bucket := floor(extract(epoch FROM v_at) / q.bucket_seconds)::bigint;
        SELECT * INTO v_row FROM pgcounters.quota_sliding_usage AS u
         WHERE u.quota_id = q.id AND u.subject = p_subject;
        IF FOUND THEN
            v_bucket := greatest(v_bucket, v_row.head);
            used := (SELECT sum(x) FROM unnest(pgcounters._ring_shift(
                         v_row.granted, v_bucket - v_row.head)) AS x);
            attempts := (SELECT sum(x) FROM unnest(pgcounters._ring_shift(
                             v_row.tried, v_bucket - v_row.head)) AS x);
            rejected := (SELECT sum(x) FROM unnest(pgcounters._ring_shift(
                             v_row.refused, v_bucket - v_row.head)) AS x);
        END IF;
        window_start := to_timestamp(
            (v_bucket - q.window_seconds / q.bucket_seconds) * q.bucket_seconds);
        window_end := to_timestamp((v_bucket + 1) * q.bucket_seconds);
    ELSE
        window_start := pgcounters.quota_window_start(
            q.period, q.window_seconds, q.time_zone, v_at);
        window_end := pgcounters.quota_window_end(
            q.period, q.window_seconds, q.time_zone, window_start);
        SELECT u.used, u.attempts, u.rejected INTO used, attempts, rejected
          FROM pgcounters.quota_usage AS u
         WHERE u.quota_id = q.id AND u.subject = p_subject
           AND u.window_start = quota_status.window_start;
    END IF;
    used := coalesce(used, 0);
    attempts := coalesce(attempts, 0);
    rejected := coalesce(rejected, 0);
END;
$$;

-- Remove usage rows of windows that ended at or before p_before, and log rows
-- older than p_before, of one quota (or all: p_quota NULL). Returns the counts.
CREATE FUNCTION pgcounters.purge_quotas(
    p_before timestamptz,
    p_quota text DEFAULT NULL,
    OUT windows bigint,
    OUT log_rows bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
    v_sliding bigint;
BEGIN
    IF p_before IS NULL THEN
        RAISE EXCEPTION 'purge needs a cut-off instant' USING ERRCODE = 'PCQ08';
    END IF;
    -- a cut-off in the future would delete windows still in use and let their
    -- subjects call again
    IF p_before > coalesce(nullif(current_setting('pgcounters.now', true), '')::timestamptz,
                           now()) THEN
        RAISE EXCEPTION 'purge cut-off % is in the future', p_before USING ERRCODE = 'PCQ08';
    END IF;
    IF p_quota IS NOT NULL THEN
        v_id := (pgcounters._quota(p_quota)).id;
    END IF;
    DELETE FROM pgcounters.quota_usage
     WHERE window_end <= p_before AND (v_id IS NULL OR quota_id = v_id);
    GET DIAGNOSTICS windows = ROW_COUNT;
    DELETE FROM pgcounters.quota_sliding_usage
     WHERE expires_at <= p_before AND (v_id IS NULL OR quota_id = v_id);
    GET DIAGNOSTICS v_sliding = ROW_COUNT;
    windows := windows + v_sliding;
    DELETE FROM pgcounters.quota_log
     WHERE at < p_before AND (v_id IS NULL OR quota_id = v_id);
    GET DIAGNOSTICS log_rows = ROW_COUNT;
END;
$$;


-- =============================================================================
-- Flushes of application-side increment buffers
-- =============================================================================
-- The batching incrementer (pgcounters/batching.py) and the Redis write-behind
-- buffer (pgcounters/redis_buffer.py) write their buffered increments in one
-- transaction that also records a flush id here. A flush whose outcome is in
-- doubt (its writer died, or the connection broke during COMMIT) is looked up
-- by id before it is written again, so it is never counted twice. Records are
-- pruned by age, never while their flush may still be in doubt.

-- One row per flush applied, by flush id.
CREATE TABLE pgcounters.buffer_flushes (
    flush_id   text PRIMARY KEY
               CONSTRAINT buffer_flushes_id_format CHECK (flush_id ~ '^[0-9a-f]{32}$'),
    buffer     text NOT NULL
               CONSTRAINT buffer_flushes_buffer_format
               CHECK (buffer ~ '^[A-Za-z0-9_.:/-]{1,200}$'),
    keys       integer NOT NULL,
    total      numeric NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- pruning by age, per buffer
CREATE INDEX buffer_flushes_age ON pgcounters.buffer_flushes (buffer, applied_at);

-- The retention of flush records (one row, 7 days unless changed): the owner's
-- to set, not a caller's (a record deleted while its flush may still be
-- retried lets it count twice).
CREATE TABLE pgcounters.buffer_settings (
    one_row boolean PRIMARY KEY DEFAULT true CHECK (one_row),
    retention interval NOT NULL DEFAULT '7 days' CHECK (retention >= interval '1 hour')
);

-- The one row of buffer_settings, with the default retention.
INSERT INTO pgcounters.buffer_settings DEFAULT VALUES;

-- Record a flush (false: it was recorded already, so it must not be applied
-- again) and prune the buffer's records older than the retention, except those
-- the caller still holds in doubt (p_keep).
CREATE FUNCTION pgcounters.record_flush(
    p_flush_id text,
    p_buffer text,
    p_keys integer,
    p_total numeric,
    p_keep text[] DEFAULT '{}'
) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
BEGIN
    INSERT INTO pgcounters.buffer_flushes (flush_id, buffer, keys, total)
    VALUES (p_flush_id, p_buffer, p_keys, p_total)
    ON CONFLICT (flush_id) DO NOTHING;
    IF NOT FOUND THEN
        UPDATE pgcounters.buffer_flushes SET applied_at = now() WHERE flush_id = p_flush_id;
        RETURN false;
    END IF;
    DELETE FROM pgcounters.buffer_flushes
     WHERE buffer = p_buffer
       AND applied_at < now() - (SELECT retention FROM pgcounters.buffer_settings)
       AND flush_id <> ALL (coalesce(p_keep, '{}'));
    RETURN true;
END;
$$;


-- =============================================================================
-- Roles and rights
-- =============================================================================
-- Two kinds of database roles use pgcounters besides the one that installs it:
-- the application (enqueues deltas, calls quota functions, reads) and the worker
-- (drains, recounts, purges). Roles are global to the cluster, so the schema
-- creates none: grant_app(role) and grant_worker(role), run by an administrator
-- (or `pgcounters grant`), give a role of their choosing what it needs.
-- Functions that must do more than their caller may are SECURITY DEFINER with a
-- fixed search_path (pg_catalog first, pg_temp last), so that objects a caller
-- creates in its own schemas or in pg_temp cannot stand in for the ones the
-- function means.

-- Run each statement template (with %I for the role) for an existing role;
-- return the statements run. The grant and revoke functions below use it.
CREATE FUNCTION pgcounters._for_role(p_role text, p_templates text[]) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_done text[] := '{}';
    v_stmt text;
BEGIN
    IF p_role IS NULL OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = p_role) THEN
        RAISE EXCEPTION 'role % does not exist', coalesce(quote_ident(p_role), 'NULL')
            USING ERRCODE = 'PC006';
    END IF;
    FOREACH v_stmt IN ARRAY p_templates LOOP
        EXECUTE format(v_stmt, p_role);
        v_done := v_done || format(v_stmt, p_role);
    END LOOP;
    RETURN v_done;
END;
$$;

-- Let p_role use counters and quotas as an application: the base rights, and
-- reading the quarantine, retries and dropped counters. Returns the statements run.
CREATE FUNCTION pgcounters._grant_app_without_decimals(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgcounters._grant_app_base(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT SELECT ON pgcounters.quarantine, pgcounters.retries,'
            ' pgcounters.dropped_targets TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters._canonical_key(pgcounters.targets, text[]) TO %I'
    ]);
END;
$$;

-- The rights every application role gets: SELECT on the tables it reads,
-- INSERT into the queues, the functions it calls, and SELECT on the key and
-- counter columns of the parent tables of column counters (not the whole table).
CREATE FUNCTION pgcounters._grant_app_base(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_done text[] := '{}';
    v_stmt text;
    t record;
BEGIN
    v_done := pgcounters._for_role(p_role, ARRAY[
        'GRANT USAGE ON SCHEMA pgcounters TO %I',
        'GRANT SELECT ON pgcounters.migrations, pgcounters.targets, pgcounters.counters,'
            ' pgcounters.queue, pgcounters.queue_unlogged, pgcounters.specs,'
            ' pgcounters.recounts, pgcounters.quotas, pgcounters.quota_limits,'
            ' pgcounters.quota_usage, pgcounters.quota_log, pgcounters.buffer_flushes,'
            ' pgcounters.drain_stats, pgcounters.pausers, pgcounters.stale_counters TO %I',
        'GRANT INSERT ON pgcounters.queue, pgcounters.queue_unlogged TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters.incr(text, text[], bigint),'
            ' pgcounters.get(text, text[]), pgcounters._target(text),'
            ' pgcounters._check_key(pgcounters.targets, text[]),'
            ' pgcounters.add_direct(integer[], text[], bigint[]),'
            ' pgcounters.ensure_target(text, text[], text, text, text, text, text),'
            ' pgcounters.is_paused(text), pgcounters._check_may_pause(),'
            ' pgcounters.date_key(date), pgcounters.date_key(timestamp),'
            ' pgcounters.date_key(timestamptz), pgcounters.date_key(text),'
            ' pgcounters.date_text(date), pgcounters.integer_value(bigint),'
            ' pgcounters.broken_specs(regclass), pgcounters.follow_descendants(text, boolean),'
            ' pgcounters._installed_on_source(text), pgcounters._descendants(oid),'
            ' pgcounters._truncate_descendant(),'
            ' pgcounters.register_call(text, text, bigint, timestamptz, jsonb, boolean),'
            ' pgcounters.quota_status(text, text, timestamptz), pgcounters._quota(text),'
            ' pgcounters._check_subject(text),'
            ' pgcounters.quota_window_start(text, bigint, text, timestamptz),'
            ' pgcounters.quota_window_end(text, bigint, text, timestamptz),'
            ' pgcounters.record_flush(text, text, integer, numeric, text[]),'
            ' pgcounters.wakeup_interval_ms() TO %I'
    ]);
    FOR t IN
        SELECT DISTINCT target_schema, target_table, target_column, target_key_column,
               mode = 'direct' AS direct
          FROM pgcounters.targets
         WHERE target_table IS NOT NULL
         ORDER BY 1, 2, 3, 4
    LOOP
        IF to_regclass(format('%I.%I', t.target_schema, t.target_table)) IS NULL THEN
            CONTINUE;
        END IF;
        v_stmt := format('GRANT SELECT (%I, %I) ON %I.%I TO %I', t.target_key_column,
            t.target_column, t.target_schema, t.target_table, p_role);
        EXECUTE v_stmt;
        v_done := v_done || v_stmt;
        IF t.direct THEN
            v_stmt := format('GRANT UPDATE (%I) ON %I.%I TO %I',
                t.target_column, t.target_schema, t.target_table, p_role);
            EXECUTE v_stmt;
            v_done := v_done || v_stmt;
        END IF;
    END LOOP;
    RETURN v_done;
END;
$$;

-- Let p_role work as the worker: the rights below, clearing a counter's stale
-- mark when it recounts it, and running backfills. Returns the statements run.
CREATE FUNCTION pgcounters._grant_worker_without_decimals(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgcounters._grant_worker_v8(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT DELETE ON pgcounters.stale_counters TO %I',
        -- the worker runs backfills (version 9): it moves and deletes their rows
        'GRANT SELECT, UPDATE, DELETE ON pgcounters.backfills TO %I'
    ]);
END;
$$;

-- The worker's rights on the drain, the quarantine and the retries (part of grant_worker).
CREATE FUNCTION pgcounters._grant_worker_v8(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgcounters._grant_worker_v6(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT SELECT ON pgcounters.quarantine, pgcounters.retries,'
            ' pgcounters.dropped_targets TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters._canonical_key(pgcounters.targets, text[]) TO %I',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON pgcounters.quarantine, pgcounters.retries TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters._quarantinable(text),'
            ' pgcounters._record_drain(boolean, bigint, bigint, double precision, bigint, bigint),'
            ' pgcounters.record_retry(text, text),'
            ' pgcounters._apply_column(pgcounters.targets, text[], numeric[], text[]),'
            ' pgcounters._lock_parents(text, text, text, text, text[]),'
            ' pgcounters._drain_columns(pgcounters.batch_delta[], boolean),'
            ' pgcounters.drain_queue(integer, boolean),'
            ' pgcounters._drain_carefully(integer, boolean, boolean, text, integer[]),'
            ' pgcounters.replay_quarantined(bigint[], text),'
            ' pgcounters.discard_quarantined(bigint[], text) TO %I'
    ]);
END;
$$;

-- The worker's base rights (part of grant_worker): drain the queues, recount
-- declared counters, reset them (TRUNCATE of a counted table), purge old quota
-- windows and read everything the application reads; SELECT on source tables,
-- SELECT and UPDATE of the counter column on parent tables.
CREATE FUNCTION pgcounters._grant_worker_v6(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_done text[] := '{}';
    v_stmt text;
    t record;
BEGIN
    v_done := pgcounters.grant_app(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT SELECT, INSERT, UPDATE, DELETE ON pgcounters.counters, pgcounters.queue,'
            ' pgcounters.queue_unlogged, pgcounters.recounts, pgcounters.drain_stats TO %I',
        'GRANT DELETE ON pgcounters.quota_usage, pgcounters.quota_log TO %I',
        'GRANT SELECT, UPDATE ON SEQUENCE pgcounters.wakeup_clock TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters.drain_batch(integer, boolean),'
            ' pgcounters._record_drain(boolean, bigint, bigint, double precision),'
            ' pgcounters._broken_targets(),'
            ' pgcounters.reset_target(integer),'
            ' pgcounters.purge_quotas(timestamptz, text) TO %I'
    ]);
    FOR t IN
        SELECT DISTINCT target_schema AS s, target_table AS r, target_column AS c
          FROM pgcounters.targets
         WHERE target_table IS NOT NULL
         ORDER BY 1, 2, 3
    LOOP
        IF to_regclass(format('%I.%I', t.s, t.r)) IS NULL THEN
            CONTINUE;
        END IF;
        v_stmt := format('GRANT SELECT, UPDATE (%I) ON %I.%I TO %I', t.c, t.s, t.r, p_role);
        EXECUTE v_stmt;
        v_done := v_done || v_stmt;
    END LOOP;
    FOR t IN
        SELECT DISTINCT definition -> 'source' ->> 'schema' AS s,
                        definition -> 'source' ->> 'table' AS r
          FROM pgcounters.specs
         ORDER BY 1, 2
    LOOP
        IF t.s IS NULL OR t.r IS NULL OR to_regclass(format('%I.%I', t.s, t.r)) IS NULL THEN
            CONTINUE;
        END IF;
        v_stmt := format('GRANT USAGE ON SCHEMA %I TO %I', t.s, p_role);
        EXECUTE v_stmt;
        v_done := v_done || v_stmt;
        v_stmt := format('GRANT SELECT ON %I.%I TO %I', t.s, t.r, p_role);
        EXECUTE v_stmt;
        v_done := v_done || v_stmt;
    END LOOP;
    RETURN v_done;
END;
$$;

-- Take back every right grant_app and grant_worker gave p_role: on pgcounters'
-- own objects (procedures included), the right to pause, and the column rights
-- on the parent tables of column counters (column rights only: a table-wide right the role holds
-- for its own work is not pgcounters' to take). The table-wide SELECT that
-- grant_worker gives on source tables stays (see docs/security.md).
CREATE FUNCTION pgcounters.revoke_role(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_done text[];
    v_stmt text;
    t record;
BEGIN
    v_done := pgcounters._for_role(p_role, ARRAY[
        'REVOKE ALL ON ALL TABLES IN SCHEMA pgcounters FROM %I',
        'REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgcounters FROM %I',
        'REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgcounters FROM %I',
        'REVOKE ALL ON ALL PROCEDURES IN SCHEMA pgcounters FROM %I',
        'REVOKE ALL ON SCHEMA pgcounters FROM %I'
    ]);
    IF EXISTS (SELECT 1 FROM pgcounters.pausers WHERE role_name = p_role) THEN
        DELETE FROM pgcounters.pausers WHERE role_name = p_role;
        v_done := v_done || format('DELETE FROM pgcounters.pausers WHERE role_name = %L', p_role);
    END IF;
    FOR t IN
        SELECT DISTINCT target_schema AS s, target_table AS r, target_column AS c,
               target_key_column AS k
          FROM pgcounters.targets
         WHERE target_table IS NOT NULL
         ORDER BY 1, 2, 3, 4
    LOOP
        IF to_regclass(format('%I.%I', t.s, t.r)) IS NULL THEN
            CONTINUE;
        END IF;
        v_stmt := format('REVOKE SELECT (%I, %I), UPDATE (%I) ON %I.%I FROM %I',
            t.k, t.c, t.c, t.s, t.r, p_role);
        EXECUTE v_stmt;
        v_done := v_done || v_stmt;
    END LOOP;
    RETURN v_done;
END;
$$;


-- The grants of version 12 and those of the sums of decimals.
CREATE FUNCTION pgcounters._grant_decimals(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON FUNCTION pgcounters.scaled(numeric, integer, text),'
            ' pgcounters.unscaled(numeric, integer),'
            ' pgcounters.decimal_scale_is(regclass, name, integer),'
            ' pgcounters.ensure_decimal_target(integer, text, text[], text, text, text, text, text),'
            ' pgcounters._exact_units(pgcounters.targets, text[]),'
            ' pgcounters.get_decimal(text, text[]),'
            ' pgcounters.incr_decimal(text, text[], numeric) TO %I'])
$$;

-- The application's rights on the SQL interface (part of grant_app).
CREATE FUNCTION pgcounters._grant_app_sql_interface(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON FUNCTION pgcounters.top(text, bigint),'
            ' pgcounters.get_many(text, text[]) TO %I'])
$$;

-- The worker's rights on the SQL interface (part of grant_worker).
CREATE FUNCTION pgcounters._grant_worker_sql_interface(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON PROCEDURE pgcounters.drain_all(integer, bigint, bigint, bigint) TO %I'])
$$;

-- The application's rights on sliding windows (part of grant_app): it reads
-- them (quota_status, reports).
CREATE FUNCTION pgcounters._grant_app_sliding(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT SELECT ON pgcounters.quota_sliding_usage TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters._ring_shift(bigint[], bigint) TO %I'])
$$;

-- The worker's rights on sliding windows (part of grant_worker): it purges them.
CREATE FUNCTION pgcounters._grant_worker_sliding(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_app_sliding(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT DELETE ON pgcounters.quota_sliding_usage TO %I'])
$$;

-- The application's rights on the functions its writes call (part of grant_app): the
-- triggers run as the writer, a direct counter notes its changes, a generic relation's
-- counter reads its text object ids.
CREATE FUNCTION pgcounters._grant_app_generic(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON FUNCTION pgcounters.note_direct(integer, anyarray),'
            ' pgcounters.object_id_bigint(text), pgcounters.object_id_uuid(text),'
            ' pgcounters._cast_or_null(text, regtype) TO %I'])
$$;

-- The rights of counters per period: the key functions to every writer of a counted
-- table and the reads (part of grant_app), the retention (part of grant_worker).
CREATE FUNCTION pgcounters._grant_app_buckets(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON FUNCTION pgcounters.bucket_date(timestamptz, text, text),'
            ' pgcounters.bucket_date(timestamp, text, text),'
            ' pgcounters.bucket_date(date, text, text),'
            ' pgcounters.bucket_hour(timestamptz, text), pgcounters.bucket_hour(timestamp, text),'
            ' pgcounters.bucket_hour(date, text), pgcounters.bucket_text(text, text, timestamptz),'
            ' pgcounters.bucket_periods(text, text, timestamptz, timestamptz),'
            ' pgcounters.bucket_horizon(text, text, integer), pgcounters._bucket(text),'
            ' pgcounters._check_range(text, timestamptz, timestamptz),'
            ' pgcounters._bucket_prefix(pgcounters.targets, text[]),'
            ' pgcounters._exact_values(pgcounters.targets, text[]),'
            ' pgcounters.get_series(text, text[], timestamptz, timestamptz),'
            ' pgcounters.get_range(text, text[], timestamptz, timestamptz),'
            ' pgcounters.top_range(text, timestamptz, timestamptz, bigint),'
            ' pgcounters._range_values(integer, text, jsonb, text[], text, text),'
            ' pgcounters._range_sum(integer, text, jsonb, text[], text, text),'
            ' pgcounters._first_kept(integer), pgcounters._kept(text, text) TO %I'])
$$;

CREATE FUNCTION pgcounters._grant_worker_buckets(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_app_buckets(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON FUNCTION pgcounters.drop_expired_buckets(integer) TO %I'])
$$;

-- The worker's SELECT on the other tables its recounts and backfills read (part of
-- grant_worker): the tables of each counter's path (via) and those its conditions read
-- (reads: a generic relation's content type table), with USAGE on their schemas.
CREATE FUNCTION pgcounters._grant_worker_read_tables(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_done text[] := '{}';
    v_stmt text;
    t record;
BEGIN
    FOR t IN
        SELECT DISTINCT step ->> 'schema' AS s, step ->> 'table' AS r
          FROM pgcounters.specs
         CROSS JOIN LATERAL jsonb_array_elements(
               CASE WHEN jsonb_typeof(definition -> 'via') = 'array'
                    THEN definition -> 'via' ELSE '[]'::jsonb END
               || CASE WHEN jsonb_typeof(definition -> 'reads') = 'array'
                       THEN definition -> 'reads' ELSE '[]'::jsonb END) AS step
         ORDER BY 1, 2
    LOOP
        IF t.s IS NULL OR t.r IS NULL OR to_regclass(format('%I.%I', t.s, t.r)) IS NULL THEN
            CONTINUE;
        END IF;
        v_stmt := format('GRANT USAGE ON SCHEMA %I TO %I', t.s, p_role);
        EXECUTE v_stmt;
        v_done := v_done || v_stmt;
        v_stmt := format('GRANT SELECT ON %I.%I TO %I', t.s, t.r, p_role);
        EXECUTE v_stmt;
        v_done := v_done || v_stmt;
    END LOOP;
    RETURN v_done;
END;
$$;

CREATE FUNCTION pgcounters.grant_app(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_app_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_app_sql_interface(p_role) || pgcounters._grant_app_sliding(p_role)
           || pgcounters._grant_app_generic(p_role)
           || pgcounters._grant_app_buckets(p_role)
$$;

-- Counters over generic relations, and change reports of direct-mode counters
-- (version 20): see migrations/0020_generic_relations.sql.

CREATE FUNCTION pgcounters._cast_or_null(p_value text, p_type regtype) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    -- the cast an ORM's join makes (object_id::bigint = id), NULL where it would fail
    EXECUTE format('SELECT $1::%s::text', p_type) INTO STRICT p_value USING p_value;
    RETURN p_value;
EXCEPTION WHEN data_exception THEN
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgcounters.object_id_bigint(p_value text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_value ~ '^\s*[+-]?[0-9]{1,18}\s*$' THEN p_value::bigint
                ELSE pgcounters._cast_or_null(p_value, 'bigint')::bigint END
$$;

CREATE FUNCTION pgcounters.object_id_uuid(p_value text) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_value ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                THEN p_value::uuid
                ELSE pgcounters._cast_or_null(p_value, 'uuid')::uuid END
$$;

-- The sessions of the workers that report changes (their backend pid): direct-mode
-- counters note their changes only while one is registered.
CREATE TABLE pgcounters.change_listeners (
    pid   integer PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now()
);

-- The changes of direct-mode counters, committed and not yet reported: one row per
-- writing statement (or add_direct call) and counter, its keys as the text of their
-- arrays ('{42}').
CREATE TABLE pgcounters.direct_changes (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    target_id integer NOT NULL,
    keys      text[] NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- Whether a registered reporting worker is alive: a worker killed leaves its
-- registration behind until the next worker sets up, and nothing is noted for it
-- meanwhile. One look at the sessions' status (once per transaction), only while a
-- registration exists.
CREATE FUNCTION pgcounters._direct_listened() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    -- plpgsql: its plan is kept for the session (a SQL function's would be made again
    -- in each writing transaction)
    RETURN EXISTS (SELECT 1 FROM pgcounters.change_listeners AS l
                    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_stat_get_activity(l.pid)));
END;
$$;

-- Whether a row version visible here was written by this transaction (or one of its
-- subtransactions): no other transaction's uncommitted row is visible, so a visible
-- version whose writer is still in progress is this transaction's.
CREATE FUNCTION pgcounters._written_here(p_xmin xid) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pgcounters, pg_temp AS $$
    SELECT coalesce(pg_catalog.pg_xact_status(
               (CASE WHEN c.cur - c.low + x.low > c.cur + 2147483648
                     THEN c.cur - c.low + x.low - 4294967296
                     WHEN c.cur - c.low + x.low < c.cur - 2147483648
                     THEN c.cur - c.low + x.low + 4294967296
                     ELSE c.cur - c.low + x.low END)::text::xid8) = 'in progress', false)
      FROM (SELECT f AS cur, f % 4294967296 AS low
              FROM (SELECT pg_catalog.pg_current_xact_id()::text::bigint AS f) AS g) AS c,
           (SELECT p_xmin::text::bigint AS low) AS x
$$;

-- The direct triggers of counter columns note the keys of the parent rows a statement
-- changed (in the key column's type), while a reporting worker is alive. A
-- two-dimensional array holds a named counter's keys instead, each as the text of its
-- array, one per row (ARRAY[['{42}'], ['{7}']]): the client's writes of direct named
-- counters. Outside a trigger only a role that may write the counter's storage (the
-- counter column, or pgcounters.counters) may call it (version 24).
CREATE FUNCTION pgcounters.note_direct(p_target integer, p_keys anyarray) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    v_target pgcounters.targets;
    v_role text;
    v_allowed boolean;
    v_table text;
BEGIN
    IF pg_catalog.pg_trigger_depth() = 0 THEN
        -- the role of the calling statement (this function runs as its owner): the
        -- one SET ROLE chose, else the session's
        v_role := pg_catalog.current_setting('role');
        IF v_role = 'none' THEN
            v_role := session_user;
        END IF;
        SELECT * INTO v_target FROM pgcounters.targets WHERE id = p_target;
        IF v_target.target_table IS NULL THEN
            v_allowed := pg_catalog.has_table_privilege(v_role, 'pgcounters.counters', 'UPDATE');
        ELSE
            -- a counter column: a role that may write it, and only the keys of rows this
            -- transaction wrote (visible, written by a transaction still in progress)
            v_table := pg_catalog.format('%I.%I', v_target.target_schema, v_target.target_table);
            v_allowed := pg_catalog.has_column_privilege(
                v_role, v_table, v_target.target_column, 'UPDATE');
            IF v_allowed THEN
                EXECUTE pg_catalog.format(
                    'SELECT NOT EXISTS (SELECT 1 FROM unnest($1::text::text[]) AS k'
                    ' WHERE NOT EXISTS (SELECT 1 FROM %s AS x WHERE x.%I = k::%s'
                    ' AND pgcounters._written_here(x.xmin)))',
                    v_table, v_target.target_key_column,
                    (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod)
                       FROM pg_catalog.pg_attribute AS a
                      WHERE a.attrelid = v_table::regclass
                        AND a.attname = v_target.target_key_column))
                    INTO v_allowed USING p_keys;
            END IF;
        END IF;
        IF v_target.id IS NULL OR v_target.mode <> 'direct' OR NOT v_allowed THEN
            RAISE EXCEPTION 'note_direct notes the changes of a direct counter: it is called by '
                'the triggers of direct counters and by a role that writes the counter itself; '
                'role % may not write counter id % (or these keys)', v_role, p_target
                USING ERRCODE = '42501';
        END IF;
    END IF;
    IF p_keys IS NOT NULL AND cardinality(p_keys) > 0 AND pgcounters._direct_listened() THEN
        IF array_ndims(p_keys) = 2 THEN
            INSERT INTO pgcounters.direct_changes (target_id, keys)
            VALUES (p_target, ARRAY(SELECT DISTINCT k::text::text[]::text FROM unnest(p_keys) AS k));
        ELSE
            INSERT INTO pgcounters.direct_changes (target_id, keys)
            VALUES (p_target, ARRAY(SELECT ARRAY[k::text]::text FROM unnest(p_keys) AS k));
        END IF;
    END IF;
END;
$$;

-- Register the calling session as a reporting worker (direct counters note their
-- changes from now on), forgetting the registrations of sessions that are gone (a
-- worker killed, or reconnecting: the notes it left are reported by the next one):
-- returns the number of workers registered.
CREATE FUNCTION pgcounters.listen_direct_changes() RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
BEGIN
    -- one registration change at a time (writers, which only read, are not held): a
    -- worker leaving never drops the notes of one registering meanwhile
    LOCK TABLE pgcounters.change_listeners IN SHARE ROW EXCLUSIVE MODE;
    DELETE FROM pgcounters.change_listeners AS l
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_get_activity(l.pid));
    INSERT INTO pgcounters.change_listeners (pid) VALUES (pg_backend_pid())
        ON CONFLICT (pid) DO NOTHING;
    RETURN (SELECT count(*) FROM pgcounters.change_listeners);
END;
$$;

-- Unregister the calling session and forget the registrations of sessions that are
-- gone (every worker calls it as it sets up); when no reporting worker is left, the
-- changes nobody will report are dropped. Returns the number of workers still
-- registered.
CREATE FUNCTION pgcounters.unlisten_direct_changes() RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    v_left bigint;
BEGIN
    LOCK TABLE pgcounters.change_listeners IN SHARE ROW EXCLUSIVE MODE;
    DELETE FROM pgcounters.change_listeners AS l
     WHERE l.pid = pg_backend_pid()
        OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_get_activity(l.pid));
    v_left := (SELECT count(*) FROM pgcounters.change_listeners);
    IF v_left = 0 THEN
        DELETE FROM pgcounters.direct_changes;
    END IF;
    RETURN v_left;
END;
$$;

-- Take (delete and return) at most p_limit rows of committed direct-mode changes,
-- the oldest first, skipping rows another worker is taking: each changed key once,
-- with its counter's name and key types, and the number of rows taken (p_limit: more
-- may be left). The caller reports them after it commits.
CREATE FUNCTION pgcounters.take_direct_changes(p_limit integer DEFAULT 1000)
RETURNS TABLE (name text, key text[], key_types text[], taken bigint)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'batch size must be a positive integer, got %', p_limit
            USING ERRCODE = 'PC005';
    END IF;
    RETURN QUERY
    WITH taken AS (
        DELETE FROM pgcounters.direct_changes AS d
         WHERE d.id = ANY (ARRAY(SELECT c.id FROM pgcounters.direct_changes AS c
                                  ORDER BY c.id LIMIT p_limit FOR UPDATE SKIP LOCKED))
        RETURNING d.target_id, d.keys
    )
    SELECT DISTINCT t.name, k.key::text[], t.key_types, (SELECT count(*) FROM taken)
      FROM taken
      JOIN pgcounters.targets AS t ON t.id = taken.target_id
     CROSS JOIN LATERAL unnest(taken.keys) AS k(key);
END;
$$;

-- The worker's rights on the change reports of direct counters (part of grant_worker).
CREATE FUNCTION pgcounters._grant_worker_direct_changes(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON FUNCTION pgcounters.listen_direct_changes(),'
            ' pgcounters.unlisten_direct_changes(), pgcounters.take_direct_changes(integer)'
            ' TO %I'])
$$;

CREATE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_worker_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_worker_sql_interface(p_role)
           || pgcounters._grant_worker_sliding(p_role)
           || pgcounters._grant_worker_direct_changes(p_role)
           || pgcounters._grant_worker_buckets(p_role)
           || pgcounters._grant_worker_read_tables(p_role)
           || pgcounters._grant_worker_target_ids(p_role)
$$;


-- =============================================================================
-- Folded target ids (version 29): a counter's trigger finds its counter's id in
-- the body of _target_id, folded into the trigger's plan; see
-- migrations/0029_folded_target_ids.sql.
-- =============================================================================

-- The identity of an integer counter as its triggers name it: everything ensure_target
-- compares, as JSON text (a name holding any character stays one identity).
CREATE FUNCTION pgcounters._target_identity(
    p_name text, p_key_types text[], p_mode text, p_schema text, p_table text, p_column text,
    p_key_column text
) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.jsonb_build_array(p_name, p_key_types, p_mode, p_schema, p_table,
                                        p_column, p_key_column)::text
$$;

-- The id of the counter of an identity, NULL when it is not listed. refresh_target_ids
-- writes its body; nothing else may.
CREATE FUNCTION pgcounters._target_id(p_identity text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT ('{}'::jsonb ->> p_identity)::integer $$;

-- List the ids of every integer counter in _target_id. p_wait false: return NULL at once
-- when another transaction is writing the list. Returns how many counters are listed.
-- Outside read committed (a snapshot taken before the lock could hold a counter dropped
-- since) it lists none: every trigger then looks its counter up, as before version 29.
CREATE FUNCTION pgcounters.refresh_target_ids(p_wait boolean DEFAULT true) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    v_ids jsonb := '{}';
    v_count integer := 0;
    v_body text;
BEGIN
    IF p_wait THEN
        PERFORM pg_advisory_xact_lock(hashtext('pgcounters.target_ids'), 0);
    ELSIF NOT pg_try_advisory_xact_lock(hashtext('pgcounters.target_ids'), 0) THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT coalesce(jsonb_object_agg(pgcounters._target_identity(t.name, t.key_types,
                            t.mode, t.target_schema, t.target_table, t.target_column,
                            t.target_key_column), t.id), '{}'),
               count(*)
          INTO v_ids, v_count
          FROM pgcounters.targets AS t
         WHERE t.scale IS NULL;
    END IF;
    v_body := format(' SELECT (%L::jsonb ->> p_identity)::integer ', v_ids::text);
    -- an unchanged list is not written again: each write makes every session plan the
    -- counters' triggers again
    IF v_body IS DISTINCT FROM (SELECT p.prosrc FROM pg_proc AS p
                                 WHERE p.oid = 'pgcounters._target_id(text)'::regprocedure) THEN
        EXECUTE format('CREATE OR REPLACE FUNCTION pgcounters._target_id(p_identity text) '
                       'RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L', v_body);
    END IF;
    RETURN v_count;
END;
$$;

-- The worker's right to refresh the list (part of grant_worker).
CREATE FUNCTION pgcounters._grant_worker_target_ids(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON FUNCTION pgcounters.refresh_target_ids(boolean) TO %I'])
$$;


-- =============================================================================
-- Privileges
-- =============================================================================

-- No function or procedure of the schema is executable by PUBLIC (PostgreSQL's
-- default for a new one) except those granted below; functions of an extension
-- are left as the extension made them.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'pgcounters'::regnamespace
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
                            WHERE d.classid = 'pg_catalog.pg_proc'::regclass
                              AND d.objid = p.oid AND d.deptype = 'e')
    LOOP
        EXECUTE format('REVOKE EXECUTE ON ROUTINE %s FROM PUBLIC', f);
    END LOOP;
END;
$$;

-- Anyone may see which counters are being backfilled...
GRANT SELECT ON pgcounters.backfills TO PUBLIC;

-- ...and be told so by an exact read of one.
GRANT EXECUTE ON FUNCTION pgcounters._backfilling(integer) TO PUBLIC;

-- Every trigger of a counted table calls _target_id as the role writing the table,
-- whoever granted that role its rights: a write must never fail for want of this right.
-- It reads no table and returns ids only for identities a caller already knows; USAGE
-- on the schema still gates it.
GRANT EXECUTE ON FUNCTION pgcounters._target_id(text) TO PUBLIC;
