-- pgcounters schema, version 2: declared counters kept by triggers.
--
-- A counter spec (pgcounters/specs.py) says what to count; the compiler
-- (pgcounters/compiler.py) turns it into statement-level triggers on the
-- counted table. The triggers call the functions below. The spec itself is
-- recorded in pgcounters.specs, so that verify, recount and status work from
-- the database alone.

-- Declared specs: the definition (JSON, see CounterSpec.to_json) and the
-- fingerprint of the triggers compiled from it.
CREATE TABLE pgcounters.specs (
    name        text PRIMARY KEY,
    fingerprint text NOT NULL,
    definition  jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
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

-- True when counting is paused in this session for the named counter
-- (pgcounters.paused = 'all' or a comma-separated list of names). Used for bulk
-- imports that are followed by a recount.
CREATE FUNCTION pgcounters.is_paused(p_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(s = 'all' OR p_name = ANY (string_to_array(s, ',')), false)
      FROM (SELECT current_setting('pgcounters.paused', true) AS s) AS setting
$$;

-- TRUNCATE of a counted table: every count from it is now zero. Pending deltas
-- of the counter are removed (waiting for a drainer that holds some of them to
-- finish), then stored values are set to zero.
CREATE FUNCTION pgcounters.reset_target(p_target_id integer) RETURNS void
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
        EXECUTE format('UPDATE %I.%I SET %I = 0 WHERE %I IS DISTINCT FROM 0',
            t.target_schema, t.target_table, t.target_column, t.target_column);
    END IF;
END;
$$;
