-- Proxy functions for counters and quotas sharded over several PostgreSQL servers
-- through PL/Proxy. Installed on the proxy database (not on the shards) by
-- pgcounters.sharding.install_proxy, after it has created the PL/Proxy cluster
-- "pgcounters_shards" (a foreign server whose options p0, p1, ... are the shards'
-- connection strings; PL/Proxy needs a power of two of them). Every shard has the
-- pgcounters schema installed as usual, unchanged.
--
-- Routing:
-- * a counter's delta and value live on the shard of hashtext(name || ' ' || key),
--   the key canonicalised first (as pgcounters' clients do: '007' and '7' are one
--   bigint key), so one counter is spread over every shard by key;
-- * a quota's usage lives on the shard of hashtext(subject);
-- * declarations (counters, quotas, limits) are made on every shard.
--
-- What is atomic: one call on one shard. incr_many is refused (SQLSTATE PCS01)
-- when its increments belong to more than one shard; a declaration made on every
-- shard is not atomic across them (each is idempotent: run it again).

CREATE SCHEMA IF NOT EXISTS pgcounters_proxy;

CREATE TABLE IF NOT EXISTS pgcounters_proxy.settings (
    partitions integer NOT NULL CHECK (partitions > 0 AND partitions & (partitions - 1) = 0)
);

-- key types of counters, read from the first shard on first use
CREATE TABLE IF NOT EXISTS pgcounters_proxy.key_types (
    name      text PRIMARY KEY,
    key_types text[] NOT NULL
);

