-- Version 31: every read applies the periods a counter keeps; the SQL entry points raise
-- pgcounters' own errors.
--
-- A counter per period that keeps N periods reads 0 for an older period from the moment
-- it leaves, whatever the retention has deleted yet. The range reads did; get, get_many,
-- get_decimal and top (and the client's reads) read what was stored or queued: a period
-- dated before the first one kept read its old value, and after a late change to one of
-- its rows was drained (its stored value deleted by the retention before), that change
-- alone (-1). Two functions say it once for every read: _first_kept, the key part of the
-- first period a counter keeps ('' for a counter that keeps every key), and _kept, whether
-- a key is in them (its last part, the period, from the first kept on). _exact_units (get,
-- get_many, get_decimal), top, the range reads and the retention use them.
--
-- Ties of top and top_range are in the order of the key's parts as text in byte order
-- (COLLATE "C"), whatever the database's collation: {10} before {9}, {B} before {a}.
--
-- The SQL entry points raise pgcounters' own SQLSTATEs: create_counter and
-- create_column_counter refuse a bad name (PC007) and a bad key type or mode (PC002)
-- before they write, instead of the table's check-constraint error (23514); a direct
-- named counter whose value would leave the bigint range raises PC008 naming the counter
-- and the key, instead of PostgreSQL's bare 22003; top, top_range and drop_expired_buckets
-- refuse a negative or NULL count with PCT01, instead of 22023.

-- The key part of the first period a counter keeps when it counts per period and keeps a
-- number of periods (its recorded spec's keep): the period of the clock (the setting
-- pgcounters.now when set, else now()) and the keep - 1 before it. '' for every other
-- counter: every key of it is kept. Read with _kept.
CREATE FUNCTION pgcounters._first_kept(p_target integer) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_def jsonb;
BEGIN
    SELECT s.definition -> 'bucket' INTO v_def
      FROM pgcounters.targets AS t JOIN pgcounters.specs AS s ON s.name = t.name
     WHERE t.id = p_target;
    IF jsonb_typeof(v_def -> 'keep') IS DISTINCT FROM 'number' THEN
        RETURN '';
    END IF;
    RETURN pgcounters.bucket_text(v_def ->> 'period', v_def ->> 'time_zone',
               pgcounters.bucket_horizon(v_def ->> 'period', v_def ->> 'time_zone',
                                         (v_def ->> 'keep')::integer));
END;
$$;

-- Whether a key is in the periods its counter keeps: p_period is the key's last part (its
-- period, NULL for the empty key), p_first_kept _first_kept of the counter. A period's key
-- part is of fixed width, so its order as text in byte order is the order of time. Every
-- key is kept when p_first_kept is ''. Each argument is used once: the planner inlines it
-- whatever the caller passes.
CREATE FUNCTION pgcounters._kept(p_period text, p_first_kept text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(p_period, '') COLLATE "C" >= p_first_kept COLLATE "C"
$$;

-- Refuse (PC008) a change of a counter that would leave the bigint range.
CREATE FUNCTION pgcounters._overflow(p_target integer, p_key text[], p_value bigint,
    p_delta bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RAISE EXCEPTION 'counter % key %: % + % leaves the range of its values (bigint)',
        coalesce((SELECT t.name FROM pgcounters.targets AS t WHERE t.id = p_target),
                 '#' || p_target), p_key, p_value, p_delta
        USING ERRCODE = 'PC008';
END;
$$;

-- The new value of a stored value of a named counter after a delta; one outside the bigint
-- range is refused (PC008, _overflow) naming the counter and the key. Inlined by the
-- planner: _overflow runs only for such a sum.
CREATE FUNCTION pgcounters._added(p_value bigint, p_delta bigint, p_target integer,
    p_key text[])
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN (p_delta > 0 AND p_value > 9223372036854775807 - p_delta)
                  OR (p_delta < 0 AND p_value < (-9223372036854775807 - 1) - p_delta)
                THEN pgcounters._overflow(p_target, p_key, p_value, p_delta)
                ELSE p_value + p_delta END
$$;

-- Refuse a counter's definition before it is written: a name that is not one (PC007), key
-- types or a mode pgcounters does not know (PC002). The checks of pgcounters.targets,
-- with pgcounters' own errors.
CREATE FUNCTION pgcounters._check_definition(p_name text, p_key_types text[], p_mode text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z_][A-Za-z0-9_.:/-]{0,199}$' THEN
        RAISE EXCEPTION 'invalid counter name %: a letter or _ first, then letters, digits '
                        'and _ . : / -, at most 200 characters',
            coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'PC007';
    END IF;
    IF p_key_types IS NULL OR array_ndims(p_key_types) > 1
       OR NOT p_key_types <@ ARRAY['bigint', 'uuid', 'text', 'date']
       OR array_position(p_key_types, NULL) IS NOT NULL OR cardinality(p_key_types) > 8 THEN
        RAISE EXCEPTION 'counter %: key types are at most 8 of bigint, uuid, text and date, got %',
            p_name, coalesce(p_key_types::text, 'NULL')
            USING ERRCODE = 'PC002';
    END IF;
    IF p_mode IS NULL OR p_mode NOT IN ('queued', 'unlogged', 'direct') THEN
        RAISE EXCEPTION 'counter %: the mode is queued, unlogged or direct, got %',
            p_name, coalesce(quote_literal(p_mode), 'NULL')
            USING ERRCODE = 'PC002';
    END IF;
END;
$$;

-- create_counter: the definition checked first (version 1's body otherwise).
CREATE OR REPLACE FUNCTION pgcounters.create_counter(
    p_name text,
    p_key_types text[] DEFAULT '{}',
    p_mode text DEFAULT 'queued'
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_existing pgcounters.targets;
    v_id integer;
BEGIN
    PERFORM pgcounters._check_definition(p_name, p_key_types, p_mode);
    SELECT * INTO v_existing FROM pgcounters.targets WHERE name = p_name;
    IF FOUND THEN
        IF v_existing.key_types IS DISTINCT FROM p_key_types
           OR v_existing.mode IS DISTINCT FROM p_mode
           OR v_existing.target_table IS NOT NULL THEN
            RAISE EXCEPTION 'counter % already exists with another definition', p_name
                USING ERRCODE = 'PC001';
        END IF;
        RETURN v_existing.id;
    END IF;
    INSERT INTO pgcounters.targets (name, key_types, mode)
    VALUES (p_name, p_key_types, p_mode)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        -- a concurrent declaration won the race: compare with it
        RETURN pgcounters.create_counter(p_name, p_key_types, p_mode);
    END IF;
    RETURN v_id;
END;
$$;

-- create_column_counter: the name and mode checked first, a NULL table refused.
CREATE OR REPLACE FUNCTION pgcounters.create_column_counter(
    p_name text,
    p_table regclass,
    p_column text,
    p_key_column text DEFAULT 'id',
    p_mode text DEFAULT 'queued'
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_schema text;
    v_table text;
    v_key_type text;
    v_col_type text;
    v_existing pgcounters.targets;
    v_id integer;
BEGIN
    PERFORM pgcounters._check_definition(p_name, '{}', p_mode);
    IF p_table IS NULL THEN
        RAISE EXCEPTION 'counter %: a counter column needs its table, got NULL', p_name
            USING ERRCODE = 'PC002';
    END IF;
    SELECT n.nspname, c.relname INTO v_schema, v_table
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_table;

    SELECT format_type(a.atttypid, NULL) INTO v_col_type
      FROM pg_attribute a
     WHERE a.attrelid = p_table AND a.attname = p_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF v_col_type IS NULL THEN
        RAISE EXCEPTION 'column % does not exist in table %', p_column, p_table
            USING ERRCODE = 'PC002';
    END IF;
    IF v_col_type NOT IN ('bigint', 'integer', 'smallint') THEN
        RAISE EXCEPTION 'counter column %.% has type %; an integer type is required',
            p_table, p_column, v_col_type USING ERRCODE = 'PC002';
    END IF;

    SELECT CASE format_type(a.atttypid, NULL)
               WHEN 'bigint' THEN 'bigint' WHEN 'integer' THEN 'bigint'
               WHEN 'smallint' THEN 'bigint' WHEN 'uuid' THEN 'uuid'
               WHEN 'text' THEN 'text' WHEN 'character varying' THEN 'text'
               WHEN 'date' THEN 'date'
           END
      INTO v_key_type
      FROM pg_attribute a
     WHERE a.attrelid = p_table AND a.attname = p_key_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'key column % does not exist in table %', p_key_column, p_table
            USING ERRCODE = 'PC002';
    END IF;
    IF v_key_type IS NULL THEN
        RAISE EXCEPTION 'key column %.% has a type pgcounters cannot key on', p_table, p_key_column
            USING ERRCODE = 'PC002';
    END IF;

    SELECT * INTO v_existing FROM pgcounters.targets WHERE name = p_name;
    IF FOUND THEN
        IF v_existing.target_schema IS DISTINCT FROM v_schema
           OR v_existing.target_table IS DISTINCT FROM v_table
           OR v_existing.target_column IS DISTINCT FROM p_column
           OR v_existing.target_key_column IS DISTINCT FROM p_key_column
           OR v_existing.mode IS DISTINCT FROM p_mode THEN
            RAISE EXCEPTION 'counter % already exists with another definition', p_name
                USING ERRCODE = 'PC001';
        END IF;
        RETURN v_existing.id;
    END IF;

    INSERT INTO pgcounters.targets
        (name, key_types, mode, target_schema, target_table, target_column, target_key_column)
    VALUES (p_name, ARRAY[v_key_type], p_mode, v_schema, v_table, p_column, p_key_column)
    ON CONFLICT (name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RETURN pgcounters.create_column_counter(p_name, p_table, p_column, p_key_column, p_mode);
    END IF;
    RETURN v_id;
END;
$$;

-- add_direct: each upsert adds through _added (PC008 naming the counter and key).
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
            ON CONFLICT (target_id, key)
            DO UPDATE SET value = pgcounters._added(c.value, excluded.value, c.target_id, c.key)
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
        ON CONFLICT (target_id, key)
            DO UPDATE SET value = pgcounters._added(c.value, excluded.value, c.target_id, c.key)
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
        ON CONFLICT (target_id, key)
            DO UPDATE SET value = pgcounters._added(c.value, excluded.value, c.target_id, c.key)
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

-- _exact_units (get, get_many, get_decimal): 0 for a period no longer kept.
CREATE OR REPLACE FUNCTION pgcounters._exact_units(t pgcounters.targets, p_key text[]) RETURNS numeric
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_key text[] := pgcounters._canonical_key(t, p_key);
    v_text text := v_key::text;
    v_standby boolean := pg_is_in_recovery();
    v_stored numeric;
    v_pending numeric;
BEGIN
    IF v_standby AND t.mode = 'unlogged' THEN
        RAISE EXCEPTION 'counter % is unlogged: its pending deltas exist only on the primary, '
                        'read it there (its stored value is readable here)', t.name
            USING ERRCODE = 'PCR01';
    END IF;
    PERFORM pgcounters._backfilling(t.id);
    -- a period a counter per period no longer keeps reads 0, whatever is stored or queued
    IF t.target_table IS NULL
       AND NOT pgcounters._kept(v_key[cardinality(v_key)], pgcounters._first_kept(t.id)) THEN
        RETURN 0;
    END IF;
    IF t.target_table IS NULL THEN
        SELECT value INTO v_stored FROM pgcounters.counters WHERE target_id = t.id AND key = v_key;
    ELSE
        EXECUTE format('SELECT x.%I * %s FROM %I.%I AS x WHERE x.%I = $1::%s',
            t.target_column, 10::numeric ^ coalesce(t.scale, 0),
            t.target_schema, t.target_table, t.target_key_column, t.key_types[1]::regtype)
        INTO v_stored USING v_key[1];
    END IF;
    v_pending := coalesce((SELECT sum(delta) FROM pgcounters.queue
                            WHERE target_id = t.id AND key = v_text), 0);
    IF NOT v_standby THEN
        v_pending := v_pending + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                                            WHERE target_id = t.id AND key = v_text), 0);
    END IF;
    RETURN coalesce(v_stored, 0) + v_pending;
END;
$$;

-- top: the periods no longer kept left out, ties in byte order, PCT01.
CREATE OR REPLACE FUNCTION pgcounters.top(p_name text, p_n bigint DEFAULT 10)
RETURNS TABLE (key text[], value numeric)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
BEGIN
    IF p_n IS NULL OR p_n < 0 THEN
        RAISE EXCEPTION 'n must be zero or more, got %', coalesce(p_n::text, 'NULL')
            USING ERRCODE = 'PCT01';
    END IF;
    IF t.target_table IS NULL THEN
        -- the band is monotonic in the value: this is ORDER BY value DESC, key,
        -- read from the index on (target_id, band DESC); periods no longer kept left out
        RETURN QUERY
            SELECT c.key, pgcounters.unscaled(c.value, coalesce(t.scale, 0))
              FROM pgcounters.counters AS c
             WHERE c.target_id = t.id
               AND pgcounters._kept(c.key[cardinality(c.key)],
                                    (SELECT pgcounters._first_kept(t.id)))
             ORDER BY c.band DESC, c.value DESC, c.key COLLATE "C"
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

-- top_range: ties in byte order, PCT01.
CREATE OR REPLACE FUNCTION pgcounters.top_range(p_name text, p_from timestamptz, p_to timestamptz,
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
            USING ERRCODE = 'PCT01';
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
             GROUP BY 1 ORDER BY 2 DESC, u.k[1:v_part - 1] COLLATE "C" LIMIT p_n;
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
             GROUP BY 1 ORDER BY 2 DESC, u.k[1:v_part - 1] COLLATE "C" LIMIT p_n;
    END IF;
END;
$$;

-- _range_values and _range_sum: the first period kept from _first_kept, tested by _kept.
CREATE OR REPLACE FUNCTION pgcounters._range_values(p_target integer, p_name text, p_bucket jsonb,
    p_key text[], p_first text, p_last text)
RETURNS TABLE (bucket text, value bigint)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_def jsonb;
    v_first_kept text;
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
    v_first_kept := pgcounters._first_kept(p_target);
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
             WHERE pgcounters._kept(u.b, v_first_kept)
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
             WHERE pgcounters._kept(u.b, v_first_kept)
             GROUP BY u.b;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgcounters._range_sum(p_target integer, p_name text, p_bucket jsonb,
    p_key text[], p_first text, p_last text)
RETURNS bigint
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_def jsonb;
    v_first_kept text;
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
    -- the periods no longer kept are left out: the range starts at the first kept
    v_first_kept := pgcounters._first_kept(p_target);
    IF NOT pgcounters._kept(p_first, v_first_kept) THEN
        v_low := p_key || v_first_kept;
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

-- drop_expired_buckets: the values that _kept says are not kept; PCT01.
CREATE OR REPLACE FUNCTION pgcounters.drop_expired_buckets(p_limit integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    s record;
    v_first text;
    v_left bigint := p_limit;
    v_done bigint;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit must be a positive number of values, got %',
            coalesce(p_limit::text, 'NULL') USING ERRCODE = 'PCT01';
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
        v_first := pgcounters._first_kept(s.id);
        DELETE FROM pgcounters.counters AS c
         WHERE c.target_id = s.id
           AND c.key IN (SELECT x.key FROM pgcounters.counters AS x
                          WHERE x.target_id = s.id
                            AND NOT pgcounters._kept(x.key[cardinality(x.key)], v_first)
                          ORDER BY x.key LIMIT v_left FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS v_done = ROW_COUNT;
        v_left := v_left - v_done;
    END LOOP;
    RETURN p_limit - v_left;
END;
$$;

-- The application's rights on counters per period, with the two functions of the window.
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
            ' pgcounters._range_sum(integer, text, jsonb, text[], text, text),'
            ' pgcounters._first_kept(integer), pgcounters._kept(text, text) TO %I'])
$$;

-- Roles granted before this version read as they did: every application role (SELECT on
-- quota_usage, which grant_app gives since version 6) may call the two functions of the
-- window.
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
REVOKE EXECUTE ON FUNCTION pgcounters._first_kept(integer), pgcounters._kept(text, text),
    pgcounters._added(bigint, bigint, integer, text[]),
    pgcounters._overflow(integer, text[], bigint, bigint),
    pgcounters._check_definition(text, text[], text)
    FROM PUBLIC;
