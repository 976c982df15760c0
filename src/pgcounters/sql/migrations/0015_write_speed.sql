-- Version 15: the SQL increment costs about the INSERT it performs.
--
-- pgcounters.incr looked the counter up through a function call, put every key
-- through the canonical-form function (a PL/pgSQL loop with pattern matches),
-- then ran its INSERT: three statements and two function calls around the one
-- statement that does the work. Now a queued or unlogged counter whose key is
-- already in canonical form (what the Python client and most SQL callers send:
-- a decimal bigint, a lower-case uuid, text; up to three parts) is queued after
-- one lookup, its key checked by expressions PL/pgSQL evaluates without the
-- executor; anything else (an unknown counter, a key to canonicalise or refuse,
-- a direct counter, a sum of decimals) takes the path of version 13, unchanged, with the
-- same errors.

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
    RETURN v_value;
END;
$$;
