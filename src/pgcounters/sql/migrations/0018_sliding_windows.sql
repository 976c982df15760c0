-- Version 18: sliding windows for quotas.
--
-- A sliding quota limits the units granted in any span of window_seconds, not
-- in windows with fixed boundaries. The span is divided into buckets of
-- bucket_seconds (aligned to the Unix epoch; bucket_seconds divides
-- window_seconds); a call in bucket b is counted against the units granted in
-- buckets b - n .. b, n = window_seconds / bucket_seconds. That covers the
-- whole span before the call and at most one bucket more: no span of
-- window_seconds ever holds more than the limit, and a refused call would
-- have been granted by an exact log of calls at most bucket_seconds later.
--
-- Each subject has ONE row in quota_sliding_usage holding its buckets as
-- arrays (newest first). register_call decides inside one upsert of that row,
-- from the row as it is once locked, as it does for the other windows: two
-- callers on either side of a bucket boundary still take the same row lock.
-- The row is as large as the number of buckets, whatever the traffic, and the
-- purge deletes the rows whose every bucket has left the window.
--
-- Redefined: define_quota (a new parameter, p_bucket_seconds), drop_quota,
-- register_call, quota_status and purge_quotas (sliding windows beside the
-- others, unchanged for them), grant_app and grant_worker (the new table).

ALTER TABLE pgcounters.quotas DROP CONSTRAINT quotas_period_known;
ALTER TABLE pgcounters.quotas ADD CONSTRAINT quotas_period_known
    CHECK (period IN ('day', 'week', 'month', 'fixed', 'sliding'));
ALTER TABLE pgcounters.quotas DROP CONSTRAINT quotas_window_complete;
ALTER TABLE pgcounters.quotas ADD CONSTRAINT quotas_window_complete CHECK (
    (period IN ('fixed', 'sliding')) = (window_seconds IS NOT NULL)
    AND coalesce(window_seconds, 1) > 0);
-- the width of a sliding window's buckets, in seconds
ALTER TABLE pgcounters.quotas ADD COLUMN bucket_seconds bigint;
ALTER TABLE pgcounters.quotas ADD CONSTRAINT quotas_buckets CHECK (
    (period = 'sliding') = (bucket_seconds IS NOT NULL)
    AND (bucket_seconds IS NULL
         OR (bucket_seconds > 0 AND window_seconds % bucket_seconds = 0
             AND window_seconds / bucket_seconds <= 1000)));

-- One row per (sliding quota, subject): its buckets, newest first. granted[i],
-- tried[i] and refused[i] are the units granted, the calls made and the calls
-- refused in bucket head - i + 1. Updates leave the indexed columns alone
-- except expires_at, which moves once per bucket.
CREATE TABLE pgcounters.quota_sliding_usage (
    quota_id     integer NOT NULL,
    subject      text NOT NULL,
    head         bigint NOT NULL,        -- the newest bucket: floor(epoch / bucket_seconds)
    expires_at   timestamptz NOT NULL,   -- when every bucket has left the window
    granted      bigint[] NOT NULL,
    tried        bigint[] NOT NULL,
    refused      bigint[] NOT NULL,
    call_limit   bigint NOT NULL,        -- the limit in force at the latest call
    last_allowed boolean NOT NULL,       -- the decision of the latest call
    PRIMARY KEY (quota_id, subject)
) WITH (fillfactor = 60);

-- purge of idle subjects
CREATE INDEX quota_sliding_usage_expires_at ON pgcounters.quota_sliding_usage (expires_at);

-- p_ring moved p_by buckets on: the p_by newest are new (zero), as many of the
-- oldest leave.
CREATE FUNCTION pgcounters._ring_shift(p_ring bigint[], p_by bigint) RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_by <= 0 THEN p_ring
                WHEN p_by >= cardinality(p_ring)
                THEN array_fill(0::bigint, ARRAY[cardinality(p_ring)])
                ELSE array_fill(0::bigint, ARRAY[p_by::integer])
                     || p_ring[1 : cardinality(p_ring) - p_by::integer]
           END
$$;

