-- pgcounters schema, version 6: least privilege.
--
-- Two kinds of database roles use pgcounters besides the one that installs it:
--
-- * the application: enqueues deltas (INSERT into the queues, incr, the
--   triggers of declared counters), calls quota functions and reads (exact
--   reads, top-N, quota status, the status views). It never changes a stored
--   counter value or a quota usage row except through the functions below,
--   which only add deltas or register calls;
-- * the worker: drains the queues, recounts, purges old quota windows.
--
-- Roles are global to the cluster, so this migration creates none: it revokes
-- the default EXECUTE of PUBLIC on pgcounters' functions and adds
-- pgcounters.grant_app(role) and pgcounters.grant_worker(role), which an
-- administrator (or `pgcounters grant`) runs for roles of their choosing.
--
-- Functions that must do more than their caller may are SECURITY DEFINER
-- with a fixed search_path (pg_catalog first, pg_temp last), so that objects
-- a caller creates in its own schemas or in pg_temp cannot stand in for the
-- ones the function means. Their bodies stay in their own migrations and
-- reference every pgcounters object with its schema; this file only changes
-- how they run. incr is the exception: it is redefined here as an invoker
-- function that adds to direct named counters through add_direct.

-- ---------------------------------------------------------------------------
-- Direct counters without UPDATE rights on pgcounters.counters
-- ---------------------------------------------------------------------------

