-- pgcounters schema, version 13: exact sums of decimal columns.
--
-- Counters hold bigint values and the queues bigint deltas. A sum of a
-- numeric(p, s) column is kept exactly as a number of units of 10^-s: the
-- triggers add sum(value) * 10^s (an integer, since every value has at most s
-- decimal places), the queues and the drain stay bigint, and the value is
-- scaled back where it is read or written as a decimal: the exact reads return
-- numeric, and a counter column on the parent table is numeric with the same
-- scale, to which the drain adds delta * 10^-s. The scale is recorded on the
-- target (NULL: an integer counter, as before).

ALTER TABLE pgcounters.targets ADD COLUMN scale integer CHECK (scale BETWEEN 0 AND 18);

-- A sum of decimals as a whole number of 10^-p_scale units. A value with more
-- decimal places, or one the bigint range cannot hold, is refused (PC021):
-- rounding it would make the counter drift.
CREATE FUNCTION pgcounters.scaled(p_value numeric, p_scale integer, p_name text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_units numeric := p_value * (10::numeric ^ p_scale);
BEGIN
    IF v_units <> trunc(v_units) THEN
        RAISE EXCEPTION USING ERRCODE = 'PC021',
            MESSAGE = format('counter %s sums values with %s decimal places: %s has more',
                             p_name, p_scale, p_value),
            HINT = 'give the summed column the scale of the counter, or round the values';
    END IF;
    IF v_units NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
        RAISE EXCEPTION USING ERRCODE = 'PC021',
            MESSAGE = format('counter %s: a change of %s leaves the range of its values '
                             '(%s decimal places, 18 digits in all)', p_name, p_value, p_scale);
    END IF;
    RETURN v_units::bigint;
END;
$$;

-- A number of 10^-p_scale units as a decimal with p_scale decimal places
-- (exact: a product, never a division). Inlined by the planner.
CREATE FUNCTION pgcounters.unscaled(p_units numeric, p_scale integer) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT round(p_units * (10::numeric ^ (-p_scale)), p_scale)
$$;

-- In a probe (planned, never run): true when column p_column of p_table is
-- numeric with p_scale decimal places, else an error. Declared IMMUTABLE so
-- that the planner evaluates it, with its constant arguments, while it plans
-- the probe: a later change of the column's scale (numeric(10,2) to
-- numeric(10,3), or to another type) then stops the probe from planning, and
-- the schema-change guard refuses it.
CREATE FUNCTION pgcounters.decimal_scale_is(p_table regclass, p_column name, p_scale integer)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_type oid;
    v_typmod integer;
BEGIN
    SELECT a.atttypid, a.atttypmod INTO v_type, v_typmod
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = p_table AND a.attname = p_column AND NOT a.attisdropped;
    IF v_type IS DISTINCT FROM 'numeric'::regtype OR v_typmod < 4
       OR ((v_typmod - 4) & 65535) <> p_scale THEN
        RAISE EXCEPTION USING ERRCODE = 'PC020',
            MESSAGE = format('column %s of %s is %s, not numeric with %s decimal places',
                             p_column, p_table,
                             coalesce(pg_catalog.format_type(v_type, v_typmod), 'gone'), p_scale);
    END IF;
    RETURN true;
END;
$$;

