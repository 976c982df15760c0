-- pgcounters schema, version 3: quotas and rate limits.
--
-- A quota is a named budget of calls per subject (a customer, a user, an API
-- key, an IP address: any non-blank string) and per window of time. A window is
-- a calendar day (the default), week or month in a time zone, correct across
-- DST changes, or a fixed number of seconds aligned to the Unix epoch (an
-- hour, a minute, 90 seconds...).
--
-- Limits are valid over time ranges (tstzrange); an exclusion constraint keeps
-- two limits of the same quota and subject from overlapping. A subject without
-- a limit of its own gets the quota's default limit (none: no call allowed).
--
-- register_call decides inside ONE upsert of the usage row: the SET clause sees
-- the current row, locked, and computes the decision from it.
-- A decision read from a CTE or a prior SELECT lets concurrent callers through
-- past the limit.
--
-- SQLSTATEs of class PC, subclass Q (quotas): PCQ01 unknown quota, PCQ02 bad
-- quota definition, PCQ03 quota redefined with another window, PCQ04 bad limit,
-- PCQ05 overlapping limits, PCQ06 bad subject, PCQ07 bad cost, PCQ08 bad report
-- or purge argument.

-- the exclusion constraint compares quota_id and subject with "=" in a GiST
-- index: btree_gist (a trusted extension) provides those operator classes
CREATE EXTENSION IF NOT EXISTS btree_gist WITH SCHEMA pgcounters;

CREATE TABLE pgcounters.quotas (
    id             integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text NOT NULL UNIQUE
                   CONSTRAINT quotas_name_format
                   CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_.:/-]{0,199}$'),
    -- 'day', 'week', 'month': calendar windows in time_zone; 'fixed': window_seconds
    period         text NOT NULL DEFAULT 'day'
                   CONSTRAINT quotas_period_known
                   CHECK (period IN ('day', 'week', 'month', 'fixed')),
    window_seconds bigint,
    time_zone      text NOT NULL DEFAULT 'UTC',
    -- the limit of subjects without a limit of their own; NULL: they get no call
    default_limit  bigint
                   CONSTRAINT quotas_default_limit_positive CHECK (default_limit > 0),
    -- keep one row per call in quota_log (off by default)
    log_calls      boolean NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT quotas_window_complete CHECK (
        (period = 'fixed') = (window_seconds IS NOT NULL) AND coalesce(window_seconds, 1) > 0)
);

-- Limits per subject, valid over a time range. No two limits of one quota and
-- subject overlap. The GiST index of the constraint also finds the limit in
-- force for (quota, subject, instant).
CREATE TABLE pgcounters.quota_limits (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    quota_id  integer NOT NULL REFERENCES pgcounters.quotas (id) ON DELETE CASCADE,
    subject   text NOT NULL
              CONSTRAINT quota_limits_subject_format
              CHECK (btrim(subject) <> '' AND length(subject) <= 1000),
    calls     bigint NOT NULL CONSTRAINT quota_limits_calls_positive CHECK (calls > 0),
    valid     tstzrange NOT NULL DEFAULT '[,)'
              CONSTRAINT quota_limits_valid_not_empty CHECK (NOT isempty(valid)),
    CONSTRAINT quota_limits_no_overlap
        EXCLUDE USING gist (quota_id WITH =, subject WITH =, valid WITH &&)
);

-- One row per (quota, subject, window): what the subject used and tried.
-- Only columns outside every index change on a call, and fillfactor 60 leaves
-- room on the page for the new row version, so the updates stay HOT (no index
-- write, pruned in the page). No foreign key: an FK check would lock the quota
-- row on every call.
CREATE TABLE pgcounters.quota_usage (
    quota_id     integer NOT NULL,
    subject      text NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    call_limit   bigint NOT NULL,   -- the limit in force at the latest call
    used         bigint NOT NULL,   -- units granted (a grant never exceeds the limit)
    attempts     bigint NOT NULL,   -- calls made, granted or not
    rejected     bigint NOT NULL,   -- calls refused
    last_allowed boolean NOT NULL,  -- the decision of the latest call
    PRIMARY KEY (quota_id, subject, window_start)
) WITH (fillfactor = 60);

