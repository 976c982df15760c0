-- Version 29: a counter's trigger finds its counter's id without a query; a refused
-- overlapping quota limit names both ranges readably; a replay leaves set aside the deltas
-- of a counter that is not declared again.
--
-- Each trigger of a declared counter called ensure_target once per statement: a PL/pgSQL
-- call and a lookup of pgcounters.targets by name, the largest part of what one queued
-- counter adds to a single-row INSERT after the queue row itself. The ids of the integer
-- counters are now listed in the body of one SQL function, pgcounters._target_id, which a
-- trigger calls with the counter's identity as a constant: PostgreSQL evaluates it when it
-- plans the trigger's statement, so the plan holds the id, and plans again when the body
-- changes. A trigger still calls ensure_target when its counter is not listed (a new
-- database, a counter created since the last refresh, another definition).
--
-- The list is written by refresh_target_ids, under a lock that serialises its writers,
-- from the targets as a read-committed statement sees them after the lock; drop_counter
-- refreshes it before it commits, so no listed id outlives its counter. Installs refresh
-- it after they create their targets; a worker refreshes it every few seconds (without
-- waiting for the lock) for counters created by a first write. A session whose plan still
-- holds an id its transaction started with (a drop committed meanwhile) writes deltas of a
-- dropped counter, which the drain sets aside under the counter's name, as it does for a
-- client that cached an id.
--
-- Every role may execute _target_id (the triggers run as the writer, and a write must not
-- fail for a right its role was never given); worker roles may run refresh_target_ids,
-- those granted before this version too.

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

-- drop_counter of version 1, refreshing the list of ids before it commits.
CREATE OR REPLACE FUNCTION pgcounters.drop_counter(p_name text) RETURNS boolean
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

-- The worker's right to refresh the list (part of grant_worker).
CREATE FUNCTION pgcounters._grant_worker_target_ids(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON FUNCTION pgcounters.refresh_target_ids(boolean) TO %I'])
$$;

CREATE OR REPLACE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_worker_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_worker_sql_interface(p_role)
           || pgcounters._grant_worker_sliding(p_role)
           || pgcounters._grant_worker_direct_changes(p_role)
           || pgcounters._grant_worker_buckets(p_role)
           || pgcounters._grant_worker_read_tables(p_role)
           || pgcounters._grant_worker_target_ids(p_role)
$$;

REVOKE EXECUTE ON FUNCTION
    pgcounters._target_identity(text, text[], text, text, text, text, text),
    pgcounters.refresh_target_ids(boolean), pgcounters._grant_worker_target_ids(text)
    FROM PUBLIC;

-- Every trigger of a counted table calls _target_id as the role writing the table,
-- whoever granted that role its rights: a write must never fail for want of this right.
-- It reads no table and returns ids only for identities a caller already knows; USAGE
-- on the schema still gates it.
GRANT EXECUTE ON FUNCTION pgcounters._target_id(text) TO PUBLIC;

-- Worker roles granted before this version (DELETE on quota_usage, which grant_worker
-- alone gives) may refresh the list too.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT o.rolname
          FROM pg_catalog.pg_class AS c
         CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
          JOIN pg_catalog.pg_roles AS o ON o.oid = a.grantee
         WHERE c.oid = 'pgcounters.quota_usage'::regclass
           AND a.grantee <> c.relowner
           AND a.privilege_type = 'DELETE'
         ORDER BY 1
    LOOP
        PERFORM pgcounters._grant_worker_target_ids(r.rolname);
    END LOOP;
END;
$$;

-- set_limit of version 3, its refusal of an overlapping limit written as the command line
-- writes a limit's range ("[2026-01-01 00:00:00+00, inf)", not "(,)").
-- A limit's time range as the command line prints it: -inf and inf for unbounded ends
-- (PostgreSQL's own text of an unbounded range is "(,)").
CREATE FUNCTION pgcounters._range_text(p_range tstzrange) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_range IS NULL THEN NULL
                ELSE format('[%s, %s)', coalesce(lower(p_range)::text, '-inf'),
                            coalesce(upper(p_range)::text, 'inf')) END
$$;

CREATE OR REPLACE FUNCTION pgcounters.set_limit(
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

REVOKE EXECUTE ON FUNCTION pgcounters._range_text(tstzrange) FROM PUBLIC;

-- replay_quarantined of version 8, leaving set aside the deltas of a counter that was
-- dropped and not declared again (they went back to the queue and were set aside again
-- by the next drain, while the replay said they were moved back).
CREATE OR REPLACE FUNCTION pgcounters.replay_quarantined(
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

-- The counters that exist when this version is installed are listed at once.
SELECT pgcounters.refresh_target_ids();