-- ensure_target (version 2) for a decimal counter: the target records its
-- scale when it is created; a counter column must be numeric with that scale
-- (create_column_counter takes integer columns only). A counter that exists
-- with another scale (or as an integer counter) is another definition (PC001):
-- its values and pending deltas are in other units.
CREATE FUNCTION pgcounters.ensure_decimal_target(
    p_scale integer,
    p_name text,
    p_key_types text[],
    p_mode text,
    p_schema text DEFAULT NULL,
    p_table text DEFAULT NULL,
    p_column text DEFAULT NULL,
    p_key_column text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_existed boolean;
    v_id integer;
    v_scale integer;
    v_relation regclass;
    v_type text;
BEGIN
    SELECT true, t.scale INTO v_existed, v_scale FROM pgcounters.targets AS t WHERE t.name = p_name;
    IF v_existed IS NULL AND p_table IS NOT NULL THEN
        v_relation := format('%I.%I', p_schema, p_table)::regclass;
        SELECT format_type(a.atttypid, a.atttypmod) INTO v_type
          FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid = v_relation AND a.attname = p_column AND a.attnum > 0
           AND NOT a.attisdropped;
        IF coalesce(v_type, '') <> 'numeric'
           AND coalesce(v_type, '') NOT LIKE 'numeric(%,' || p_scale || ')' THEN
            RAISE EXCEPTION USING ERRCODE = 'PC002',
                MESSAGE = format('counter column %s.%s is %s: the sum of %s has %s decimal '
                                 'places, its column must be numeric(p, %s)', v_relation,
                                 p_column, coalesce(v_type, 'missing'), p_name, p_scale, p_scale);
        END IF;
        INSERT INTO pgcounters.targets (name, key_types, mode, target_schema, target_table,
                                        target_column, target_key_column, scale)
        VALUES (p_name, p_key_types, p_mode, p_schema, p_table, p_column, p_key_column, p_scale)
        ON CONFLICT (name) DO NOTHING;
        SELECT true, t.scale INTO v_existed, v_scale
          FROM pgcounters.targets AS t WHERE t.name = p_name;
    END IF;
    v_id := pgcounters.ensure_target(p_name, p_key_types, p_mode, p_schema, p_table, p_column,
                                     p_key_column);
    IF v_existed IS NULL THEN
        UPDATE pgcounters.targets SET scale = p_scale WHERE id = v_id;
    ELSIF v_scale IS DISTINCT FROM p_scale THEN
        RAISE EXCEPTION USING ERRCODE = 'PC001',
            MESSAGE = format('counter %s exists with %s: it is declared now with %s decimal '
                             'places', p_name,
                             CASE WHEN v_scale IS NULL THEN 'integer values'
                                  ELSE format('%s decimal places', v_scale) END, p_scale),
            HINT = 'drop the counter (pgcounters drop) and install it again, or give it '
                   'another name';
    END IF;
    RETURN v_id;
END;
$$;

-- ---------------------------------------------------------------------------
-- The drain's write of a counter column: a decimal column gets delta * 10^-s.
-- Redefinition of version 8's _apply_column; the only change is the added
-- value's expression (the line marked "scale").
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgcounters._apply_column(
    p_target pgcounters.targets, p_keys text[], p_deltas numeric[], p_locked text[]
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_rows bigint;
BEGIN
    PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
    EXECUTE format(
        'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + %s
           FROM (SELECT u.key, sum(u.delta)::bigint AS delta
                   FROM unnest($1::%s[], $2::numeric[]) AS u(key, delta)
                  WHERE u.key = ANY ($3::%s[])
                  GROUP BY u.key) AS d
          WHERE x.%I = d.key',
        p_target.target_schema, p_target.target_table, p_target.target_column,
        p_target.target_column,
        CASE WHEN p_target.scale IS NULL THEN 'd.delta'  -- scale
             ELSE format('pgcounters.unscaled(d.delta, %s)', p_target.scale) END,
        p_target.key_types[1]::regtype,
        p_target.key_types[1]::regtype, p_target.target_key_column)
    USING p_keys, p_deltas, p_locked;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
    RETURN v_rows;
END;
$$;

-- ---------------------------------------------------------------------------
-- Reading and incrementing from SQL
-- ---------------------------------------------------------------------------
-- The exact value of one key in units (stored + pending, from one snapshot):
-- get's body of version 11, with a decimal counter column read in units.
CREATE FUNCTION pgcounters._exact_units(t pgcounters.targets, p_key text[]) RETURNS numeric
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

-- get (version 11) refuses a decimal counter, whose values it cannot return
-- as bigint: get_decimal reads it.
CREATE OR REPLACE FUNCTION pgcounters.get(p_name text, p_key text[] DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
BEGIN
    IF t.scale IS NOT NULL THEN
        RAISE EXCEPTION 'counter % sums decimals: read it with pgcounters.get_decimal', t.name
            USING ERRCODE = 'PC002';
    END IF;
    RETURN pgcounters._exact_units(t, p_key)::bigint;
END;
$$;

-- The exact value of any counter as a decimal (an integer counter's too).
CREATE FUNCTION pgcounters.get_decimal(p_name text, p_key text[] DEFAULT '{}') RETURNS numeric
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
BEGIN
    RETURN pgcounters.unscaled(pgcounters._exact_units(t, p_key), coalesce(t.scale, 0));
END;
$$;

-- incr (version 8) refuses a decimal counter: its bigint delta would be read as
-- units of 10^-s (incr(..., 1) adding 0.01). incr_decimal adds to it. The only
-- change is the block marked "decimal".
CREATE OR REPLACE FUNCTION pgcounters.incr(
    p_name text, p_key text[] DEFAULT '{}', p_delta bigint DEFAULT 1
)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_key text[] := pgcounters._canonical_key(t, p_key);
    v_value bigint;
BEGIN
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

-- Add a decimal to a counter; for an integer counter the delta must be whole.
-- Returns the new value of a direct counter (NULL for a queued one), as incr.
CREATE FUNCTION pgcounters.incr_decimal(
    p_name text, p_key text[] DEFAULT '{}', p_delta numeric DEFAULT 1
)
RETURNS numeric
LANGUAGE plpgsql AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_key text[] := pgcounters._canonical_key(t, p_key);
    v_units bigint := pgcounters.scaled(p_delta, coalesce(t.scale, 0), p_name);
    v_value numeric;
BEGIN
    IF t.scale IS NULL THEN
        RETURN pgcounters.incr(p_name, p_key, v_units);
    ELSIF t.mode = 'queued' THEN
        INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (t.id, v_key, v_units);
        RETURN NULL;
    ELSIF t.mode = 'unlogged' THEN
        INSERT INTO pgcounters.queue_unlogged (target_id, key, delta) VALUES (t.id, v_key, v_units);
        RETURN NULL;
    ELSIF t.target_table IS NULL THEN
        RETURN pgcounters.unscaled(
            pgcounters.add_direct(ARRAY[t.id], ARRAY[v_key::text], ARRAY[v_units]), t.scale);
    END IF;
    PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
    EXECUTE format(
        'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + $1 WHERE x.%I = $2::%s RETURNING x.%I',
        t.target_schema, t.target_table, t.target_column, t.target_column,
        t.target_key_column, t.key_types[1]::regtype, t.target_column)
    INTO v_value USING pgcounters.unscaled(v_units, t.scale), v_key[1];
    PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
    RETURN v_value;
END;
$$;

-- ---------------------------------------------------------------------------
-- A backfill that ends clears the counter's stale mark, as a whole recount
-- does: the mark as the backfill's first batch started (its writes are in the
-- truth of every key, each backfilled from a later snapshot). A mark that
-- changed since stays.
-- ---------------------------------------------------------------------------
ALTER TABLE pgcounters.backfills ADD COLUMN stale_since timestamptz,
                                 ADD COLUMN stale_statements bigint;

-- The application and the worker run these (the triggers of decimal counters,
-- the drain, recount, verify and the backfill).
ALTER FUNCTION pgcounters.grant_app(text) RENAME TO _grant_app_without_decimals;
ALTER FUNCTION pgcounters.grant_worker(text) RENAME TO _grant_worker_without_decimals;

CREATE FUNCTION pgcounters._grant_decimals(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._for_role(p_role, ARRAY[
        'GRANT EXECUTE ON FUNCTION pgcounters.scaled(numeric, integer, text),'
            ' pgcounters.unscaled(numeric, integer),'
            ' pgcounters.decimal_scale_is(regclass, name, integer),'
            ' pgcounters.ensure_decimal_target(integer, text, text[], text, text, text, text, text),'
            ' pgcounters._exact_units(pgcounters.targets, text[]),'
            ' pgcounters.get_decimal(text, text[]),'
            ' pgcounters.incr_decimal(text, text[], numeric) TO %I'])
$$;

CREATE FUNCTION pgcounters.grant_app(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_app_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
$$;

CREATE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE sql AS $$
    SELECT pgcounters._grant_worker_without_decimals(p_role) || pgcounters._grant_decimals(p_role)
$$;

REVOKE EXECUTE ON FUNCTION pgcounters.scaled(numeric, integer, text),
    pgcounters.unscaled(numeric, integer),
    pgcounters.decimal_scale_is(regclass, name, integer),
    pgcounters.ensure_decimal_target(integer, text, text[], text, text, text, text, text),
    pgcounters._exact_units(pgcounters.targets, text[]),
    pgcounters.get_decimal(text, text[]),
    pgcounters.incr_decimal(text, text[], numeric),
    pgcounters._grant_decimals(text), pgcounters.grant_app(text), pgcounters.grant_worker(text),
    pgcounters._grant_app_without_decimals(text), pgcounters._grant_worker_without_decimals(text)
    FROM PUBLIC;
