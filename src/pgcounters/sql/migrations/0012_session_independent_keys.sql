-- pgcounters schema, version 12: keys that no session setting can change.
--
-- A key's text is what the queues and the counters table store and compare, so
-- it must be the same whatever the writing session has SET. Of the key types,
-- only a date has a setting-dependent text (DateStyle: '21/11/2026' in an
-- 'SQL, DMY' session), and only a date is derived in a setting-dependent way
-- (a timestamptz cast to date takes the session's TimeZone; a text parsed as a
-- date takes DateStyle's field order). The triggers and the truth queries of
-- declared counters key dates through the two functions below.

-- The date that keys a value: a date as it is, a timestamp's date, the date of
-- a timestamptz in UTC (whatever the session's TimeZone). The first three are
-- plain SQL expressions that the planner inlines: no function call per row.
CREATE FUNCTION pgcounters.date_key(p_value date) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT p_value $$;

CREATE FUNCTION pgcounters.date_key(p_value timestamp) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT p_value::date $$;

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

-- ---------------------------------------------------------------------------
-- Pausing counting is a right, not a setting anyone may SET
-- ---------------------------------------------------------------------------
-- A session that sets pgcounters.paused writes rows that no counter sees. That
-- is meant for a bulk import followed by a recount, run by the schema's owner
-- (or a superuser) or by a role granted it with grant_pause; for any other
-- role the setting is refused at the first counted write, instead of being
-- silently obeyed.
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

CREATE OR REPLACE FUNCTION pgcounters.is_paused(p_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN coalesce(s, '') = '' THEN false
        WHEN s = 'all' OR p_name = ANY (string_to_array(s, ',')) THEN pgcounters._check_may_pause()
        ELSE false
    END
      FROM (SELECT current_setting('pgcounters.paused', true) AS s) AS setting
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

-- ---------------------------------------------------------------------------
-- Flush records: no caller decides how long they are kept
-- ---------------------------------------------------------------------------
-- A buffer's flush records are what makes a flush in doubt count once: a
-- record deleted while its flush may still be retried lets it count twice.
-- Version 4's record_flush (a SECURITY DEFINER function the application role
-- may call) deleted the buffer's records older than a retention the caller
-- chose: '-100 years' deleted them all. The retention is now the owner's, in
-- pgcounters.buffer_settings (7 days unless changed). The caller still names
-- the flushes it holds in doubt (p_keep): that list can only keep records.

CREATE TABLE pgcounters.buffer_settings (
    one_row boolean PRIMARY KEY DEFAULT true CHECK (one_row),
    retention interval NOT NULL DEFAULT '7 days' CHECK (retention >= interval '1 hour')
);
INSERT INTO pgcounters.buffer_settings DEFAULT VALUES;

DROP FUNCTION pgcounters.record_flush(text, text, integer, numeric, interval, text[]);

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

REVOKE EXECUTE ON FUNCTION pgcounters.record_flush(text, text, integer, numeric, text[])
    FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- The application role: only what counters need, and all of it revocable
-- ---------------------------------------------------------------------------
-- Version 6 granted SELECT on the whole parent table of a column counter (a
-- users table's password hash included) and USAGE on its schema. The
-- application reads a counter column by its parent's key: SELECT on those two
-- columns is enough, and USAGE on a schema of its own tables it already has.
ALTER FUNCTION pgcounters._grant_app_v6(text) RENAME TO _grant_app_base;

-- The rights every application role gets (grant_app adds those of later
-- versions' objects).
CREATE OR REPLACE FUNCTION pgcounters._grant_app_base(p_role text) RETURNS text[]
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

CREATE OR REPLACE FUNCTION pgcounters.grant_app(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgcounters._grant_app_base(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT SELECT ON pgcounters.quarantine, pgcounters.retries,'
            ' pgcounters.dropped_targets TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters._canonical_key(pgcounters.targets, text[]) TO %I'
    ]);
END;
$$;

-- Take back every right grant_app and grant_worker gave p_role: on pgcounters'
-- own objects, the right to pause, and the column rights on the parent tables
-- of column counters (column rights only: a table-wide right the role holds
-- for its own work is not pgcounters' to take). The table-wide SELECT that
-- grant_worker gives on source tables stays (see docs/security.md).
CREATE OR REPLACE FUNCTION pgcounters.revoke_role(p_role text) RETURNS text[]
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

-- as in version 6: no function of pgcounters is PUBLIC's to run; the
-- application role is granted what its triggers and reads call
REVOKE EXECUTE ON FUNCTION pgcounters.grant_pause(text), pgcounters.grant_app(text),
    pgcounters.revoke_role(text), pgcounters._check_may_pause(), pgcounters.is_paused(text),
    pgcounters.date_key(date), pgcounters.date_key(timestamp), pgcounters.date_key(timestamptz),
    pgcounters.date_key(text), pgcounters.date_text(date)
    FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Schema changes that would break a declared counter
-- ---------------------------------------------------------------------------
-- A declared counter's triggers name the columns of its source table. Renaming
-- or dropping one of them made every later write to the table fail with a raw
-- UndefinedColumn; changing a summed column from an integer type to numeric
-- made each statement's delta round silently. Each recorded spec now carries a
-- probe: a query that reads exactly what its triggers read (condition, key
-- parts, the summed value as an integer), planned but never run. An event
-- trigger plans the probes of the counters installed on a table after every
-- ALTER TABLE of it and refuses the change that breaks one. Creating an event
-- trigger needs a superuser: installed by another role, the guard is left out
-- and `drift` reports such counters as broken instead.

-- The summed value, refused at planning unless it is of an integer type
-- (numeric and floating-point values have no implicit cast to bigint).
CREATE FUNCTION pgcounters.integer_value(p_value bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT p_value $$;

ALTER TABLE pgcounters.specs ADD COLUMN probe text;

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
           -- its triggers installed on p_table, the table it counts ...
           AND (EXISTS (
               SELECT 1 FROM pg_catalog.pg_trigger AS t
                 JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid
                WHERE t.tgrelid = p_table AND NOT t.tgisinternal
                  AND position(format('-- pgcounters spec fingerprint=%s event=insert name=%s',
                                      sp.fingerprint, sp.name) IN p.prosrc) > 0)
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

REVOKE EXECUTE ON FUNCTION pgcounters.integer_value(bigint), pgcounters.broken_specs(regclass)
    FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Partitions and inheritance children of counted tables
-- ---------------------------------------------------------------------------
-- A statement-level trigger fires for the table a statement names: rows
-- written straight into a partition (or an inheritance child) of a counted
-- table went uncounted, and the rows of a partition attached, detached or
-- truncated alone changed the truth without any row being written. The
-- counters now follow the whole tree: every descendant of a counted table
-- carries the counter's INSERT, UPDATE and DELETE triggers (the same functions
-- as the table's own), and a BEFORE TRUNCATE trigger that takes its rows'
-- contribution away. A table that joins the tree adds its rows' contribution,
-- one that leaves takes it away (the spec's rows_delta statement). Dropping a
-- descendant that still belongs to the tree is refused (its rows would leave
-- the counts unseen): detach it first.

ALTER TABLE pgcounters.specs ADD COLUMN rows_delta text;

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
-- counted table itself resets the counter after it, as before).
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
LANGUAGE plpgsql AS $$
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
LANGUAGE plpgsql AS $$
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

-- they run for whoever creates, alters or drops a table; the probes and rows
-- they read are the owner's (pgcounters.specs is written by the owner only)
ALTER FUNCTION pgcounters._guard_ddl()
    SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp;
ALTER FUNCTION pgcounters._guard_drop()
    SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp;

-- PostgreSQL lets only a superuser create an event trigger: installed by
-- another role, the guards are left out and drift reports what they would
-- have caught (broken counters, descendants not counted).
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

REVOKE EXECUTE ON FUNCTION pgcounters._installed_on_source(text), pgcounters._descendants(oid),
    pgcounters.follow_descendants(text, boolean), pgcounters._truncate_descendant(),
    pgcounters._guard_ddl(), pgcounters._guard_drop() FROM PUBLIC;

-- TRUNCATE of a counted table resets its counter (version 9's reset_target).
-- TRUNCATE ONLY of a table whose inheritance children keep rows leaves those
-- rows counting: zero is not the truth then, and the TRUNCATE is refused.
CREATE OR REPLACE FUNCTION pgcounters.reset_target(p_target_id integer) RETURNS void
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

-- ---------------------------------------------------------------------------
-- Writes made with session_replication_role = replica
-- ---------------------------------------------------------------------------
-- PostgreSQL fires ordinary triggers only in origin mode: a session with
-- session_replication_role = replica (logical replication's apply worker,
-- some restore and copy tools) writes rows no counter sees. Each counter
-- chooses: 'flag' (the default) keeps its triggers in origin mode and records
-- that it missed writes, so drift and status report it stale until a recount;
-- 'count' fires its triggers in every mode (ENABLE ALWAYS), for a replica of
-- the counted tables whose counters are not replicated with them.

ALTER TABLE pgcounters.specs ADD COLUMN replica_writes text NOT NULL DEFAULT 'flag'
    CHECK (replica_writes IN ('flag', 'count'));

-- Counters that missed writes, until a recount of them starts.
CREATE TABLE pgcounters.stale_counters (
    name       text PRIMARY KEY,
    reason     text NOT NULL,
    since      timestamptz NOT NULL DEFAULT now(),
    statements bigint NOT NULL DEFAULT 1
);

-- Fires, in every mode, for a statement of a replica-mode session on a counted
-- table (or one of its descendants): each counter of the table that does not
-- count such writes is recorded as stale.
CREATE FUNCTION pgcounters._replica_write() RETURNS trigger
LANGUAGE plpgsql AS $$
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

ALTER FUNCTION pgcounters._replica_write()
    SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp;

-- Bring every counted table in line: the watch triggers on each table that
-- carries a counter's triggers (and on no other), and each counter's triggers
-- enabled in origin mode ('flag') or in every mode ('count').
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
        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER pgc_replica_watch', r.tbl);
        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER pgc_replica_watch_trn', r.tbl);
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

-- the worker clears a counter's stale mark when it recounts it, and runs backfills
ALTER FUNCTION pgcounters.grant_worker(text) RENAME TO _grant_worker_v8;

CREATE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgcounters._grant_worker_v8(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT DELETE ON pgcounters.stale_counters TO %I',
        -- the worker runs backfills (version 9): it moves and deletes their rows
        'GRANT SELECT, UPDATE, DELETE ON pgcounters.backfills TO %I'
    ]);
END;
$$;

REVOKE EXECUTE ON FUNCTION pgcounters._replica_write(), pgcounters._sync_replica_writes(),
    pgcounters.set_replica_writes(text, text), pgcounters.grant_worker(text),
    pgcounters._grant_worker_v8(text), pgcounters._grant_app_base(text) FROM PUBLIC;
