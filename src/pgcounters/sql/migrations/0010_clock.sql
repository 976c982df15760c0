-- pgcounters schema, version 10: a clock that can be set, for quota windows.
--
-- The quotas' clock is now(), the transaction's start, unless the setting
-- pgcounters.now holds an instant: then it is that instant. A call to
-- register_call or quota_status without an instant of its own, and the check
-- that a purge's cut-off is not in the future, read this clock, so windows
-- (minute, hour, day) can be exercised at chosen instants:
--
--     SET pgcounters.now = '2026-03-10 12:34:56+00';   -- this session
--     SET LOCAL pgcounters.now = '...';                -- this transaction
--     ALTER DATABASE app SET pgcounters.now = '...';   -- every new session
--     RESET pgcounters.now;                            -- back to now()
--
-- It grants nothing a caller could not do already: register_call and
-- quota_status take the instant as an argument (p_at) too.
--
-- The three functions are those of version 3 with now() replaced by
--     coalesce(nullif(current_setting('pgcounters.now', true), '')::timestamptz, now())
-- (written out, not a function of its own: the roles granted these functions
-- need no new right); register_call keeps the rights version 6 gave it
-- (SECURITY DEFINER with a fixed search_path). Their owner, grants and
-- signatures are unchanged.

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

CREATE OR REPLACE FUNCTION pgcounters.purge_quotas(
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
    DELETE FROM pgcounters.quota_log
     WHERE at < p_before AND (v_id IS NULL OR quota_id = v_id);
    GET DIAGNOSTICS log_rows = ROW_COUNT;
END;
$$;
