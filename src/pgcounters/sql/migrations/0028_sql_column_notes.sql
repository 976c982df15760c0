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