-- The buckets of a subject after one call in bucket p_bucket costing p_cost
-- under p_limit, and the decision. A call from a bucket older than p_head (a
-- transaction that started earlier than one that has called already) is
-- counted in p_head: later, never earlier, than it happened.
CREATE FUNCTION pgcounters._sliding_step(
    p_head bigint,
    p_granted bigint[],
    p_tried bigint[],
    p_refused bigint[],
    p_bucket bigint,
    p_cost bigint,
    p_limit bigint,
    OUT head bigint,
    OUT granted bigint[],
    OUT tried bigint[],
    OUT refused bigint[],
    OUT allowed boolean
)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    head := greatest(p_head, p_bucket);
    granted := pgcounters._ring_shift(p_granted, head - p_head);
    tried := pgcounters._ring_shift(p_tried, head - p_head);
    refused := pgcounters._ring_shift(p_refused, head - p_head);
    allowed := (SELECT coalesce(sum(x), 0) FROM unnest(granted) AS x) + p_cost <= p_limit;
    tried[1] := tried[1] + 1;
    IF allowed THEN
        granted[1] := granted[1] + p_cost;
    ELSE
        refused[1] := refused[1] + 1;
    END IF;
END;
$$;

-- Seconds from p_at until the start of the first bucket at which a call of
-- p_cost fits under p_limit again (p_allowed: until the oldest granted units
-- leave the window), given the buckets granted (newest first, newest p_head).
CREATE FUNCTION pgcounters._sliding_retry(
    p_granted bigint[], p_head bigint, p_bucket_seconds bigint, p_cost bigint,
    p_limit bigint, p_allowed boolean, p_at timestamptz
) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_n integer := cardinality(p_granted);
    v_left numeric := (SELECT coalesce(sum(x), 0) FROM unnest(p_granted) AS x);
    v_j integer := 1;
BEGIN
    -- after j more buckets, the j oldest have left the window
    WHILE v_j < v_n LOOP
        v_left := v_left - p_granted[v_n - v_j + 1];
        EXIT WHEN (p_allowed AND p_granted[v_n - v_j + 1] > 0)
               OR (NOT p_allowed AND v_left + p_cost <= p_limit);
        v_j := v_j + 1;
    END LOOP;
    RETURN greatest(extract(epoch FROM to_timestamp((p_head + v_j) * p_bucket_seconds) - p_at),
                    0)::double precision;
END;
$$;

DROP FUNCTION pgcounters.define_quota(text, bigint, text, bigint, text, boolean);

