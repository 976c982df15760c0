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
-- Redefinition of pgcounters.get (version 8's body, canonical keys): refused
-- while the counter is backfilled (the line marked "backfill").
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgcounters.get(p_name text, p_key text[] DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_key text[] := pgcounters._canonical_key(t, p_key);
    v_text text := v_key::text;
    v_stored bigint;
BEGIN
    PERFORM pgcounters._backfilling(t.id);  -- backfill
    IF t.target_table IS NULL THEN
        SELECT value INTO v_stored FROM pgcounters.counters WHERE target_id = t.id AND key = v_key;
    ELSE
        EXECUTE format('SELECT x.%I FROM %I.%I AS x WHERE x.%I = $1::%s',
            t.target_column, t.target_schema, t.target_table,
            t.target_key_column, t.key_types[1]::regtype)
        INTO v_stored USING v_key[1];
    END IF;
    RETURN coalesce(v_stored, 0)
         + coalesce((SELECT sum(delta) FROM pgcounters.queue
                      WHERE target_id = t.id AND key = v_text), 0)
         + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                      WHERE target_id = t.id AND key = v_text), 0);
END;
$$;
