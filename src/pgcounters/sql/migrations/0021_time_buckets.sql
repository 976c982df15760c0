-- Version 21: counters per period (time buckets).
--
-- A declared counter may count per key per period (hour, day, week, month) of a
-- timestamp column, in an IANA time zone: the period is the last part of its key,
-- the local date a day, week (Monday) or month starts on, or the UTC instant an hour
-- starts at ('2026-03-29T01:00:00Z'). Its spec (pgcounters.specs.definition ->
-- 'bucket') says the period, the zone and how many periods are kept.
--
-- * bucket_date / bucket_hour: the key part of a value, whatever the session's
--   TimeZone (the triggers, verify and recount key through them).
-- * bucket_periods, bucket_text, bucket_horizon: the periods of a range, a period's
--   key part, the first period kept.
-- * get_range, get_series, top_range: exact reads over a range, in one statement.
-- * drop_expired_buckets: the worker's retention, without waiting on a row.
-- * grant_app gives the key functions and the reads, grant_worker also the retention.

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
            USING ERRCODE = 'invalid_parameter_value';
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
             GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT p_n;
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
             GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT p_n;
    END IF;
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
    v_part integer;
    v_first text;
    v_left bigint := p_limit;
    v_done bigint;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit must be a positive number of values, got %',
            coalesce(p_limit::text, 'NULL') USING ERRCODE = 'invalid_parameter_value';
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
        v_part := s.parts;
        v_first := pgcounters.bucket_text(s.period, s.zone,
                       pgcounters.bucket_horizon(s.period, s.zone, s.keep));
        DELETE FROM pgcounters.counters AS c
         WHERE c.target_id = s.id
           AND c.key IN (SELECT x.key FROM pgcounters.counters AS x
                          WHERE x.target_id = s.id
                            AND x.key[v_part] COLLATE "C" < v_first COLLATE "C"
                          ORDER BY x.key LIMIT v_left FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS v_done = ROW_COUNT;
        v_left := v_left - v_done;
    END LOOP;
    RETURN p_limit - v_left;
END;
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
            ' pgcounters.top_range(text, timestamptz, timestamptz, bigint) TO %I'])
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

CREATE OR REPLACE FUNCTION pgcounters.grant_app(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_app_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_app_sql_interface(p_role) || pgcounters._grant_app_sliding(p_role)
           || pgcounters._grant_app_generic(p_role)
           || pgcounters._grant_app_buckets(p_role)
$$;

CREATE OR REPLACE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_worker_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_worker_sql_interface(p_role)
           || pgcounters._grant_worker_sliding(p_role)
           || pgcounters._grant_worker_direct_changes(p_role)
           || pgcounters._grant_worker_buckets(p_role)
           || pgcounters._grant_worker_read_tables(p_role)
$$;

-- Roles granted before this version get the same rights: the triggers of a counter per
-- period call the key functions as the writer, so every application role (SELECT on
-- quota_usage, which grant_app gives since version 6) may call them; every worker role
-- (DELETE on quota_usage, which grant_worker alone gives) also drops expired periods and
-- reads the tables of paths and generic relations.
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
            PERFORM pgcounters._grant_app_buckets(r.rolname);
        ELSE
            PERFORM pgcounters._grant_worker_buckets(r.rolname);
            PERFORM pgcounters._grant_worker_read_tables(r.rolname);
        END IF;
    END LOOP;
END;
$$;

-- No function of this version is executable by PUBLIC.
REVOKE EXECUTE ON FUNCTION pgcounters.bucket_date(timestamptz, text, text),
    pgcounters.bucket_date(timestamp, text, text), pgcounters.bucket_date(date, text, text),
    pgcounters.bucket_hour(timestamptz, text), pgcounters.bucket_hour(timestamp, text),
    pgcounters.bucket_hour(date, text), pgcounters.bucket_text(text, text, timestamptz),
    pgcounters.bucket_periods(text, text, timestamptz, timestamptz),
    pgcounters.bucket_horizon(text, text, integer), pgcounters._bucket(text),
    pgcounters._check_range(text, timestamptz, timestamptz),
    pgcounters._bucket_prefix(pgcounters.targets, text[]),
    pgcounters._exact_values(pgcounters.targets, text[]),
    pgcounters.get_series(text, text[], timestamptz, timestamptz),
    pgcounters.get_range(text, text[], timestamptz, timestamptz),
    pgcounters.top_range(text, timestamptz, timestamptz, bigint),
    pgcounters.drop_expired_buckets(integer),
    pgcounters._grant_app_buckets(text), pgcounters._grant_worker_buckets(text),
    pgcounters._grant_worker_read_tables(text)
    FROM PUBLIC;