-- Declare a quota, or change the default limit and logging of an existing one.
-- Redefining the window of an existing quota is refused (PCQ03): the usage
-- rows already counted belong to the old windows.
CREATE FUNCTION pgcounters.define_quota(
    p_name text,
    p_default_limit bigint DEFAULT NULL,
    p_period text DEFAULT 'day',
    p_window_seconds bigint DEFAULT NULL,
    p_time_zone text DEFAULT 'UTC',
    p_log_calls boolean DEFAULT false,
    p_bucket_seconds bigint DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_zone text;
    v_buckets bigint := p_bucket_seconds;
    v_existing pgcounters.quotas;
    v_id integer;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z_][A-Za-z0-9_.:/-]{0,199}$' THEN
        RAISE EXCEPTION 'invalid quota name %: use 1-200 characters of letters, digits and '
            '_ . : / -, starting with a letter or _', coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'PCQ02';
    END IF;
    IF p_default_limit IS NOT NULL AND p_default_limit <= 0 THEN
        RAISE EXCEPTION 'the default limit of quota % must be positive (or NULL for none), got %',
            p_name, p_default_limit USING ERRCODE = 'PCQ04';
    END IF;
    IF p_period IS NULL OR p_period NOT IN ('day', 'week', 'month', 'fixed', 'sliding') THEN
        RAISE EXCEPTION 'the window of quota % must be day, week, month, fixed or sliding, got %',
            p_name, coalesce(p_period, 'NULL') USING ERRCODE = 'PCQ02';
    END IF;
    IF p_period <> 'sliding' AND p_bucket_seconds IS NOT NULL THEN
        RAISE EXCEPTION 'a % window of quota % takes no bucket width', p_period, p_name
            USING ERRCODE = 'PCQ02';
    END IF;
    IF p_period IN ('fixed', 'sliding') THEN
        IF p_window_seconds IS NULL OR p_window_seconds <= 0 THEN
            RAISE EXCEPTION 'a % window of quota % needs a positive number of seconds, got %',
                p_period, p_name, coalesce(p_window_seconds::text, 'NULL')
                USING ERRCODE = 'PCQ02';
        END IF;
        IF p_time_zone IS DISTINCT FROM 'UTC' AND p_time_zone IS NOT NULL THEN
            RAISE EXCEPTION '% windows of quota % are aligned to the Unix epoch and take no '
                'time zone (got %); time zones apply to day, week and month windows',
                p_period, p_name, quote_literal(p_time_zone) USING ERRCODE = 'PCQ02';
        END IF;
        v_zone := 'UTC';
        IF p_period = 'sliding' THEN
            -- by default 60 buckets, or the widest whole number of seconds below a
            -- sixtieth of the window that divides it
            IF v_buckets IS NULL THEN
                v_buckets := greatest(p_window_seconds / 60, 1);
                WHILE p_window_seconds % v_buckets <> 0 LOOP
                    v_buckets := v_buckets - 1;
                END LOOP;
            END IF;
            IF v_buckets <= 0 OR p_window_seconds % v_buckets <> 0
               OR p_window_seconds / v_buckets > 1000 THEN
                RAISE EXCEPTION 'the buckets of the sliding window of quota % must be a whole '
                    'number of seconds dividing its % seconds into at most 1000, got %',
                    p_name, p_window_seconds, v_buckets USING ERRCODE = 'PCQ02';
            END IF;
        END IF;
    ELSE
        IF p_window_seconds IS NOT NULL THEN
            RAISE EXCEPTION 'a % window of quota % takes no number of seconds', p_period, p_name
                USING ERRCODE = 'PCQ02';
        END IF;
        v_zone := coalesce(p_time_zone, 'UTC');
        -- IANA names only: PostgreSQL also accepts POSIX forms such as 'UTC+5',
        -- whose sign is the opposite of ISO 8601's
        IF v_zone <> 'UTC' AND NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = v_zone)
        THEN
            RAISE EXCEPTION 'unknown time zone % for quota %: use an IANA name such as '
                '''Europe/Berlin''', quote_literal(v_zone), p_name USING ERRCODE = 'PCQ02';
        END IF;
    END IF;

    INSERT INTO pgcounters.quotas
        (name, period, window_seconds, time_zone, default_limit, log_calls, bucket_seconds)
    VALUES (p_name, p_period, p_window_seconds, v_zone, p_default_limit,
            coalesce(p_log_calls, false), v_buckets)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN v_id;
    END IF;

    SELECT * INTO v_existing FROM pgcounters.quotas WHERE name = p_name FOR UPDATE;
    IF v_existing.period IS DISTINCT FROM p_period
       OR v_existing.window_seconds IS DISTINCT FROM p_window_seconds
       OR v_existing.time_zone IS DISTINCT FROM v_zone
       OR (p_bucket_seconds IS NOT NULL
           AND v_existing.bucket_seconds IS DISTINCT FROM p_bucket_seconds) THEN
        RAISE EXCEPTION 'quota % already exists with another window', p_name
            USING ERRCODE = 'PCQ03';
    END IF;
    UPDATE pgcounters.quotas
       SET default_limit = p_default_limit,
           log_calls = coalesce(p_log_calls, false)
     WHERE id = v_existing.id;
    RETURN v_existing.id;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    pgcounters.define_quota(text, bigint, text, bigint, text, boolean, bigint) FROM PUBLIC;

