-- Version 23: a range read of a counter per period is one index range scan a table.
--
-- The client made the key of every period of a range and sent them all in one
-- statement, planned anew on every call. Now it sends the key parts of the first and
-- the last period; _range_sum and _range_values read the keys between them (the key
-- part of a period is of fixed width: its order as text is time order under any
-- collation), stored + pending, in one snapshot, with a plan kept for the session.
-- _grant_app_buckets also grants them (part of grant_app).

-- The exact values of one key (p_key, without its period part) of a counter per period
-- over a range of its periods, from the period whose key part is p_first to the one
-- whose key part is p_last, stored + pending, one snapshot: one row per period that has
-- a value (its key part, its value). Each table is read in one index range scan: a
-- period's key part is of fixed width (digits and separators at the same places), so
-- its order as text is the order of time under any collation, and the keys of one key's
-- periods lie between the two keys of those periods. The queues keep a key as the text
-- of its array, which may interleave with other keys' under a collation: those are left
-- out by their head. Periods no longer kept are left out. One row of NULLs (and no
-- other) when the counter's periods are no longer p_bucket (the recorded definition the
-- key parts were made from). Refused while the counter is backfilled; on a hot standby the
-- logged queue only (an unlogged counter is refused, PCR01). Planned once a session
-- (generic plan): the statement is the same for every range.
CREATE FUNCTION pgcounters._range_values(p_target integer, p_name text, p_bucket jsonb,
    p_key text[], p_first text, p_last text)
RETURNS TABLE (bucket text, value bigint)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_def jsonb;
    v_horizon text := '';
    v_head text := rtrim((p_key || '{x}'::text[])::text, 'x}');
    v_low text[] := p_key || p_first;
    v_high text[] := p_key || p_last;
    v_part integer := coalesce(array_length(p_key, 1), 0) + 1;
BEGIN
    SELECT s.definition -> 'bucket' INTO v_def FROM pgcounters.specs AS s
     WHERE s.name = p_name;
    IF v_def IS DISTINCT FROM p_bucket THEN
        RETURN QUERY SELECT NULL::text, NULL::bigint;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pgcounters.backfills AS f WHERE f.name = p_name) THEN
        PERFORM pgcounters._backfilling(p_target);
    END IF;
    IF v_def ->> 'keep' IS NOT NULL THEN
        v_horizon := pgcounters.bucket_text(v_def ->> 'period', v_def ->> 'time_zone',
                         pgcounters.bucket_horizon(v_def ->> 'period', v_def ->> 'time_zone',
                                                   (v_def ->> 'keep')::integer));
    END IF;
    IF NOT pg_is_in_recovery() THEN
        RETURN QUERY
            SELECT u.b, sum(u.v)::bigint FROM (
                SELECT c.key[v_part] AS b, c.value AS v FROM pgcounters.counters AS c
                 WHERE c.target_id = p_target AND c.key BETWEEN v_low AND v_high
                UNION ALL
                SELECT (q.key::text[])[v_part], q.delta FROM pgcounters.queue AS q
                 WHERE q.target_id = p_target AND q.key BETWEEN v_low::text AND v_high::text
                   AND starts_with(q.key, v_head)
                UNION ALL
                SELECT (q.key::text[])[v_part], q.delta FROM pgcounters.queue_unlogged AS q
                 WHERE q.target_id = p_target AND q.key BETWEEN v_low::text AND v_high::text
                   AND starts_with(q.key, v_head)) AS u
             WHERE u.b COLLATE "C" >= v_horizon COLLATE "C"
             GROUP BY u.b;
    ELSIF (SELECT t.mode FROM pgcounters.targets AS t WHERE t.id = p_target) = 'unlogged' THEN
        RAISE EXCEPTION 'counter % is unlogged: its pending deltas exist only on the primary, '
                        'read it there (its stored value is readable here)', p_name
            USING ERRCODE = 'PCR01';
    ELSE
        RETURN QUERY
            SELECT u.b, sum(u.v)::bigint FROM (
                SELECT c.key[v_part] AS b, c.value AS v FROM pgcounters.counters AS c
                 WHERE c.target_id = p_target AND c.key BETWEEN v_low AND v_high
                UNION ALL
                SELECT (q.key::text[])[v_part], q.delta FROM pgcounters.queue AS q
                 WHERE q.target_id = p_target AND q.key BETWEEN v_low::text AND v_high::text
                   AND starts_with(q.key, v_head)) AS u
             WHERE u.b COLLATE "C" >= v_horizon COLLATE "C"
             GROUP BY u.b;
    END IF;
