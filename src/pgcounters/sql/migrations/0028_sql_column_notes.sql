-- Version 28: an SQL increment of a direct counter column is reported; a NULL delta is
-- refused.
--
-- pgcounters.incr adds to a direct counter column with an UPDATE of the parent row, as
-- the Python client does, but did not note the row's key for a reporting worker, which
-- the client does (note_direct, a statement of its own): a cache kept fresh by the
-- worker's reports missed the changes made from SQL. incr keeps its signature, grants
-- and results; it now notes the key of the row it changed (nothing for a delta of 0 or
-- a key with no row). A NULL delta, which set a nullable counter column to NULL (the
-- count lost), a direct named counter to nothing and a queued one to a constraint error,
-- is refused with SQLSTATE PCT01. Everything else is version 15's.
--
-- _canonical_key (same signature and results) refused a key of several dimensions
-- ('{{7}}') with PostgreSQL's "searching for elements in multidimensional arrays is not
-- supported" instead of its own PC004 error: the dimensions are now checked first.

CREATE OR REPLACE FUNCTION pgcounters.incr(
    p_name text, p_key text[] DEFAULT '{}', p_delta bigint DEFAULT 1
)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t pgcounters.targets;
    v_id integer;
    v_mode text;
    v_types text[];
    v_scale integer;
    v_parts integer := cardinality(p_key);
    v_key text[];
    v_value bigint;
BEGIN
    SELECT c.id, c.mode, c.key_types, c.scale INTO v_id, v_mode, v_types, v_scale
      FROM pgcounters.targets AS c WHERE c.name = p_name;
    -- the fast path: a queued or unlogged counter whose key reads as the canonical function
    -- would write it (a bigint in decimal without leading zeros and at most 18
    -- digits, a lower-case hyphenated uuid, a text of at most 1000 characters)
    IF v_mode IN ('queued', 'unlogged') AND p_delta IS NOT NULL AND v_scale IS NULL
       AND cardinality(v_types) = v_parts
       AND (v_parts = 0 OR (v_parts <= 3 AND array_ndims(p_key) = 1 AND array_lower(p_key, 1) = 1
            AND CASE v_types[1]
                   WHEN 'bigint' THEN p_key[1] ~ '^(0|-?[1-9][0-9]{0,17})$'
                   WHEN 'uuid' THEN p_key[1]
                       ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                   WHEN 'text' THEN length(p_key[1]) <= 1000
                   ELSE false END
            AND (v_parts < 2 OR CASE v_types[2]
                   WHEN 'bigint' THEN p_key[2] ~ '^(0|-?[1-9][0-9]{0,17})$'
                   WHEN 'uuid' THEN p_key[2]
                       ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                   WHEN 'text' THEN length(p_key[2]) <= 1000
                   ELSE false END)
            AND (v_parts < 3 OR CASE v_types[3]
                   WHEN 'bigint' THEN p_key[3] ~ '^(0|-?[1-9][0-9]{0,17})$'
                   WHEN 'uuid' THEN p_key[3]
                       ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                   WHEN 'text' THEN length(p_key[3]) <= 1000
                   ELSE false END))) THEN
        IF v_mode = 'queued' THEN
            INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (v_id, p_key, p_delta);
        ELSE
            INSERT INTO pgcounters.queue_unlogged (target_id, key, delta)
            VALUES (v_id, p_key, p_delta);
        END IF;
        RETURN NULL;
    END IF;
    -- every other call, as in version 13
    IF p_delta IS NULL THEN  -- refused before anything is written (version 28)
        RAISE EXCEPTION 'pgcounters.incr needs a delta: got NULL for counter %', p_name
            USING ERRCODE = 'PCT01';
    END IF;
    t := pgcounters._target(p_name);
    v_key := pgcounters._canonical_key(t, p_key);
    IF t.scale IS NOT NULL THEN  -- decimal
        RAISE EXCEPTION 'counter % sums decimals: add to it with pgcounters.incr_decimal', t.name
            USING ERRCODE = 'PC002';
    END IF;
    IF t.mode = 'queued' THEN
        INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (t.id, v_key, p_delta);
        RETURN NULL;
    ELSIF t.mode = 'unlogged' THEN
        INSERT INTO pgcounters.queue_unlogged (target_id, key, delta) VALUES (t.id, v_key, p_delta);
        RETURN NULL;
    ELSIF t.target_table IS NULL THEN
        RETURN pgcounters.add_direct(ARRAY[t.id], ARRAY[v_key::text], ARRAY[p_delta]);
    END IF;
    -- direct column counter: one row, locked by this UPDATE (the plain UPDATE it replaces)
    PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
    EXECUTE format(
        'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + $1 WHERE x.%I = $2::%s RETURNING x.%I',
        t.target_schema, t.target_table, t.target_column, t.target_column,
        t.target_key_column, t.key_types[1]::regtype, t.target_column)
    INTO v_value USING p_delta, v_key[1];
    PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
    -- the changed row's key noted for a reporting worker, as the Python client notes it
    -- (version 28)
    IF v_value IS NOT NULL AND p_delta <> 0 THEN
        PERFORM pgcounters.note_direct(t.id, ARRAY[v_key[1]]);
    END IF;
    RETURN v_value;