-- Forget a quota with its limits, usage and log.
CREATE OR REPLACE FUNCTION pgcounters.drop_quota(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    DELETE FROM pgcounters.quotas WHERE name = p_name RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM pgcounters.quota_usage WHERE quota_id = v_id;
    DELETE FROM pgcounters.quota_sliding_usage WHERE quota_id = v_id;
    DELETE FROM pgcounters.quota_log WHERE quota_id = v_id;
    RETURN true;   -- quota_limits go by ON DELETE CASCADE
END;
$$;

-- Register a call of p_subject costing p_cost in the window containing p_at
-- (the quotas' clock when NULL); returns whether it is allowed and the usage.
-- A sliding window's window_start and window_end are the start of its oldest
-- bucket and the end of its newest.
CREATE OR REPLACE FUNCTION pgcounters.register_call(
    p_quota text,
    p_subject text,
    p_cost bigint DEFAULT 1,
    p_at timestamptz DEFAULT NULL,
    p_details jsonb DEFAULT NULL,
    p_async_commit boolean DEFAULT false,
    OUT allowed boolean,
    OUT used bigint,
    OUT attempts bigint,
    OUT call_limit bigint,
    OUT window_start timestamptz,
    OUT window_end timestamptz,
    OUT retry_after double precision
)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    -- p_at, else the clock: the setting pgcounters.now when set, else now()
    v_at timestamptz := coalesce(p_at, nullif(current_setting('pgcounters.now', true), '')::timestamptz,
                                 now());
    v_id integer;
    v_log boolean;
    v_period text;
    v_seconds bigint;
    v_zone text;
    v_limit bigint;
    v_width bigint;
    v_bucket bigint;
    v_zeros bigint[];
    v_first record;
    v_granted bigint[];
    v_head bigint;
BEGIN
    IF p_cost IS NULL OR p_cost <= 0 THEN
        RAISE EXCEPTION 'the cost of a call must be a positive number of units, got %',
            coalesce(p_cost::text, 'NULL') USING ERRCODE = 'PCQ07';
    END IF;
    IF p_subject IS NULL OR btrim(p_subject) = '' OR length(p_subject) > 1000 THEN
        PERFORM pgcounters._check_subject(p_subject);  -- raises PCQ06
    END IF;

    SELECT q.id, q.log_calls, q.period, q.window_seconds, q.time_zone, q.bucket_seconds,
           coalesce((SELECT l.calls FROM pgcounters.quota_limits AS l
                      WHERE l.quota_id = q.id AND l.subject = p_subject AND l.valid @> v_at),
                    q.default_limit, 0)
      INTO v_id, v_log, v_period, v_seconds, v_zone, v_width, v_limit
      FROM pgcounters.quotas AS q
     WHERE q.name = p_quota;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown quota %', coalesce(quote_literal(p_quota), 'NULL')
            USING ERRCODE = 'PCQ01';
    END IF;

    IF v_period = 'sliding' THEN
        v_bucket := floor(extract(epoch FROM v_at) / v_width)::bigint;
        v_zeros := array_fill(0::bigint, ARRAY[(v_seconds / v_width + 1)::integer]);
        v_first := pgcounters._sliding_step(
            v_bucket, v_zeros, v_zeros, v_zeros, v_bucket, p_cost, v_limit);
        -- the decision is made in the SET clause, from the row locked
        INSERT INTO pgcounters.quota_sliding_usage AS u
            (quota_id, subject, head, expires_at, granted, tried, refused,
             call_limit, last_allowed)
        VALUES (v_id, p_subject, v_bucket,
                to_timestamp((v_bucket + 1) * v_width + v_seconds),
                v_first.granted, v_first.tried, v_first.refused, v_limit, v_first.allowed)
        ON CONFLICT ON CONSTRAINT quota_sliding_usage_pkey DO UPDATE
           SET (head, expires_at, granted, tried, refused, call_limit, last_allowed) =
               (SELECT s.head, to_timestamp((s.head + 1) * v_width + v_seconds),
                       s.granted, s.tried, s.refused, excluded.call_limit, s.allowed
                  FROM pgcounters._sliding_step(u.head, u.granted, u.tried, u.refused,
                                                excluded.head, p_cost,
                                                excluded.call_limit) AS s)
        RETURNING u.last_allowed, u.granted, u.head, u.call_limit,
                  (SELECT sum(x) FROM unnest(u.tried) AS x)::bigint
             INTO allowed, v_granted, v_head, call_limit, attempts;
        used := (SELECT sum(x) FROM unnest(v_granted) AS x)::bigint;
        window_start := to_timestamp((v_head - v_seconds / v_width) * v_width);
        window_end := to_timestamp((v_head + 1) * v_width);
        retry_after := pgcounters._sliding_retry(
            v_granted, v_head, v_width, p_cost, call_limit, allowed, v_at);
    ELSE
        window_start := pgcounters.quota_window_start(v_period, v_seconds, v_zone, v_at);
        window_end := pgcounters.quota_window_end(v_period, v_seconds, v_zone, window_start);

        INSERT INTO pgcounters.quota_usage AS u
            (quota_id, subject, window_start, window_end, call_limit,
             used, attempts, rejected, last_allowed)
        VALUES (v_id, p_subject, window_start, window_end, v_limit,
                CASE WHEN p_cost <= v_limit THEN p_cost ELSE 0 END,
                1,
                CASE WHEN p_cost <= v_limit THEN 0 ELSE 1 END,
                p_cost <= v_limit)
        ON CONFLICT ON CONSTRAINT quota_usage_pkey DO UPDATE
           SET call_limit = excluded.call_limit,
               used = CASE WHEN u.used + p_cost <= excluded.call_limit
                           THEN u.used + p_cost ELSE u.used END,
               attempts = u.attempts + 1,
               rejected = u.rejected
                          + CASE WHEN u.used + p_cost <= excluded.call_limit THEN 0 ELSE 1 END,
               last_allowed = u.used + p_cost <= excluded.call_limit
        RETURNING u.last_allowed, u.used, u.attempts, u.call_limit
             INTO allowed, used, attempts, call_limit;
        retry_after := greatest(extract(epoch FROM window_end - v_at), 0);
    END IF;

    IF v_log THEN
        INSERT INTO pgcounters.quota_log (quota_id, subject, at, cost, allowed, details)
        VALUES (v_id, p_subject, v_at, p_cost, allowed, p_details);
    END IF;
    IF p_async_commit THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END;
$$;

-- The usage of a subject in the window containing p_at, without registering a
-- call (zeros when it made none).
CREATE OR REPLACE FUNCTION pgcounters.quota_status(
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
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q pgcounters.quotas := pgcounters._quota(p_quota);
    -- p_at, else the clock: the setting pgcounters.now when set, else now()
    v_at timestamptz := coalesce(p_at, nullif(current_setting('pgcounters.now', true), '')::timestamptz,
                                 now());
    v_bucket bigint;
    v_row pgcounters.quota_sliding_usage;
BEGIN
    PERFORM pgcounters._check_subject(p_subject);
    call_limit := coalesce(
        (SELECT l.calls FROM pgcounters.quota_limits AS l
          WHERE l.quota_id = q.id AND l.subject = p_subject AND l.valid @> v_at),
        q.default_limit, 0);
    IF q.period = 'sliding' THEN
        v_bucket := floor(extract(epoch FROM v_at) / q.bucket_seconds)::bigint;
        SELECT * INTO v_row FROM pgcounters.quota_sliding_usage AS u
         WHERE u.quota_id = q.id AND u.subject = p_subject;
        IF FOUND THEN
            v_bucket := greatest(v_bucket, v_row.head);
            used := (SELECT sum(x) FROM unnest(pgcounters._ring_shift(
                         v_row.granted, v_bucket - v_row.head)) AS x);
            attempts := (SELECT sum(x) FROM unnest(pgcounters._ring_shift(
                             v_row.tried, v_bucket - v_row.head)) AS x);
            rejected := (SELECT sum(x) FROM unnest(pgcounters._ring_shift(
                             v_row.refused, v_bucket - v_row.head)) AS x);
        END IF;
        window_start := to_timestamp(
            (v_bucket - q.window_seconds / q.bucket_seconds) * q.bucket_seconds);
        window_end := to_timestamp((v_bucket + 1) * q.bucket_seconds);
    ELSE
        window_start := pgcounters.quota_window_start(
            q.period, q.window_seconds, q.time_zone, v_at);
        window_end := pgcounters.quota_window_end(
            q.period, q.window_seconds, q.time_zone, window_start);
        SELECT u.used, u.attempts, u.rejected INTO used, attempts, rejected
          FROM pgcounters.quota_usage AS u
         WHERE u.quota_id = q.id AND u.subject = p_subject
           AND u.window_start = quota_status.window_start;
    END IF;
    used := coalesce(used, 0);
    attempts := coalesce(attempts, 0);
    rejected := coalesce(rejected, 0);
END;
$$;

-- Remove usage rows of windows that ended at or before p_before (of sliding
-- windows: the subjects none of whose buckets is in the window any more at
-- p_before), and log rows older than p_before, of one quota (or all: p_quota
-- NULL). Returns the counts.
CREATE OR REPLACE FUNCTION pgcounters.purge_quotas(
    p_before timestamptz,
    p_quota text DEFAULT NULL,
    OUT windows bigint,
    OUT log_rows bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
    v_sliding bigint;
BEGIN
    IF p_before IS NULL THEN
        RAISE EXCEPTION 'purge needs a cut-off instant' USING ERRCODE = 'PCQ08';
    END IF;
    -- a cut-off in the future would delete windows still in use and let their
    -- subjects call again
    IF p_before > coalesce(nullif(current_setting('pgcounters.now', true), '')::timestamptz,
                           now()) THEN
        RAISE EXCEPTION 'purge cut-off % is in the future', p_before USING ERRCODE = 'PCQ08';
    END IF;
    IF p_quota IS NOT NULL THEN
        v_id := (pgcounters._quota(p_quota)).id;
    END IF;
    DELETE FROM pgcounters.quota_usage
     WHERE window_end <= p_before AND (v_id IS NULL OR quota_id = v_id);
    GET DIAGNOSTICS windows = ROW_COUNT;
    DELETE FROM pgcounters.quota_sliding_usage
     WHERE expires_at <= p_before AND (v_id IS NULL OR quota_id = v_id);
    GET DIAGNOSTICS v_sliding = ROW_COUNT;
    windows := windows + v_sliding;
    DELETE FROM pgcounters.quota_log
     WHERE at < p_before AND (v_id IS NULL OR quota_id = v_id);
    GET DIAGNOSTICS log_rows = ROW_COUNT;
END;
$$;

-- The application's rights on sliding windows (part of grant_app): it reads
-- them (quota_status, reports).
CREATE FUNCTION pgcounters._grant_app_sliding(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT SELECT ON pgcounters.quota_sliding_usage TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters._ring_shift(bigint[], bigint) TO %I'])
$$;

-- The worker's rights on sliding windows (part of grant_worker): it purges them.
CREATE FUNCTION pgcounters._grant_worker_sliding(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_app_sliding(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT DELETE ON pgcounters.quota_sliding_usage TO %I'])
$$;

CREATE OR REPLACE FUNCTION pgcounters.grant_app(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_app_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_app_sql_interface(p_role) || pgcounters._grant_app_sliding(p_role)
$$;

CREATE OR REPLACE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_worker_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
           || pgcounters._grant_worker_sql_interface(p_role)
           || pgcounters._grant_worker_sliding(p_role)
$$;

-- Roles granted before this version get the same rights on sliding windows: the
-- application roles (SELECT on quota_usage) read them, the worker roles (DELETE on
-- quota_usage) purge them.
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
            PERFORM pgcounters._grant_app_sliding(r.rolname);
        ELSE
            PERFORM pgcounters._grant_worker_sliding(r.rolname);
        END IF;
    END LOOP;
END;
$$;

-- No function of this version is executable by PUBLIC.
REVOKE EXECUTE ON FUNCTION pgcounters._ring_shift(bigint[], bigint),
    pgcounters._sliding_step(bigint, bigint[], bigint[], bigint[], bigint, bigint, bigint),
    pgcounters._sliding_retry(bigint[], bigint, bigint, bigint, bigint, boolean, timestamptz),
    pgcounters._grant_app_sliding(text), pgcounters._grant_worker_sliding(text) FROM PUBLIC;