END;
$$;

-- The exact value of one key of a counter per period over a range of its periods, read
-- as _range_values reads (one index range scan of each table, one snapshot, planned once
-- a session); NULL when the counter's periods are no longer p_bucket.
CREATE FUNCTION pgcounters._range_sum(p_target integer, p_name text, p_bucket jsonb,
    p_key text[], p_first text, p_last text)
RETURNS bigint
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_def jsonb;
    v_horizon text;
    v_sum bigint;
    v_low text[] := p_key || p_first;
    v_high text[] := p_key || p_last;
BEGIN
    SELECT s.definition -> 'bucket' INTO v_def FROM pgcounters.specs AS s
     WHERE s.name = p_name;
    IF v_def IS DISTINCT FROM p_bucket THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM pgcounters.backfills AS f WHERE f.name = p_name) THEN
        PERFORM pgcounters._backfilling(p_target);
    END IF;
    IF v_def ->> 'keep' IS NOT NULL THEN
        -- the periods no longer kept are left out: the range starts at the first kept
        v_horizon := pgcounters.bucket_text(v_def ->> 'period', v_def ->> 'time_zone',
                         pgcounters.bucket_horizon(v_def ->> 'period', v_def ->> 'time_zone',
                                                   (v_def ->> 'keep')::integer));
        IF v_horizon COLLATE "C" > p_first COLLATE "C" THEN
            v_low := p_key || v_horizon;
        END IF;
    END IF;
    IF NOT pg_is_in_recovery() THEN
        SELECT coalesce((SELECT sum(c.value) FROM pgcounters.counters AS c
                          WHERE c.target_id = p_target AND c.key BETWEEN v_low AND v_high), 0)
             + coalesce((SELECT sum(q.delta) FROM pgcounters.queue AS q
                          WHERE q.target_id = p_target
                            AND q.key BETWEEN v_low::text AND v_high::text
                            AND starts_with(q.key, rtrim((p_key || '{x}'::text[])::text, 'x}'))), 0)
             + coalesce((SELECT sum(q.delta) FROM pgcounters.queue_unlogged AS q
                          WHERE q.target_id = p_target
                            AND q.key BETWEEN v_low::text AND v_high::text
                            AND starts_with(q.key, rtrim((p_key || '{x}'::text[])::text, 'x}'))), 0)
          INTO v_sum;
    ELSIF (SELECT t.mode FROM pgcounters.targets AS t WHERE t.id = p_target) = 'unlogged' THEN
        RAISE EXCEPTION 'counter % is unlogged: its pending deltas exist only on the primary, '
                        'read it there (its stored value is readable here)', p_name
            USING ERRCODE = 'PCR01';
    ELSE
        SELECT coalesce((SELECT sum(c.value) FROM pgcounters.counters AS c
                          WHERE c.target_id = p_target AND c.key BETWEEN v_low AND v_high), 0)
             + coalesce((SELECT sum(q.delta) FROM pgcounters.queue AS q
                          WHERE q.target_id = p_target
                            AND q.key BETWEEN v_low::text AND v_high::text
                            AND starts_with(q.key, rtrim((p_key || '{x}'::text[])::text, 'x}'))), 0)
          INTO v_sum;
    END IF;
    RETURN v_sum;
END;
$$;

-- The rights of counters per period (part of grant_app), with the range reads.
CREATE OR REPLACE FUNCTION pgcounters._grant_app_buckets(p_role text) RETURNS text[]
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
            ' pgcounters.top_range(text, timestamptz, timestamptz, bigint),'
            ' pgcounters._range_values(integer, text, jsonb, text[], text, text),'
            ' pgcounters._range_sum(integer, text, jsonb, text[], text, text) TO %I'])
$$;

-- Roles granted before this version may read ranges too: every application role
-- (SELECT on quota_usage, which grant_app gives since version 6).
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
           AND a.privilege_type = 'SELECT'
         ORDER BY 1
    LOOP
        PERFORM pgcounters._grant_app_buckets(r.rolname);
    END LOOP;
END;
$$;

-- No function of this version is executable by PUBLIC.
REVOKE EXECUTE ON FUNCTION pgcounters._range_values(integer, text, jsonb, text[], text, text),
    pgcounters._range_sum(integer, text, jsonb, text[], text, text)
    FROM PUBLIC;