END;
$$;

CREATE OR REPLACE FUNCTION pgcounters._canonical_key(p_target pgcounters.targets, p_key text[])
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_out text[] := '{}';
    v_part text;
    v_type text;
    v_num numeric;
    v_ymd text[];
    v_date date;
    i integer;
BEGIN
    -- several dimensions first: array_position below fails on them
    IF p_key IS NULL OR array_ndims(p_key) > 1
       OR coalesce(array_length(p_key, 1), 0) <> coalesce(array_length(p_target.key_types, 1), 0)
    THEN
        RAISE EXCEPTION 'counter % takes a key of (%), got %',
            p_target.name, array_to_string(p_target.key_types, ', '), coalesce(p_key::text, 'NULL')
            USING ERRCODE = 'PC004';
    END IF;
    IF array_position(p_key, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'counter % takes a key of (%), got %',
            p_target.name, array_to_string(p_target.key_types, ', '), coalesce(p_key::text, 'NULL')
            USING ERRCODE = 'PC004';
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_key, 1), 0) LOOP
        v_part := p_key[i];
        v_type := p_target.key_types[i];
        IF v_type = 'bigint' THEN
            IF v_part !~ '^\s*[+-]?[0-9]{1,30}\s*$' THEN
                RAISE EXCEPTION 'counter %: key part % is not a valid bigint',
                    p_target.name, quote_literal(v_part) USING ERRCODE = 'PC004';
            END IF;
            v_num := btrim(v_part)::numeric;
            IF v_num < -9223372036854775808 OR v_num > 9223372036854775807 THEN
                RAISE EXCEPTION 'counter %: key part % is out of the bigint range',
                    p_target.name, v_part USING ERRCODE = 'PC004';
            END IF;
            v_out := v_out || v_num::bigint::text;
        ELSIF v_type = 'uuid' THEN
            IF v_part !~* '^\s*\{?[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}\}?\s*$'
            THEN
                RAISE EXCEPTION 'counter %: key part % is not a valid uuid',
                    p_target.name, quote_literal(v_part) USING ERRCODE = 'PC004';
            END IF;
            v_out := v_out || btrim(v_part)::uuid::text;
        ELSIF v_type = 'date' THEN
            v_ymd := regexp_match(v_part, '^\s*([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})\s*$');
            IF v_ymd IS NULL OR v_ymd[2]::integer NOT BETWEEN 1 AND 12
               OR v_ymd[3]::integer < 1 OR v_ymd[1]::integer < 1 THEN
                RAISE EXCEPTION 'counter %: key part % is not a valid date (YYYY-MM-DD)',
                    p_target.name, quote_literal(v_part) USING ERRCODE = 'PC004';
            END IF;
            v_date := make_date(v_ymd[1]::integer, v_ymd[2]::integer, 1) + (v_ymd[3]::integer - 1);
            IF extract(month FROM v_date) <> v_ymd[2]::integer THEN
                RAISE EXCEPTION 'counter %: key part % is not a valid date (YYYY-MM-DD)',
                    p_target.name, quote_literal(v_part) USING ERRCODE = 'PC004';
            END IF;
            v_out := v_out || to_char(v_date, 'YYYY-MM-DD');
        ELSE
            IF length(v_part) > 1000 THEN
                RAISE EXCEPTION 'counter %: a text key part has at most 1000 characters',
                    p_target.name USING ERRCODE = 'PC004';
            END IF;
            v_out := v_out || v_part;
        END IF;
    END LOOP;
    RETURN v_out;
END;
$$;
