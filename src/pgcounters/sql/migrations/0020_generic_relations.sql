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
-- * drain_queue and _drain_columns (same signatures) note a batch's changes with json
--   instead of jsonb, spliced onto the notes as text: the same JSON array, a third of
--   the cost.

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

-- The direct triggers of counter columns note the keys of the parent rows a statement
-- changed (in the key column's type), while a reporting worker is alive. A
-- two-dimensional array holds a named counter's keys instead, each as the text of its
-- array, one per row (ARRAY[['{42}'], ['{7}']]): the client's writes of direct named
-- counters.
CREATE FUNCTION pgcounters.note_direct(p_target integer, p_keys anyarray) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
BEGIN
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
           || pgcounters._grant_app_sql_interface(p_role) || pgcounters._grant_app_sliding(p_role)
           || pgcounters._grant_app_generic(p_role)
$$;

CREATE OR REPLACE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_worker_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_worker_sql_interface(p_role)
           || pgcounters._grant_worker_sliding(p_role)
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
        ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
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
        ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
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

REVOKE EXECUTE ON FUNCTION pgcounters._direct_listened(), pgcounters.listen_direct_changes(),
    pgcounters.unlisten_direct_changes(), pgcounters.take_direct_changes(integer),
    pgcounters._grant_worker_direct_changes(text), pgcounters._grant_app_generic(text),
    pgcounters.note_direct(integer, anyarray), pgcounters.object_id_bigint(text),
    pgcounters.object_id_uuid(text), pgcounters._cast_or_null(text, regtype) FROM PUBLIC;

-- Roles granted before this version get the same rights: the triggers of a direct
-- counter note its changes as the writer, so every application role (SELECT on
-- quota_usage, which grant_app gives since version 6) may call note_direct and read
-- text object ids; every worker role (DELETE on quota_usage, which grant_worker alone
-- gives) also takes the change reports.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT o.rolname, a.privilege_type
          FROM pg_catalog.pg_class AS c
         CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
          JOIN pg_catalog.pg_roles AS o ON o.oid = a.grantee
         WHERE c.oid = 'pgcounters.quota_usage'::regclass
           AND a.grantee <> c.relowner
           AND a.privilege_type IN ('SELECT', 'DELETE')
         ORDER BY 1, 2
    LOOP
        IF r.privilege_type = 'SELECT' THEN
            PERFORM pgcounters._grant_app_generic(r.rolname);
        ELSE
            PERFORM pgcounters._grant_worker_direct_changes(r.rolname);
        END IF;
    END LOOP;
END;
$$;

-- drain_queue of version 17, noting its changes with json (same notes, cheaper).
CREATE OR REPLACE FUNCTION pgcounters.drain_queue(
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
                       FILTER (WHERE $3 AND t.target_table IS NULL AND s.delta <> 0)
              FROM summed s
              LEFT JOIN pgcounters.targets t ON t.id = s.target_id
        $q$, v_queue)
        INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed, v_changes
        USING p_limit, v_broken, v_note;
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

-- _drain_columns of version 17, noting its changes with json.
CREATE OR REPLACE FUNCTION pgcounters._drain_columns(
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
    v_changes json;
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
            -- the first one holds busy and puts its deltas back. A drainer holding this
            -- lock waits for nothing (SKIP LOCKED below), so the wait is always short.
            PERFORM pg_advisory_xact_lock(hashtext('pgcounters.parents'), hashtext(v_table));
        END IF;
        PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
        EXECUTE format($q$
            WITH d AS MATERIALIZED (
                SELECT b.key::%1$s AS key, min(b.key) AS text_key, sum(b.delta) AS delta,
                       sum(b.n) AS n, min(b.created_at) AS created_at
                  FROM unnest($1::pgcounters.batch_delta[]) AS b
                 WHERE b.target_id = $2
                 GROUP BY 1
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
                   (SELECT json_agg(json_build_array($3::text, ARRAY[l.key::text]))
                      FROM locked AS l WHERE $4)
            $q$,
            t.key_types[1]::regtype, t.target_key_column, v_table, t.target_column, v_queue,
            -- a sum of decimals: the deltas are units of 10^-scale (version 13)
            CASE WHEN t.scale IS NULL THEN 'd.delta::bigint'
                 ELSE format('pgcounters.unscaled(d.delta, %s)', t.scale) END)
        INTO v_applied, v_busy, v_first, v_changes
        USING p_columns, t.id, t.name, v_note;
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
END;
$$;
