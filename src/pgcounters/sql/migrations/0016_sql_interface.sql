-- Version 16: the SQL interface, for those who use pgcounters from psql alone.
--
-- * pgcounters.top(name, n): the n highest stored values of a counter, in the
--   order of the Python client's top (value descending, then key).
-- * pgcounters.get_many(name, keys): exact values of many keys, in the order given.
-- * CALL pgcounters.drain_all(): drains both queues to empty, one transaction per
--   batch, through drain_queue (which never waits on an application's rows).
-- * grant_app gives top and get_many, grant_worker also drain_all; revoke_role
--   takes back procedures too.
-- * btree_gist moves out of the schema pgcounters into pgcounters_btree_gist, so
--   that `\df pgcounters.*` lists pgcounters' own functions only. The exclusion
--   constraint of quota_limits names its operator classes by oid: it is unchanged.

CREATE SCHEMA IF NOT EXISTS pgcounters_btree_gist;

-- Moving the extension needs the ownership of its objects: a superuser has it. A
-- database owner who created the (trusted) extension owns the extension but not its
-- objects: there the extension is created again in its schema, with the exclusion
-- constraint that uses it, unless something else of the database uses it too (then
-- it stays where it is, said in a NOTICE).
DO $$
BEGIN
    IF (SELECT extnamespace FROM pg_catalog.pg_extension WHERE extname = 'btree_gist')
       IS DISTINCT FROM 'pgcounters'::regnamespace THEN
        RETURN;
    END IF;
    BEGIN
        ALTER EXTENSION btree_gist SET SCHEMA pgcounters_btree_gist;
    EXCEPTION WHEN insufficient_privilege THEN
        BEGIN
            ALTER TABLE pgcounters.quota_limits DROP CONSTRAINT quota_limits_no_overlap;
            DROP EXTENSION btree_gist RESTRICT;
            CREATE EXTENSION btree_gist WITH SCHEMA pgcounters_btree_gist;
            ALTER TABLE pgcounters.quota_limits ADD CONSTRAINT quota_limits_no_overlap
                EXCLUDE USING gist (quota_id WITH =, subject WITH =, valid WITH &&);
        EXCEPTION WHEN dependent_objects_still_exist THEN
            RAISE NOTICE 'pgcounters: btree_gist stays in the schema pgcounters: other '
                         'objects of this database use it';
        END;
    END;
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
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF t.target_table IS NULL THEN
        -- the band is monotonic in the value: this is ORDER BY value DESC, key,
        -- read from the index on (target_id, band DESC)
        RETURN QUERY
            SELECT c.key, pgcounters.unscaled(c.value, coalesce(t.scale, 0))
              FROM pgcounters.counters AS c
             WHERE c.target_id = t.id
             ORDER BY c.band DESC, c.value DESC, c.key
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

-- Drain both queues to empty, committing after every batch (at most batch_size
-- deltas each), the queues taking turns: CALL pgcounters.drain_all(); from psql
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
    i integer;
BEGIN
    IF batch_size IS NULL OR batch_size < 1 THEN
        RAISE EXCEPTION 'batch size must be a positive integer, got %',
            coalesce(batch_size::text, 'NULL')
            USING ERRCODE = 'PC005';
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
            SELECT * INTO r FROM pgcounters.drain_queue(batch_size, v_unlogged);
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

CREATE OR REPLACE FUNCTION pgcounters.grant_app(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_app_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_app_sql_interface(p_role)
$$;

CREATE OR REPLACE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_worker_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_worker_sql_interface(p_role)
$$;

-- revoke_role of version 12, taking back procedures too (ALL FUNCTIONS leaves them).
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

-- No function or procedure of this version is executable by PUBLIC.
REVOKE EXECUTE ON FUNCTION pgcounters.top(text, bigint), pgcounters.get_many(text, text[]),
    pgcounters._grant_app_sql_interface(text), pgcounters._grant_worker_sql_interface(text)
    FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE pgcounters.drain_all(integer, bigint, bigint, bigint) FROM PUBLIC;