-- ---------------------------------------------------------------------------
-- Remote calls (PL/Proxy)
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgcounters_proxy._remote_key_types(p_name text) RETURNS text[]
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON 0;
    SELECT (SELECT key_types FROM pgcounters.targets WHERE name = p_name);
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy._incr(
    p_hash integer, p_name text, p_key text[], p_delta bigint) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON p_hash;
    SELECT pgcounters.incr(p_name, p_key, p_delta);
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy._incr_many(
    p_hash integer, p_names text[], p_keys text[], p_deltas bigint[]) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON p_hash;
    SELECT count(*) FROM unnest(p_names, p_keys, p_deltas) AS u(n, k, d),
           LATERAL pgcounters.incr(u.n, u.k::text[], u.d) AS r;
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy._get(
    p_hash integer, p_name text, p_key text[]) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON p_hash;
    SELECT pgcounters.get(p_name, p_key);
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy._get_many(
    p_hashes integer[], p_name text, p_keys text[]) RETURNS TABLE (key text, value bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    SPLIT p_hashes, p_keys;
    RUN ON p_hashes;
    SELECT k AS key, pgcounters.get(p_name, k::text[]) AS value FROM unnest(p_keys) AS k;
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy._top(p_name text, p_n bigint)
RETURNS TABLE (key text[], value bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON ALL;
    SELECT c.key AS key, c.value AS value
      FROM pgcounters.counters AS c JOIN pgcounters.targets AS t ON t.id = c.target_id
     WHERE t.name = p_name
       AND pgcounters._kept(c.key[cardinality(c.key)], (SELECT pgcounters._first_kept(x.id)
                                      FROM pgcounters.targets AS x WHERE x.name = p_name))
     ORDER BY c.band DESC, c.value DESC, c.key COLLATE "C"
     LIMIT p_n;
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy._drain_batch(p_limit integer, p_unlogged boolean)
RETURNS TABLE (deltas bigint, keys bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON ALL;
    SELECT d.deltas AS deltas, d.keys AS keys FROM pgcounters.drain_batch(p_limit, p_unlogged) AS d;
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy.create_counter(
    p_name text, p_key_types text[] DEFAULT '{}', p_mode text DEFAULT 'queued')
RETURNS SETOF integer
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON ALL;
    SELECT pgcounters.create_counter(p_name, p_key_types, p_mode);
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy._drop_counter(p_name text) RETURNS SETOF boolean
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON ALL;
    SELECT pgcounters.drop_counter(p_name);
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy.define_quota(
    p_name text,
    p_default_limit bigint DEFAULT NULL,
    p_period text DEFAULT 'day',
    p_window_seconds bigint DEFAULT NULL,
    p_time_zone text DEFAULT 'UTC',
    p_log_calls boolean DEFAULT false
) RETURNS SETOF integer
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON ALL;
    SELECT pgcounters.define_quota(
        p_name, p_default_limit, p_period, p_window_seconds, p_time_zone, p_log_calls);
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy.set_limit(
    p_quota text,
    p_subject text,
    p_calls bigint,
    p_from timestamptz DEFAULT NULL,
    p_until timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON hashtext(p_subject);
    SELECT pgcounters.set_limit(p_quota, p_subject, p_calls, p_from, p_until);
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy.register_call(
    p_quota text,
    p_subject text,
    p_cost bigint DEFAULT 1,
    p_at timestamptz DEFAULT NULL,
    p_details jsonb DEFAULT NULL,
    OUT allowed boolean,
    OUT used bigint,
    OUT attempts bigint,
    OUT call_limit bigint,
    OUT window_start timestamptz,
    OUT window_end timestamptz,
    OUT retry_after double precision
)
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON hashtext(p_subject);
    SELECT r.allowed, r.used, r.attempts, r.call_limit, r.window_start, r.window_end,
           r.retry_after
      FROM pgcounters.register_call(p_quota, p_subject, p_cost, p_at, p_details) AS r;
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy.quota_status(
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
LANGUAGE plproxy AS $$
    CLUSTER 'pgcounters_shards';
    RUN ON hashtext(p_subject);
    SELECT s.used, s.attempts, s.rejected, s.call_limit, s.window_start, s.window_end
      FROM pgcounters.quota_status(p_quota, p_subject, p_at) AS s;
$$;

-- ---------------------------------------------------------------------------
-- Keys and routing (local to the proxy)
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgcounters_proxy._types(p_name text) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_types text[];
BEGIN
    SELECT key_types INTO v_types FROM pgcounters_proxy.key_types WHERE name = p_name;
    IF NOT FOUND THEN
        v_types := pgcounters_proxy._remote_key_types(p_name);
        IF v_types IS NULL THEN
            RAISE EXCEPTION 'no counter named % is declared', p_name USING ERRCODE = 'PC003';
        END IF;
        INSERT INTO pgcounters_proxy.key_types (name, key_types) VALUES (p_name, v_types)
        ON CONFLICT (name) DO NOTHING;
    END IF;
    RETURN v_types;
END;
$$;

-- The canonical form of a key, as pgcounters' clients write it: each part cast
-- to its type and back to text (DateStyle fixed to ISO).
CREATE OR REPLACE FUNCTION pgcounters_proxy.canonical_key(p_name text, p_key text[])
RETURNS text[]
LANGUAGE plpgsql SET datestyle = 'ISO, YMD' AS $$
DECLARE
    v_types text[] := pgcounters_proxy._types(p_name);
    v_out text[] := '{}';
BEGIN
    IF coalesce(cardinality(p_key), 0) <> coalesce(cardinality(v_types), 0)
       OR array_position(p_key, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'counter % takes a key of (%), got %',
            p_name, array_to_string(v_types, ', '), p_key USING ERRCODE = 'PC004';
    END IF;
    FOR i IN 1 .. coalesce(cardinality(v_types), 0) LOOP
        v_out := v_out || CASE v_types[i]
            WHEN 'bigint' THEN p_key[i]::bigint::text
            WHEN 'uuid' THEN p_key[i]::uuid::text
            WHEN 'date' THEN p_key[i]::date::text
            ELSE p_key[i]
        END;
    END LOOP;
    RETURN v_out;
EXCEPTION WHEN data_exception THEN
    RAISE EXCEPTION 'counter %: invalid key %: %', p_name, p_key, SQLERRM USING ERRCODE = 'PC004';
END;
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy._route(p_name text, p_key text[]) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT hashtext(p_name || ' ' || p_key::text)
$$;

-- the shard (partition number) a hash goes to, as PL/Proxy computes it
CREATE OR REPLACE FUNCTION pgcounters_proxy._partition(p_hash integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT p_hash & (partitions - 1) FROM pgcounters_proxy.settings
$$;

-- ---------------------------------------------------------------------------
-- The API
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgcounters_proxy.incr(
    p_name text, p_key text[] DEFAULT '{}', p_delta bigint DEFAULT 1) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_key text[] := pgcounters_proxy.canonical_key(p_name, p_key);
BEGIN
    RETURN pgcounters_proxy._incr(pgcounters_proxy._route(p_name, v_key), p_name, v_key, p_delta);
END;
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy.get(p_name text, p_key text[] DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_key text[] := pgcounters_proxy.canonical_key(p_name, p_key);
BEGIN
    RETURN pgcounters_proxy._get(pgcounters_proxy._route(p_name, v_key), p_name, v_key);
END;
$$;

-- Exact values of many keys of one counter (each key an array literal: '{42}'),
-- in the order given: one statement per shard; each value is exact as of its
-- shard's snapshot.
CREATE OR REPLACE FUNCTION pgcounters_proxy.get_many(p_name text, p_keys text[])
RETURNS TABLE (key text[], value bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_keys text[] := '{}';
    v_hashes integer[] := '{}';
    v_key text[];
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_keys), 0) LOOP
        v_key := pgcounters_proxy.canonical_key(p_name, p_keys[i]::text[]);
        v_keys := v_keys || v_key::text;
        v_hashes := v_hashes || pgcounters_proxy._route(p_name, v_key);
    END LOOP;
    IF cardinality(v_keys) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
        SELECT w.k::text[], coalesce(r.value, 0)::bigint
          FROM unnest(v_keys) WITH ORDINALITY AS w(k, ord)
          LEFT JOIN (SELECT DISTINCT ON (g.key) g.key, g.value
                       FROM pgcounters_proxy._get_many(v_hashes, p_name, v_keys) AS g) AS r
            ON r.key = w.k
         ORDER BY w.ord;
END;
$$;

-- The n keys with the highest stored values of a named counter, over every shard.
CREATE OR REPLACE FUNCTION pgcounters_proxy.top(p_name text, p_n bigint DEFAULT 10)
RETURNS TABLE (key text[], value bigint)
LANGUAGE sql AS $$
    SELECT t.key, t.value FROM pgcounters_proxy._top(p_name, p_n) AS t
     ORDER BY t.value DESC, t.key COLLATE "C"
     LIMIT p_n
$$;

-- Several increments in one transaction: only when they all belong to one shard.
CREATE OR REPLACE FUNCTION pgcounters_proxy.incr_many(
    p_names text[], p_keys text[], p_deltas bigint[]) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_keys text[] := '{}';
    v_key text[];
    v_hash integer;
    v_first integer;
BEGIN
    IF coalesce(cardinality(p_names), 0) <> coalesce(cardinality(p_keys), 0)
       OR coalesce(cardinality(p_names), 0) <> coalesce(cardinality(p_deltas), 0) THEN
        RAISE EXCEPTION 'incr_many needs as many keys and deltas as counter names'
            USING ERRCODE = 'PC004';
    END IF;
    IF coalesce(cardinality(p_names), 0) = 0 THEN
        RETURN 0;
    END IF;
    FOR i IN 1 .. cardinality(p_names) LOOP
        v_key := pgcounters_proxy.canonical_key(p_names[i], p_keys[i]::text[]);
        v_keys := v_keys || v_key::text;
        v_hash := pgcounters_proxy._route(p_names[i], v_key);
        IF v_first IS NULL THEN
            v_first := v_hash;
        ELSIF pgcounters_proxy._partition(v_hash) <> pgcounters_proxy._partition(v_first) THEN
            RAISE EXCEPTION 'incr_many: the increments belong to more than one shard, and a '
                            'transaction cannot span shards; increment them one by one, or '
                            'group them by shard (pgcounters_proxy.shard_of)'
                USING ERRCODE = 'PCS01';
        END IF;
    END LOOP;
    RETURN pgcounters_proxy._incr_many(v_first, p_names, v_keys, p_deltas);
END;
$$;

-- The shard (0-based) that holds a counter's key.
CREATE OR REPLACE FUNCTION pgcounters_proxy.shard_of(p_name text, p_key text[] DEFAULT '{}')
RETURNS integer
LANGUAGE sql AS $$
    SELECT pgcounters_proxy._partition(
        pgcounters_proxy._route(p_name, pgcounters_proxy.canonical_key(p_name, p_key)))
$$;

CREATE OR REPLACE FUNCTION pgcounters_proxy.drop_counter(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_dropped boolean;
BEGIN
    SELECT bool_or(d) INTO v_dropped FROM pgcounters_proxy._drop_counter(p_name) AS d;
    DELETE FROM pgcounters_proxy.key_types WHERE name = p_name;
    RETURN coalesce(v_dropped, false);
END;
$$;

-- Drain every shard until its queues are empty (each batch commits on its shard).
-- Returns the deltas applied. Several drainers may run at once, as on one server.
CREATE OR REPLACE FUNCTION pgcounters_proxy.drain(p_batch integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_total bigint := 0;
    v_round bigint;
BEGIN
    LOOP
        SELECT coalesce(sum(d.deltas), 0) INTO v_round
          FROM (SELECT deltas FROM pgcounters_proxy._drain_batch(p_batch, false)
                UNION ALL
                SELECT deltas FROM pgcounters_proxy._drain_batch(p_batch, true)) AS d;
        EXIT WHEN v_round = 0;
        v_total := v_total + v_round;
    END LOOP;
    RETURN v_total;
END;
$$;
