-- Version 20: counters over generic relations, and change reports of direct-mode counters.
--
-- * pgcounters.object_id_bigint(text) and pgcounters.object_id_uuid(text): the id a
--   text "object id" column holds (a generic relation's, e.g. Django's
--   GenericForeignKey), as the cast an ORM's join makes reads it ('7', ' 7' and '007'
--   are 7), NULL where that cast fails: such a row counts nowhere, and never stops the
--   statement that writes it.
-- * Change reports of direct-mode counters: a direct counter changes in the writing
--   transaction, not in a drain batch. While a reporting worker is registered in
--   pgcounters.change_listeners, add_direct (named counters) and the direct triggers
--   of counter columns (through note_direct) add one row per statement and counter to
--   pgcounters.direct_changes, holding the keys it changed. Those rows become visible
--   when the writing transaction commits (never for one that rolls back); the worker
--   takes them with take_direct_changes and reports them as it reports drain batches.
--   Without a registered listener nothing is written.

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

-- The direct triggers of counter columns note the keys of the parent rows a statement
-- changed (in the key column's type), while a reporting worker is registered.
CREATE FUNCTION pgcounters.note_direct(p_target integer, p_keys anyarray) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
BEGIN
    IF p_keys IS NOT NULL AND cardinality(p_keys) > 0
       AND EXISTS (SELECT 1 FROM pgcounters.change_listeners) THEN
        INSERT INTO pgcounters.direct_changes (target_id, keys)
        VALUES (p_target, ARRAY(SELECT ARRAY[k::text]::text FROM unnest(p_keys) AS k));
    END IF;
END;
$$;

-- Register the calling session as a reporting worker (direct counters note their
-- changes from now on), forgetting the registrations of sessions that are gone (a
-- worker killed): returns the number of workers registered.
CREATE FUNCTION pgcounters.listen_direct_changes() RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
BEGIN
    DELETE FROM pgcounters.change_listeners AS l
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity AS a WHERE a.pid = l.pid);
    INSERT INTO pgcounters.change_listeners (pid) VALUES (pg_backend_pid())
        ON CONFLICT (pid) DO NOTHING;
    RETURN (SELECT count(*) FROM pgcounters.change_listeners);
END;
$$;

-- Unregister the calling session; when no reporting worker is left, the changes
-- nobody will report are dropped. Returns the number of workers still registered.
CREATE FUNCTION pgcounters.unlisten_direct_changes() RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    v_left bigint;
BEGIN
    DELETE FROM pgcounters.change_listeners AS l
     WHERE l.pid = pg_backend_pid()
        OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity AS a WHERE a.pid = l.pid);
    v_left := (SELECT count(*) FROM pgcounters.change_listeners);
    IF v_left = 0 THEN
        DELETE FROM pgcounters.direct_changes;
    END IF;
    RETURN v_left;
END;
$$;

-- Take (delete and return) at most p_limit rows of committed direct-mode changes,
-- the oldest first, skipping rows another worker is taking: each changed key once,
-- with its counter's name and key types. The caller reports them after it commits.
CREATE FUNCTION pgcounters.take_direct_changes(p_limit integer DEFAULT 1000)
RETURNS TABLE (name text, key text[], key_types text[])
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
    SELECT DISTINCT t.name, k.key::text[], t.key_types
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

CREATE OR REPLACE FUNCTION pgcounters.grant_app(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_app_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_app_sql_interface(p_role)
           || pgcounters._grant_app_generic(p_role)
$$;

CREATE OR REPLACE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_worker_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_worker_sql_interface(p_role)
           || pgcounters._grant_worker_direct_changes(p_role)
$$;

-- add_direct of version 8, noting the keys it changed while a worker reports changes.
CREATE OR REPLACE FUNCTION pgcounters.add_direct(p_targets integer[], p_keys text[], p_deltas bigint[])
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
            ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
            RETURNING c.value INTO v_value;
            IF p_deltas[1] <> 0 AND EXISTS (SELECT 1 FROM pgcounters.change_listeners) THEN
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
        ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
        RETURNING c.value INTO v_value;
        IF p_deltas[1] <> 0 AND EXISTS (SELECT 1 FROM pgcounters.change_listeners) THEN
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
        ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
        RETURNING c.target_id, c.key, c.value
    )
    SELECT a.value INTO v_value FROM applied AS a ORDER BY a.target_id DESC, a.key DESC LIMIT 1;
    IF EXISTS (SELECT 1 FROM pgcounters.change_listeners) THEN
        -- one row per counter of the call, its keys in one array (version 20)
        INSERT INTO pgcounters.direct_changes (target_id, keys)
        SELECT d.target_id, array_agg(DISTINCT d.key)
          FROM unnest(p_targets, v_keys, p_deltas) AS d(target_id, key, delta)
         WHERE d.delta IS NOT NULL AND d.delta <> 0
         GROUP BY d.target_id;
    END IF;
    RETURN v_value;
END;
$$;

REVOKE EXECUTE ON FUNCTION pgcounters.listen_direct_changes(),
    pgcounters.unlisten_direct_changes(), pgcounters.take_direct_changes(integer),
    pgcounters._grant_worker_direct_changes(text), pgcounters._grant_app_generic(text),
    pgcounters.note_direct(integer, anyarray), pgcounters.object_id_bigint(text),
    pgcounters.object_id_uuid(text), pgcounters._cast_or_null(text, regtype) FROM PUBLIC;