-- Add deltas to named counters in direct mode: p_targets[i] gets p_deltas[i]
-- under key p_keys[i] (a text[] literal such as '{42}' or '{}'). Rows are
-- applied summed per (target, key), in (target, key) order, so two callers
-- cannot deadlock. Targets that are not named direct counters are refused
-- (PC003 unknown, PC004 wrong key), nothing is written. Returns the new value
-- of the last (target, key) in that order: for one increment, its new value.
--
-- The Python client and the triggers of declared direct counters call this
-- instead of writing pgcounters.counters, so an application role needs no
-- INSERT or UPDATE right on that table.
CREATE FUNCTION pgcounters.add_direct(p_targets integer[], p_keys text[], p_deltas bigint[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_bad record;
    v_value bigint;
    v_key text[];
    v_target pgcounters.targets;
BEGIN
    IF coalesce(array_length(p_targets, 1), 0) <> coalesce(array_length(p_keys, 1), 0)
       OR coalesce(array_length(p_targets, 1), 0) <> coalesce(array_length(p_deltas, 1), 0) THEN
        RAISE EXCEPTION 'add_direct needs as many keys and deltas as targets'
            USING ERRCODE = 'PC004';
    END IF;
    IF array_length(p_targets, 1) = 1 THEN
        -- one increment (Counters.incr): two index lookups, as fast as a plain upsert
        -- (the general form below costs about 0.1 ms more per call)
        SELECT * INTO v_target FROM pgcounters.targets WHERE id = p_targets[1];
        IF NOT FOUND OR v_target.mode <> 'direct' OR v_target.target_table IS NOT NULL THEN
            RAISE EXCEPTION 'counter id % is not a named counter in direct mode', p_targets[1]
                USING ERRCODE = 'PC003';
        END IF;
        v_key := p_keys[1]::text[];
        IF v_key IS NULL
           OR coalesce(array_length(v_key, 1), 0)
              <> coalesce(array_length(v_target.key_types, 1), 0)
           OR array_position(v_key, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'counter % takes a key of (%), got %',
                v_target.name, array_to_string(v_target.key_types, ', '),
                coalesce(p_keys[1], 'NULL')
                USING ERRCODE = 'PC004';
        END IF;
        IF p_deltas[1] IS NULL THEN
            RETURN NULL;
        END IF;
        INSERT INTO pgcounters.counters AS c (target_id, key, value)
        VALUES (v_target.id, v_key, p_deltas[1])
        ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
        RETURNING c.value INTO v_value;
        RETURN v_value;
    END IF;
    SELECT d.target_id, t.name, t.mode, t.target_table, t.key_types, d.key
      INTO v_bad
      FROM unnest(p_targets, p_keys::text[]) AS d(target_id, key)
      LEFT JOIN pgcounters.targets AS t ON t.id = d.target_id
     WHERE t.id IS NULL OR t.mode <> 'direct' OR t.target_table IS NOT NULL
        OR d.key IS NULL
        OR coalesce(array_length(d.key::text[], 1), 0)
           <> coalesce(array_length(t.key_types, 1), 0)
        OR array_position(d.key::text[], NULL) IS NOT NULL
     LIMIT 1;
    IF FOUND THEN
        IF v_bad.name IS NULL OR v_bad.mode <> 'direct' OR v_bad.target_table IS NOT NULL THEN
            RAISE EXCEPTION 'counter id % is not a named counter in direct mode', v_bad.target_id
                USING ERRCODE = 'PC003';
        END IF;
        RAISE EXCEPTION 'counter % takes a key of (%), got %',
            v_bad.name, array_to_string(v_bad.key_types, ', '), coalesce(v_bad.key, 'NULL')
            USING ERRCODE = 'PC004';
    END IF;
    WITH summed AS (
        SELECT d.target_id, d.key::text[] AS key, sum(d.delta)::bigint AS delta
          FROM unnest(p_targets, p_keys, p_deltas) AS d(target_id, key, delta)
         GROUP BY 1, 2
    ), applied AS (
        INSERT INTO pgcounters.counters AS c (target_id, key, value)
        SELECT s.target_id, s.key, s.delta FROM summed AS s
         WHERE s.delta IS NOT NULL
         ORDER BY s.target_id, s.key
        ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
        RETURNING c.target_id, c.key, c.value
    )
    SELECT a.value INTO v_value FROM applied AS a ORDER BY a.target_id DESC, a.key DESC LIMIT 1;
    RETURN v_value;
END;
$$;

-- incr stays SECURITY INVOKER: it inserts into a queue (the application role
-- has INSERT there), updates a user table's counter column (the application
-- role has UPDATE on that column: the table's own triggers must fire with the
-- caller's rights, never with the owner's of pgcounters), and adds to a direct
-- named counter through add_direct.
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
    EXECUTE format(
        'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + $1 WHERE x.%I = $2::%s RETURNING x.%I',
        t.target_schema, t.target_table, t.target_column, t.target_column,
        t.target_key_column, t.key_types[1]::regtype, t.target_column)
    INTO v_value USING p_delta, p_key[1];
    RETURN v_value;
END;
$$;

-- ---------------------------------------------------------------------------
-- Functions that run with the rights of their owner
-- ---------------------------------------------------------------------------

-- add_direct: the only way a role without write rights on pgcounters.counters
-- adds to a direct named counter (incr and the compiled triggers call it).
ALTER FUNCTION pgcounters.add_direct(integer[], text[], bigint[])
    SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp;
-- a quota call upserts the usage row (and the log): the application may call,
-- never write usage itself
ALTER FUNCTION pgcounters.register_call(text, text, bigint, timestamptz, jsonb, boolean)
    SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp;
-- application-side buffers record their flush ids in the same transaction
ALTER FUNCTION pgcounters.record_flush(text, text, integer, numeric, interval, text[])
    SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp;
-- the wake-up trigger on the queues fires in the inserting transaction and
-- moves a sequence the application has no right on
ALTER FUNCTION pgcounters._wake_drainers()
    SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp;

-- ---------------------------------------------------------------------------
-- No EXECUTE for PUBLIC
-- ---------------------------------------------------------------------------

-- PostgreSQL grants EXECUTE on every new function to PUBLIC. The schema
-- itself grants nothing to PUBLIC, so only roles given USAGE on it could use
-- that default; it is revoked anyway, so that a SECURITY DEFINER function is
-- callable only by the roles granted it below. Functions of the btree_gist
-- extension (installed in this schema) are left as the extension made them.
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
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$$;

-- ---------------------------------------------------------------------------
-- Granting
-- ---------------------------------------------------------------------------

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

-- Let p_role use pgcounters as an application: enqueue, incr, quota calls and
-- reads. Counter columns of user tables are read (SELECT on the table) and,
-- for direct column counters, the counter column is updatable. Returns the
-- GRANT statements run. Idempotent; run it again after declaring new column
-- counters. The caller must be allowed to grant all of this (the owner of the
-- pgcounters schema, or a superuser).
CREATE FUNCTION pgcounters.grant_app(p_role text) RETURNS text[]
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
            ' pgcounters.drain_stats TO %I',
        'GRANT INSERT ON pgcounters.queue, pgcounters.queue_unlogged TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters.incr(text, text[], bigint),'
            ' pgcounters.get(text, text[]), pgcounters._target(text),'
            ' pgcounters._check_key(pgcounters.targets, text[]),'
            ' pgcounters.add_direct(integer[], text[], bigint[]),'
            ' pgcounters.ensure_target(text, text[], text, text, text, text, text),'
            ' pgcounters.is_paused(text),'
            ' pgcounters.register_call(text, text, bigint, timestamptz, jsonb, boolean),'
            ' pgcounters.quota_status(text, text, timestamptz), pgcounters._quota(text),'
            ' pgcounters._check_subject(text),'
            ' pgcounters.quota_window_start(text, bigint, text, timestamptz),'
            ' pgcounters.quota_window_end(text, bigint, text, timestamptz),'
            ' pgcounters.record_flush(text, text, integer, numeric, interval, text[]),'
            ' pgcounters.wakeup_interval_ms() TO %I'
    ]);
    FOR t IN
        SELECT DISTINCT target_schema, target_table, target_column, mode = 'direct' AS direct
          FROM pgcounters.targets
         WHERE target_table IS NOT NULL
         ORDER BY 1, 2, 3
    LOOP
        IF to_regclass(format('%I.%I', t.target_schema, t.target_table)) IS NULL THEN
            CONTINUE;
        END IF;
        v_stmt := format('GRANT USAGE ON SCHEMA %I TO %I', t.target_schema, p_role);
        EXECUTE v_stmt;
        v_done := v_done || v_stmt;
        v_stmt := format('GRANT SELECT ON %I.%I TO %I', t.target_schema, t.target_table, p_role);
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

-- Let p_role drain the queues, recount declared counters, reset them (TRUNCATE
-- of a counted table), purge old quota windows and read everything the
-- application reads. The tables of declared counters are granted too: SELECT
-- on source tables (recount reads the truth from them), SELECT and UPDATE of
-- the counter column on parent tables (drain and recount write it). Returns
-- the GRANT statements run. Idempotent; run again after declaring counters.
CREATE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
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

-- Take back every right on pgcounters' own objects from p_role (rights on user
-- tables granted by grant_app / grant_worker are left: they are the tables'
-- owners' to revoke). Returns the REVOKE statements run.
CREATE FUNCTION pgcounters.revoke_role(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgcounters._for_role(p_role, ARRAY[
        'REVOKE ALL ON ALL TABLES IN SCHEMA pgcounters FROM %I',
        'REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgcounters FROM %I',
        'REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgcounters FROM %I',
        'REVOKE ALL ON SCHEMA pgcounters FROM %I'
    ]);
END;
$$;

REVOKE EXECUTE ON FUNCTION pgcounters.add_direct(integer[], text[], bigint[]),
    pgcounters._for_role(text, text[]), pgcounters.grant_app(text), pgcounters.grant_worker(text), pgcounters.revoke_role(text)
    FROM PUBLIC;