-- purge of old windows
CREATE INDEX quota_usage_window_end ON pgcounters.quota_usage (window_end);

-- The optional request log (seed 002's t_log): one row per call of a quota
-- whose log_calls is on, with request details as jsonb. Append-only and time
-- ordered, so the purge index is a BRIN (tiny, cheap to maintain).
CREATE TABLE pgcounters.quota_log (
    quota_id integer NOT NULL,
    subject  text NOT NULL,
    at       timestamptz NOT NULL,
    cost     bigint NOT NULL,
    allowed  boolean NOT NULL,
    details  jsonb
);

CREATE INDEX quota_log_subject ON pgcounters.quota_log (quota_id, subject, at);
CREATE INDEX quota_log_at ON pgcounters.quota_log USING brin (at);

-- ---------------------------------------------------------------------------
-- Windows
-- ---------------------------------------------------------------------------

-- The window [start, end) of a quota that contains the instant p_at. Calendar
-- windows are computed on the local wall clock of p_time_zone and converted
-- back, so a day is 23 or 25 hours long on DST changes; the session's TimeZone
-- setting plays no part. Fixed windows are aligned to the Unix epoch. Both are
-- single expressions in SQL functions, which the planner inlines; they are
-- STABLE, not IMMUTABLE, because extract() from a timestamptz is STABLE (a
-- function declared more strictly than its body is not inlined).
CREATE FUNCTION pgcounters.quota_window_start(
    p_period text, p_window_seconds bigint, p_time_zone text, p_at timestamptz
) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_period = 'fixed'
                THEN to_timestamp(floor(extract(epoch FROM p_at) / p_window_seconds)
                                  * p_window_seconds)
                ELSE date_trunc(p_period, p_at AT TIME ZONE p_time_zone) AT TIME ZONE p_time_zone
           END
$$;

-- The end of the window that starts at p_start.
CREATE FUNCTION pgcounters.quota_window_end(
    p_period text, p_window_seconds bigint, p_time_zone text, p_start timestamptz
) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE p_period
           WHEN 'fixed' THEN p_start + make_interval(secs => p_window_seconds)
           WHEN 'day' THEN ((p_start AT TIME ZONE p_time_zone) + interval '1 day')
                           AT TIME ZONE p_time_zone
           WHEN 'week' THEN ((p_start AT TIME ZONE p_time_zone) + interval '1 week')
                            AT TIME ZONE p_time_zone
           ELSE ((p_start AT TIME ZONE p_time_zone) + interval '1 month') AT TIME ZONE p_time_zone
           END
$$;

-- ---------------------------------------------------------------------------
-- Declaring quotas and limits
-- ---------------------------------------------------------------------------

CREATE FUNCTION pgcounters._quota(p_name text) RETURNS pgcounters.quotas
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v pgcounters.quotas;
BEGIN
    SELECT * INTO v FROM pgcounters.quotas WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown quota %', coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'PCQ01';
    END IF;
    RETURN v;
END;
$$;

CREATE FUNCTION pgcounters._check_subject(p_subject text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_subject IS NULL OR btrim(p_subject) = '' OR length(p_subject) > 1000 THEN
        RAISE EXCEPTION 'a quota subject must be a non-blank string of at most 1000 characters, got %',
            coalesce(quote_literal(left(p_subject, 40)), 'NULL')
            USING ERRCODE = 'PCQ06';
    END IF;
END;
$$;

-- Declare a quota, or change the default limit and logging of an existing one.
-- Redefining the window of an existing quota is refused (PCQ03): the usage
-- rows already counted belong to the old windows.
CREATE FUNCTION pgcounters.define_quota(
    p_name text,
    p_default_limit bigint DEFAULT NULL,
    p_period text DEFAULT 'day',
    p_window_seconds bigint DEFAULT NULL,
    p_time_zone text DEFAULT 'UTC',
    p_log_calls boolean DEFAULT false
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_zone text;
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
    IF p_period IS NULL OR p_period NOT IN ('day', 'week', 'month', 'fixed') THEN
        RAISE EXCEPTION 'the window of quota % must be day, week, month or fixed, got %',
            p_name, coalesce(p_period, 'NULL') USING ERRCODE = 'PCQ02';
    END IF;
    IF p_period = 'fixed' THEN
        IF p_window_seconds IS NULL OR p_window_seconds <= 0 THEN
            RAISE EXCEPTION 'a fixed window of quota % needs a positive number of seconds, got %',
                p_name, coalesce(p_window_seconds::text, 'NULL') USING ERRCODE = 'PCQ02';
        END IF;
        IF p_time_zone IS DISTINCT FROM 'UTC' AND p_time_zone IS NOT NULL THEN
            RAISE EXCEPTION 'fixed windows of quota % are aligned to the Unix epoch and take no '
                'time zone (got %); time zones apply to day, week and month windows',
                p_name, quote_literal(p_time_zone) USING ERRCODE = 'PCQ02';
        END IF;
        v_zone := 'UTC';
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
        (name, period, window_seconds, time_zone, default_limit, log_calls)
    VALUES (p_name, p_period, p_window_seconds, v_zone, p_default_limit,
            coalesce(p_log_calls, false))
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN v_id;
    END IF;

    SELECT * INTO v_existing FROM pgcounters.quotas WHERE name = p_name FOR UPDATE;
    IF v_existing.period IS DISTINCT FROM p_period
       OR v_existing.window_seconds IS DISTINCT FROM p_window_seconds
       OR v_existing.time_zone IS DISTINCT FROM v_zone THEN
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

-- Forget a quota with its limits, usage and log.
CREATE FUNCTION pgcounters.drop_quota(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    DELETE FROM pgcounters.quotas WHERE name = p_name RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM pgcounters.quota_usage WHERE quota_id = v_id;
    DELETE FROM pgcounters.quota_log WHERE quota_id = v_id;
    RETURN true;   -- quota_limits go by ON DELETE CASCADE
END;
$$;

-- Give a subject a limit over [p_from, p_until) (NULL: unbounded). A range
-- that overlaps another limit of the same quota and subject is refused
-- (PCQ05) and nothing is written.
CREATE FUNCTION pgcounters.set_limit(
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
            v_range, p_quota, quote_literal(p_subject), coalesce(v_other::text, '(concurrent)')
            USING ERRCODE = 'PCQ05';
    END;
    RETURN v_id;
END;
$$;

-- Remove limits of a subject: the one with id p_id, or all of them (p_id NULL).
-- Returns how many were removed.
CREATE FUNCTION pgcounters.remove_limits(p_quota text, p_subject text, p_id bigint DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    q pgcounters.quotas := pgcounters._quota(p_quota);
    v_n integer;
BEGIN
    PERFORM pgcounters._check_subject(p_subject);
    DELETE FROM pgcounters.quota_limits
     WHERE quota_id = q.id AND subject = p_subject AND (p_id IS NULL OR id = p_id);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- ---------------------------------------------------------------------------
-- The call
-- ---------------------------------------------------------------------------

-- Register one call of p_subject against p_quota at p_at (default: now(), the
-- transaction's start), costing p_cost units. Returns whether it is allowed,
-- the units used in the window (a grant never exceeds the limit), the real number of
-- calls in the window, the limit, the window and the seconds until it ends.
--
-- The decision is made in the SET of the upsert, from the usage row as it is
-- once locked: concurrent callers queue on that one row lock and each sees the
-- count its predecessor committed. A refused call changes attempts and
-- rejected, never used. The quota, its window and the subject's limit are read
-- before; they are definitions, not counts.
--
-- p_async_commit => true sets synchronous_commit off for the rest of the
-- transaction the call is in: its commit does not wait for the WAL flush (and
-- the row lock of a hot subject is held that much shorter). A crash of
-- PostgreSQL may then forget the calls of its last moments (up to three
-- wal_writer_delay, 0.6 s by default), letting as many calls again. Pass it
-- only for a call that is a transaction of its own (autocommit), or the
-- caller's other writes become asynchronous too; the Python client does so.
CREATE FUNCTION pgcounters.register_call(
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
LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz := coalesce(p_at, now());
    v_id integer;
    v_log boolean;
    v_period text;
    v_seconds bigint;
    v_zone text;
    v_limit bigint;
BEGIN
    IF p_cost IS NULL OR p_cost <= 0 THEN
        RAISE EXCEPTION 'the cost of a call must be a positive number of units, got %',
            coalesce(p_cost::text, 'NULL') USING ERRCODE = 'PCQ07';
    END IF;
    IF p_subject IS NULL OR btrim(p_subject) = '' OR length(p_subject) > 1000 THEN
        PERFORM pgcounters._check_subject(p_subject);  -- raises PCQ06
    END IF;

    SELECT q.id, q.log_calls, q.period, q.window_seconds, q.time_zone,
           coalesce((SELECT l.calls FROM pgcounters.quota_limits AS l
                      WHERE l.quota_id = q.id AND l.subject = p_subject AND l.valid @> v_at),
                    q.default_limit, 0)
      INTO v_id, v_log, v_period, v_seconds, v_zone, v_limit
      FROM pgcounters.quotas AS q
     WHERE q.name = p_quota;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown quota %', coalesce(quote_literal(p_quota), 'NULL')
            USING ERRCODE = 'PCQ01';
    END IF;
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

    IF v_log THEN
        INSERT INTO pgcounters.quota_log (quota_id, subject, at, cost, allowed, details)
        VALUES (v_id, p_subject, v_at, p_cost, allowed, p_details);
    END IF;
    IF p_async_commit THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    retry_after := greatest(extract(epoch FROM window_end - v_at), 0);
END;
$$;

-- The usage of a subject in the window containing p_at, without registering a
-- call (zeros when it made none).
CREATE FUNCTION pgcounters.quota_status(
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
    v_at timestamptz := coalesce(p_at, now());
BEGIN
    PERFORM pgcounters._check_subject(p_subject);
    window_start := pgcounters.quota_window_start(q.period, q.window_seconds, q.time_zone, v_at);
    window_end := pgcounters.quota_window_end(
        q.period, q.window_seconds, q.time_zone, window_start);
    call_limit := coalesce(
        (SELECT l.calls FROM pgcounters.quota_limits AS l
          WHERE l.quota_id = q.id AND l.subject = p_subject AND l.valid @> v_at),
        q.default_limit, 0);
    SELECT u.used, u.attempts, u.rejected INTO used, attempts, rejected
      FROM pgcounters.quota_usage AS u
     WHERE u.quota_id = q.id AND u.subject = p_subject
       AND u.window_start = quota_status.window_start;
    used := coalesce(used, 0);
    attempts := coalesce(attempts, 0);
    rejected := coalesce(rejected, 0);
END;
$$;

-- Remove usage rows of windows that ended at or before p_before, and log rows
-- older than p_before, of one quota (or all: p_quota NULL). Returns the counts.
CREATE FUNCTION pgcounters.purge_quotas(
    p_before timestamptz,
    p_quota text DEFAULT NULL,
    OUT windows bigint,
    OUT log_rows bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    IF p_before IS NULL THEN
        RAISE EXCEPTION 'purge needs a cut-off instant' USING ERRCODE = 'PCQ08';
    END IF;
    -- a cut-off in the future would delete windows still in use and let their
    -- subjects call again
    IF p_before > now() THEN
        RAISE EXCEPTION 'purge cut-off % is in the future', p_before USING ERRCODE = 'PCQ08';
    END IF;
    IF p_quota IS NOT NULL THEN
        v_id := (pgcounters._quota(p_quota)).id;
    END IF;
    DELETE FROM pgcounters.quota_usage
     WHERE window_end <= p_before AND (v_id IS NULL OR quota_id = v_id);
    GET DIAGNOSTICS windows = ROW_COUNT;
    DELETE FROM pgcounters.quota_log
     WHERE at < p_before AND (v_id IS NULL OR quota_id = v_id);
    GET DIAGNOSTICS log_rows = ROW_COUNT;
END;
$$;
