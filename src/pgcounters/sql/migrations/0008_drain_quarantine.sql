-- pgcounters schema, version 8: background work that never waits on the
-- application, and a drain that no delta can stop.
--
-- * The drain takes the parent rows of column counters with SKIP LOCKED. A
--   row an application transaction holds is left alone: its deltas go back
--   into the queue (one summed row per key, keeping the age of the oldest) and
--   a later batch applies them. Exact reads stay exact: the deltas are pending
--   the whole time. The drain never waits on a lock an application may hold,
--   so it can never be a party to a deadlock with it.
-- * A delta that cannot be applied (its sum leaves the bigint range, its key
--   does not cast to the parent's key type or is not an array, its counter is
--   gone) is moved to pgcounters.quarantine with the error, and every other
--   delta of the batch is applied. An operator lists, replays or discards it.
-- * Every SQL entry point that takes a key (incr, get, add_direct) casts each
--   part to the counter's key type and keeps its canonical text ('+7' and
--   '007' are 7, an upper-case UUID is the lower-case one, '2026-1-5' is
--   2026-01-05), or refuses the key (PC004).
-- * Retries of aborted batches (recount, verify, drain) are counted per
--   operation and reason, for `pgcounters status`.

-- ---------------------------------------------------------------------------
-- Keys
-- ---------------------------------------------------------------------------

-- The canonical text[] of p_key for a counter, or PC004. The text of each part
-- is what the Python client writes: a bigint in decimal, a lower-case
-- hyphenated UUID, an ISO date (YYYY-MM-DD, whatever DateStyle says), text as
-- given. Only ISO dates are read (year-month-day): other date spellings depend
-- on DateStyle. No exception block: validity is checked before each cast, so
-- a call costs no subtransaction.
CREATE FUNCTION pgcounters._canonical_key(p_target pgcounters.targets, p_key text[])
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
    IF p_key IS NULL
       OR coalesce(array_length(p_key, 1), 0) <> coalesce(array_length(p_target.key_types, 1), 0)
       OR array_position(p_key, NULL) IS NOT NULL
       OR array_ndims(p_key) > 1 THEN
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

-- Keys written before this version by SQL callers may not be canonical ('007'
-- next to '7'): they split a count and could not be read back by the client.
-- Named counters' stored rows and queued deltas are re-keyed once, here; keys
-- that do not cast are left as they are (the drain sets such deltas aside).
CREATE FUNCTION pgcounters._is_canonical(p_types text[], p_key text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(bool_and(CASE t.kind
               WHEN 'bigint' THEN k.part ~ '^-?(0|[1-9][0-9]*)$'
               WHEN 'uuid' THEN k.part ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
               WHEN 'date' THEN k.part ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$'
               ELSE true END), true)
      FROM unnest(p_types) WITH ORDINALITY AS t(kind, i)
      JOIN unnest(p_key) WITH ORDINALITY AS k(part, i) USING (i)
$$;

DO $$
DECLARE
    t pgcounters.targets;
    r record;
    v_key text[];
BEGIN
    FOR t IN
        SELECT * FROM pgcounters.targets
         WHERE target_table IS NULL AND key_types && ARRAY['bigint', 'uuid', 'date']
         ORDER BY id
    LOOP
        FOR r IN
            SELECT c.key, c.value FROM pgcounters.counters AS c
             WHERE c.target_id = t.id AND NOT pgcounters._is_canonical(t.key_types, c.key)
        LOOP
            BEGIN
                v_key := pgcounters._canonical_key(t, r.key);
            EXCEPTION WHEN sqlstate 'PC004' THEN
                CONTINUE;
            END;
            DELETE FROM pgcounters.counters WHERE target_id = t.id AND key = r.key;
            INSERT INTO pgcounters.counters AS c (target_id, key, value)
            VALUES (t.id, v_key, r.value)
            ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value;
        END LOOP;
        -- queued keys: only simple arrays (no quotes or nesting) can be cast safely in
        -- the filter; a non-text part never needs quotes in its canonical form
        FOR r IN
            SELECT 'queue' AS queue, q.id, q.key FROM pgcounters.queue AS q
             WHERE q.target_id = t.id
               AND CASE WHEN q.key ~ '^\{[^{}"\\]*\}$'
                        THEN NOT pgcounters._is_canonical(t.key_types, q.key::text[])
                        ELSE false END
            UNION ALL
            SELECT 'queue_unlogged', q.id, q.key FROM pgcounters.queue_unlogged AS q
             WHERE q.target_id = t.id
               AND CASE WHEN q.key ~ '^\{[^{}"\\]*\}$'
                        THEN NOT pgcounters._is_canonical(t.key_types, q.key::text[])
                        ELSE false END
        LOOP
            BEGIN
                v_key := pgcounters._canonical_key(t, r.key::text[]);
            EXCEPTION WHEN sqlstate 'PC004' OR invalid_text_representation THEN
                CONTINUE;
            END;
            EXECUTE format('UPDATE pgcounters.%I SET key = $1 WHERE id = $2', r.queue)
            USING v_key::text, r.id;
        END LOOP;
    END LOOP;
END;
$$;

-- incr (as in version 6) with canonical keys.
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

-- get (as in version 7) with canonical keys.
CREATE OR REPLACE FUNCTION pgcounters.get(p_name text, p_key text[] DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_key text[] := pgcounters._canonical_key(t, p_key);
    v_text text := v_key::text;
    v_stored bigint;
BEGIN
    IF t.target_table IS NULL THEN
        SELECT value INTO v_stored FROM pgcounters.counters WHERE target_id = t.id AND key = v_key;
    ELSE
        EXECUTE format('SELECT x.%I FROM %I.%I AS x WHERE x.%I = $1::%s',
            t.target_column, t.target_schema, t.target_table,
            t.target_key_column, t.key_types[1]::regtype)
        INTO v_stored USING v_key[1];
    END IF;
    RETURN coalesce(v_stored, 0)
         + coalesce((SELECT sum(delta) FROM pgcounters.queue
                      WHERE target_id = t.id AND key = v_text), 0)
         + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                      WHERE target_id = t.id AND key = v_text), 0);
END;
$$;

-- add_direct (as in version 6) with canonical keys. Keys that are already
-- canonical (the Python client's, the triggers') come out unchanged.
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
            ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
            RETURNING c.value INTO v_value;
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
        ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
        RETURNING c.value INTO v_value;
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
        ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
        RETURNING c.target_id, c.key, c.value
    )
    SELECT a.value INTO v_value FROM applied AS a ORDER BY a.target_id DESC, a.key DESC LIMIT 1;
    RETURN v_value;
END;
$$;

-- ---------------------------------------------------------------------------
-- The quarantine
-- ---------------------------------------------------------------------------

-- Deltas the drain could not apply, one row per queued delta, with the error.
-- `pgcounters quarantine list | replay | discard` works on it; a replay moves
-- rows back into their queue (after the cause is fixed), a discard deletes them.
CREATE TABLE pgcounters.quarantine (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    target_id      integer NOT NULL,
    counter        text,            -- its name when set aside (NULL: no such counter)
    key            text NOT NULL,   -- as it was queued
    delta          bigint NOT NULL,
    unlogged       boolean NOT NULL,
    created_at     timestamptz NOT NULL,
    quarantined_at timestamptz NOT NULL DEFAULT now(),
    sqlstate       text NOT NULL,
    error          text NOT NULL
);

CREATE INDEX quarantine_target ON pgcounters.quarantine (target_id, id);

-- The names of dropped counters, so that a delta written for a dropped id (by
-- a long-lived client that cached it, or a transaction that committed after
-- the drop) is set aside under its counter's name, and a replay by name can
-- send it to a counter re-created under that name.
CREATE TABLE pgcounters.dropped_targets (
    id         integer PRIMARY KEY,
    name       text NOT NULL,
    dropped_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION pgcounters._remember_dropped() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgcounters.dropped_targets (id, name) VALUES (OLD.id, OLD.name)
    ON CONFLICT (id) DO UPDATE SET name = excluded.name, dropped_at = excluded.dropped_at;
    RETURN NULL;
END;
$$;

ALTER FUNCTION pgcounters._remember_dropped()
    SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp;

CREATE TRIGGER targets_remember_dropped AFTER DELETE ON pgcounters.targets
    FOR EACH ROW EXECUTE FUNCTION pgcounters._remember_dropped();

-- Errors of the data, which a later attempt would meet again: the delta is set
-- aside. Anything else (deadlock, serialization failure, lock or statement
-- timeout, lost privileges, a full disk) aborts the batch as before and it is
-- retried whole: nothing in it is wrong.
CREATE FUNCTION pgcounters._quarantinable(p_sqlstate text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT left(p_sqlstate, 2) IN ('22', '23') OR p_sqlstate IN ('PC003', 'PC004', 'P0001')
$$;

-- ---------------------------------------------------------------------------
-- Statistics: deltas left for later, deltas set aside, retries
-- ---------------------------------------------------------------------------

ALTER TABLE pgcounters.drain_stats
    ADD COLUMN busy bigint NOT NULL DEFAULT 0,
    ADD COLUMN quarantined bigint NOT NULL DEFAULT 0;

-- _record_drain of version 5, with the deltas left for later (their parent
-- row was busy) and the deltas set aside; the fold into the totals row keeps
-- them too. The version 5 function stays for code that calls it.
CREATE FUNCTION pgcounters._record_drain(
    p_unlogged boolean, p_deltas bigint, p_keys bigint, p_seconds double precision,
    p_busy bigint, p_quarantined bigint
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_bucket timestamptz := date_trunc('minute', now());
    v_new boolean;
BEGIN
    INSERT INTO pgcounters.drain_stats AS s
           (bucket, unlogged, pid, batches, deltas, keys, seconds, busy, quarantined)
    VALUES (v_bucket, p_unlogged, pg_backend_pid(), 1, p_deltas, p_keys, p_seconds,
            p_busy, p_quarantined)
    ON CONFLICT (bucket, unlogged, pid) DO UPDATE
       SET batches = s.batches + 1,
           deltas = s.deltas + excluded.deltas,
           keys = s.keys + excluded.keys,
           seconds = s.seconds + excluded.seconds,
           busy = s.busy + excluded.busy,
           quarantined = s.quarantined + excluded.quarantined
    RETURNING (xmax = 0) INTO v_new;

    IF v_new THEN
        WITH old AS (
            DELETE FROM pgcounters.drain_stats d
             WHERE (d.bucket, d.unlogged, d.pid) IN (
                   SELECT o.bucket, o.unlogged, o.pid
                     FROM pgcounters.drain_stats o
                    WHERE o.bucket > '-infinity' AND o.bucket < v_bucket - interval '1 hour'
                      FOR UPDATE SKIP LOCKED)
            RETURNING d.unlogged, d.batches, d.deltas, d.keys, d.seconds, d.busy, d.quarantined
        )
        INSERT INTO pgcounters.drain_stats AS s
               (bucket, unlogged, pid, batches, deltas, keys, seconds, busy, quarantined)
        SELECT '-infinity', o.unlogged, 0, sum(o.batches), sum(o.deltas), sum(o.keys),
               sum(o.seconds), sum(o.busy), sum(o.quarantined)
          FROM old o
         GROUP BY o.unlogged
        ON CONFLICT (bucket, unlogged, pid) DO UPDATE
           SET batches = s.batches + excluded.batches,
               deltas = s.deltas + excluded.deltas,
               keys = s.keys + excluded.keys,
               seconds = s.seconds + excluded.seconds,
               busy = s.busy + excluded.busy,
               quarantined = s.quarantined + excluded.quarantined;
    END IF;
END;
$$;

-- Batches that PostgreSQL aborted (deadlock, serialization failure, lock or
-- statement timeout) and that were retried, per operation and reason.
CREATE TABLE pgcounters.retries (
    operation text NOT NULL,
    reason    text NOT NULL,
    retries   bigint NOT NULL DEFAULT 0,
    last_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation, reason)
);

CREATE FUNCTION pgcounters.record_retry(p_operation text, p_reason text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO pgcounters.retries AS r (operation, reason, retries)
    VALUES (p_operation, p_reason, 1)
    ON CONFLICT (operation, reason) DO UPDATE SET retries = r.retries + 1, last_at = now()
$$;

-- ---------------------------------------------------------------------------
-- Draining
-- ---------------------------------------------------------------------------

-- What a batch carries to column counters: one row per (target, key part)
-- with the summed delta (numeric: a sum may leave the bigint range, which is
-- found when it is applied), the number of deltas and the oldest one's time.
CREATE TYPE pgcounters.batch_delta AS (
    target_id integer, key text, delta numeric, n bigint, created_at timestamptz
);

-- One queued delta, as claimed (the careful path keeps them one by one).
CREATE TYPE pgcounters.claimed_delta AS (
    id bigint, target_id integer, key text, delta bigint, created_at timestamptz
);

-- THE one place where the drain writes a counter column of a user table:
-- add p_deltas[i] to the row keyed p_keys[i] (texts of the key type, summed
-- per typed key), for keys in p_locked only (rows this transaction has
-- locked). pgcounters.applying is 'on' for the UPDATE only, so a guard on the
-- table can tell pgcounters' writes from anyone else's. Returns rows updated.
CREATE FUNCTION pgcounters._apply_column(
    p_target pgcounters.targets, p_keys text[], p_deltas numeric[], p_locked text[]
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_rows bigint;
BEGIN
    PERFORM pg_catalog.set_config('pgcounters.applying', 'on', true);
    EXECUTE format(
        'UPDATE %I.%I AS x SET %I = coalesce(x.%I, 0) + d.delta
           FROM (SELECT u.key, sum(u.delta)::bigint AS delta
                   FROM unnest($1::%s[], $2::numeric[]) AS u(key, delta)
                  WHERE u.key = ANY ($3::%s[])
                  GROUP BY u.key) AS d
          WHERE x.%I = d.key',
        p_target.target_schema, p_target.target_table, p_target.target_column,
        p_target.target_column, p_target.key_types[1]::regtype,
        p_target.key_types[1]::regtype, p_target.target_key_column)
    USING p_keys, p_deltas, p_locked;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    PERFORM pg_catalog.set_config('pgcounters.applying', '', true);
    RETURN v_rows;
END;
$$;

-- Lock, without waiting, the rows of one parent table keyed by p_keys (texts
-- of the key type), in key order. locked: the keys of the rows now locked by
-- this transaction; busy: keys of rows that exist but another transaction
-- holds. Keys of rows that do not exist are in neither.
CREATE FUNCTION pgcounters._lock_parents(
    p_schema text, p_table text, p_key_column text, p_key_type text, p_keys text[],
    OUT locked text[], OUT busy text[]
)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(
        'SELECT coalesce(array_agg(l.k::text ORDER BY l.k), ''{}'') FROM (
           SELECT x.%I AS k FROM %I.%I AS x WHERE x.%I = ANY ($1::%s[])
            ORDER BY x.%I FOR NO KEY UPDATE OF x SKIP LOCKED) AS l',
        p_key_column, p_schema, p_table, p_key_column, p_key_type::regtype, p_key_column)
    INTO locked USING p_keys;
    busy := '{}';
    IF cardinality(locked) < cardinality(p_keys) THEN
        -- fewer rows than keys: rows that are gone, or busy (another transaction
        -- holds them, or inserted them and has not committed)
        EXECUTE format(
            'SELECT coalesce(array_agg(w.u::text ORDER BY w.u), ''{}'')
               FROM (SELECT DISTINCT u FROM unnest($1::%s[]) AS u) AS w
              WHERE w.u <> ALL ($2::%s[])
                AND EXISTS (SELECT 1 FROM %I.%I AS x WHERE x.%I = w.u)',
            p_key_type::regtype, p_key_type::regtype, p_schema, p_table, p_key_column)
        INTO busy USING p_keys, locked;
    END IF;
END;
$$;

-- Apply the column part of a batch: for each parent table (in name order) lock
-- its rows without waiting, apply the deltas of the rows locked, put the
-- deltas of busy rows back into the queue (one row per key, with the oldest
-- delta's time), discard the deltas of rows that no longer exist.
CREATE FUNCTION pgcounters._drain_columns(
    p_columns pgcounters.batch_delta[], p_unlogged boolean,
    OUT keys bigint, OUT busy bigint, OUT first_requeued bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text := CASE WHEN p_unlogged THEN 'queue_unlogged' ELSE 'queue' END;
    c record;
    t pgcounters.targets;
    v_locked text[];
    v_busy text[];
    v_n bigint;
    v_id bigint;
BEGIN
    keys := 0;
    busy := 0;
    FOR c IN
        SELECT g.target_schema AS s, g.target_table AS r, g.target_key_column AS k,
               g.key_types[1] AS key_type, array_agg(DISTINCT d.key) AS ks
          FROM unnest(p_columns) AS d
          JOIN pgcounters.targets AS g ON g.id = d.target_id
         GROUP BY 1, 2, 3, 4
         ORDER BY 1, 2, 3, 4
    LOOP
        -- drainers take turns on a table (tables in name order, so they cannot wait for
        -- each other in a cycle): without this, a second drainer finds every row the
        -- first one holds busy and puts its deltas back. A drainer holding this lock
        -- waits for nothing (SKIP LOCKED below), so the wait is always short.
        PERFORM pg_advisory_xact_lock(hashtext('pgcounters.parents'),
                                      hashtext(format('%I.%I', c.s, c.r)));
        SELECT l.locked, l.busy INTO v_locked, v_busy
          FROM pgcounters._lock_parents(c.s, c.r, c.k, c.key_type, c.ks) AS l;
        FOR t IN
            SELECT g.* FROM pgcounters.targets AS g
             WHERE g.target_schema = c.s AND g.target_table = c.r AND g.target_key_column = c.k
               AND g.key_types[1] = c.key_type
               AND g.id IN (SELECT d.target_id FROM unnest(p_columns) AS d)
             ORDER BY g.id
        LOOP
            IF cardinality(v_locked) > 0 THEN
                keys := keys + pgcounters._apply_column(t,
                    ARRAY(SELECT d.key FROM unnest(p_columns) AS d WHERE d.target_id = t.id),
                    ARRAY(SELECT d.delta FROM unnest(p_columns) AS d WHERE d.target_id = t.id),
                    v_locked);
            END IF;
            IF cardinality(v_busy) > 0 THEN
                -- back into the queue: one delta per key, as old as its oldest
                EXECUTE format(
                    'WITH src AS (
                        SELECT d.* FROM unnest($1::pgcounters.batch_delta[]) AS d
                         WHERE d.target_id = $2 AND d.key::%s = ANY ($3::%s[])
                     ), back AS (
                        INSERT INTO pgcounters.%I (target_id, key, delta, created_at)
                        SELECT s.target_id, ARRAY[s.key]::text, s.delta::bigint, s.created_at
                          FROM src AS s ORDER BY s.key
                        RETURNING id)
                     SELECT (SELECT coalesce(sum(n), 0) FROM src)::bigint,
                            (SELECT min(id) FROM back)',
                    t.key_types[1]::regtype, t.key_types[1]::regtype, v_queue)
                INTO v_n, v_id USING p_columns, t.id, v_busy;
                busy := busy + v_n;
                first_requeued := least(first_requeued, v_id);
            END IF;
        END LOOP;
    END LOOP;
END;
$$;

-- Apply at most p_limit pending deltas of one queue, in the caller's
-- transaction (one batch = one transaction: the caller commits). Returns:
--   deltas       deltas applied;
--   keys         counter values (rows) changed;
--   busy         deltas left queued because an application holds their
--                parent row (queued again, as one delta per key);
--   quarantined  deltas set aside in pgcounters.quarantine;
--   ahead        when some were left busy: whether deltas queued before them
--                remain (a drain that finds only busy deltas and nothing
--                ahead of them is done for now).
--
-- The claim is version 5's (the advisory-lock holder takes an id range, any
-- other drainer claims with SKIP LOCKED; a column counter whose table or
-- columns are gone is left out). Then:
--
-- * named counters are upserted in (target, key) order in the claim's
--   statement. Only drainers and recount lock these rows, all in key order;
-- * parent rows of column counters are taken with SKIP LOCKED (the drain never
--   waits on an application's lock, so it is never a party to a deadlock);
--   busy rows keep their deltas queued for a later batch;
-- * if anything in the batch cannot be applied (a data error), the whole
--   batch is taken again on a careful path: one (target, key) at a time, each
--   in a subtransaction, and the deltas of a failing one go to the
--   quarantine with the error. The fast path costs one subtransaction per
--   batch; the careful one runs only for a batch holding a bad delta, which
--   leaves the queue with it.
CREATE FUNCTION pgcounters.drain_queue(
    p_limit integer DEFAULT 10000,
    p_unlogged boolean DEFAULT false,
    OUT deltas bigint,
    OUT keys bigint,
    OUT busy bigint,
    OUT quarantined bigint,
    OUT ahead boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text := CASE WHEN p_unlogged THEN 'queue_unlogged' ELSE 'queue' END;
    v_started timestamptz := clock_timestamp();
    v_sole boolean;
    v_claim text;
    v_skip text := '';
    v_broken integer[] := pgcounters._broken_targets();
    v_head bigint;
    v_claimed bigint;
    v_orphans bigint;
    v_columns pgcounters.batch_delta[];
    v_first_requeued bigint;
    v_state text;
    v_message text;
    v_column_keys bigint;
    v_column_busy bigint;
    v_last_claimed bigint;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'batch size must be a positive integer, got %', p_limit
            USING ERRCODE = 'PC005';
    END IF;
    IF cardinality(v_broken) > 0 THEN
        RAISE WARNING 'pgcounters: deltas of counters % stay queued: their table or column '
                      'no longer exists', v_broken;
        v_skip := ' AND q.target_id <> ALL ($2)';
    END IF;
    deltas := 0;
    keys := 0;
    busy := 0;
    quarantined := 0;
    ahead := false;

    v_sole := pg_try_advisory_xact_lock(hashtext('pgcounters.drain'), p_unlogged::integer);
    IF v_sole THEN
        v_claim := 'q.id BETWEEN (SELECT lo FROM head) AND (SELECT lo FROM head) + $1 - 1';
    ELSE
        v_claim := 'q.id = ANY (ARRAY(SELECT id FROM pgcounters.%1$I AS q WHERE true'
                   || v_skip || ' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))';
    END IF;

    BEGIN
        LOOP
        EXECUTE format($q$
            WITH head AS MATERIALIZED (
                SELECT min(id) AS lo FROM pgcounters.%1$I AS q WHERE true $q$ || v_skip || $q$
            ), claimed AS (
                DELETE FROM pgcounters.%1$I AS q
                 WHERE $q$ || v_claim || v_skip || $q$
                RETURNING q.id, q.target_id, q.key, q.delta, q.created_at
            ), summed AS (
                SELECT target_id, key::text[] AS key, sum(delta) AS delta, count(*) AS n,
                       min(created_at) AS created_at, max(id) AS last_id
                  FROM claimed
                 GROUP BY target_id, claimed.key
            ), named AS (
                INSERT INTO pgcounters.counters AS k (target_id, key, value)
                SELECT s.target_id, s.key, s.delta
                  FROM summed s
                  JOIN pgcounters.targets t ON t.id = s.target_id AND t.target_table IS NULL
                 WHERE s.delta <> 0
                 ORDER BY s.target_id, s.key
                ON CONFLICT (target_id, key) DO UPDATE SET value = k.value + excluded.value
                RETURNING 1
            )
            SELECT coalesce(sum(s.n), 0)::bigint,
                   (SELECT count(*) FROM named),
                   array_agg((s.target_id, s.key[1], s.delta, s.n, s.created_at)::pgcounters.batch_delta)
                       FILTER (WHERE t.target_table IS NOT NULL AND s.delta <> 0),
                   $q$ || CASE WHEN v_sole THEN '(SELECT lo FROM head)' ELSE 'NULL::bigint' END || $q$,
                   count(*) FILTER (WHERE t.id IS NULL
                       OR coalesce(array_length(s.key, 1), 0)
                          <> coalesce(array_length(t.key_types, 1), 0)),
                   max(s.last_id)
              FROM summed s
              LEFT JOIN pgcounters.targets t ON t.id = s.target_id
        $q$, v_queue)
        INTO v_claimed, keys, v_columns, v_head, v_orphans, v_last_claimed
        USING p_limit, v_broken;
        -- a range found empty while the queue was not: another drainer held it and
        -- took it; claim again from the new head (each round sees a newer snapshot)
        EXIT WHEN v_claimed > 0 OR v_head IS NULL;
        END LOOP;
        IF v_orphans > 0 THEN
            -- deltas of a counter that no longer exists, or keys of the wrong
            -- length: the careful path sets them aside
            RAISE EXCEPTION 'deltas of unknown counters or with wrong keys' USING ERRCODE = 'PC003';
        END IF;
        deltas := v_claimed;
        IF v_columns IS NOT NULL THEN
            SELECT d.keys, d.busy, d.first_requeued
              INTO v_column_keys, v_column_busy, v_first_requeued
              FROM pgcounters._drain_columns(v_columns, p_unlogged) AS d;
            keys := keys + v_column_keys;
            busy := v_column_busy;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        IF NOT pgcounters._quarantinable(v_state) THEN
            RAISE;
        END IF;
        SELECT d.deltas, d.keys, d.busy, d.quarantined, d.first_requeued, d.last_claimed
          INTO deltas, keys, busy, quarantined, v_first_requeued, v_last_claimed
          FROM pgcounters._drain_carefully(p_limit, p_unlogged, v_sole, v_skip, v_broken) AS d;
    END;

    deltas := deltas - busy - quarantined;
    IF busy > 0 THEN
        -- deltas between this batch and the ones it put back (a scan above the batch's
        -- ids: below them, the index holds the entries of the rows just deleted)
        EXECUTE format(
            'SELECT EXISTS (SELECT 1 FROM pgcounters.%I WHERE id > $1 AND id < $2)', v_queue)
        INTO ahead USING v_last_claimed, v_first_requeued;
    END IF;
    IF deltas > 0 OR busy > 0 OR quarantined > 0 THEN
        PERFORM pgcounters._record_drain(
            p_unlogged, deltas, keys,
            extract(epoch FROM clock_timestamp() - v_started)::double precision,
            busy, quarantined);
    END IF;
END;
$$;

-- The careful path of drain_queue: claim the batch again (its fast attempt was
-- rolled back), then apply one (target, key) at a time, each in a
-- subtransaction; a data error sets that key's deltas aside with the error.
-- Returns the deltas claimed (applied, left busy and set aside together).
CREATE FUNCTION pgcounters._drain_carefully(
    p_limit integer, p_unlogged boolean, p_sole boolean, p_skip text, p_broken integer[],
    OUT deltas bigint, OUT keys bigint, OUT busy bigint, OUT quarantined bigint,
    OUT first_requeued bigint, OUT last_claimed bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_queue text := CASE WHEN p_unlogged THEN 'queue_unlogged' ELSE 'queue' END;
    v_claim text;
    v_rows pgcounters.claimed_delta[];
    v_head bigint;
    g record;
    t pgcounters.targets;
    v_key text[];
    v_lock record;
    v_id bigint;
    v_state text;
    v_message text;
BEGIN
    deltas := 0;
    keys := 0;
    busy := 0;
    quarantined := 0;
    IF p_sole THEN
        v_claim := 'q.id BETWEEN (SELECT lo FROM head) AND (SELECT lo FROM head) + $1 - 1';
    ELSE
        v_claim := 'q.id = ANY (ARRAY(SELECT id FROM pgcounters.%1$I AS q WHERE true'
                   || p_skip || ' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))';
    END IF;
    LOOP
        EXECUTE format($q$
            WITH head AS MATERIALIZED (
                SELECT min(id) AS lo FROM pgcounters.%1$I AS q WHERE true $q$ || p_skip || $q$
            ), claimed AS (
                DELETE FROM pgcounters.%1$I AS q
                 WHERE $q$ || v_claim || p_skip || $q$
                RETURNING q.id, q.target_id, q.key, q.delta, q.created_at
            )
            SELECT (SELECT array_agg((c.id, c.target_id, c.key, c.delta, c.created_at)
                                     ::pgcounters.claimed_delta) FROM claimed AS c),
                   $q$ || CASE WHEN p_sole THEN '(SELECT lo FROM head)' ELSE 'NULL::bigint' END
        , v_queue)
        INTO v_rows, v_head
        USING p_limit, p_broken;
        EXIT WHEN v_rows IS NOT NULL OR v_head IS NULL;
    END LOOP;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    deltas := cardinality(v_rows);
    SELECT max(r.id) INTO last_claimed FROM unnest(v_rows) AS r;

    FOR g IN
        SELECT r.target_id, r.key, sum(r.delta) AS delta, count(*) AS n,
               min(r.created_at) AS created_at, array_agg(r.id) AS ids
          FROM unnest(v_rows) AS r
         GROUP BY r.target_id, r.key
         ORDER BY r.target_id, r.key
    LOOP
        BEGIN
            SELECT * INTO t FROM pgcounters.targets WHERE id = g.target_id;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'counter id % no longer exists', g.target_id
                    USING ERRCODE = 'PC003';
            END IF;
            v_key := g.key::text[];
            IF coalesce(array_length(v_key, 1), 0) <> coalesce(array_length(t.key_types, 1), 0)
               OR array_position(v_key, NULL) IS NOT NULL THEN
                RAISE EXCEPTION 'counter % takes a key of (%), got %',
                    t.name, array_to_string(t.key_types, ', '), g.key USING ERRCODE = 'PC004';
            END IF;
            IF g.delta = 0 THEN
                NULL;
            ELSIF t.target_table IS NULL THEN
                INSERT INTO pgcounters.counters AS k (target_id, key, value)
                VALUES (t.id, v_key, g.delta)
                ON CONFLICT (target_id, key) DO UPDATE SET value = k.value + excluded.value;
                keys := keys + 1;
            ELSIF t.id = ANY (p_broken) THEN
                NULL;  -- not claimed (left out above)
            ELSE
                -- here in target order, not table order: try only, never wait
                PERFORM pg_try_advisory_xact_lock(hashtext('pgcounters.parents'),
                        hashtext(format('%I.%I', t.target_schema, t.target_table)));
                SELECT l.locked, l.busy INTO v_lock
                  FROM pgcounters._lock_parents(t.target_schema, t.target_table,
                       t.target_key_column, t.key_types[1], ARRAY[v_key[1]]) AS l;
                IF cardinality(v_lock.locked) > 0 THEN
                    keys := keys + pgcounters._apply_column(
                        t, ARRAY[v_key[1]], ARRAY[g.delta], v_lock.locked);
                ELSIF cardinality(v_lock.busy) > 0 THEN
                    EXECUTE format(
                        'INSERT INTO pgcounters.%I (target_id, key, delta, created_at)
                         VALUES ($1, $2, $3, $4) RETURNING id', v_queue)
                    INTO v_id USING t.id, g.key, g.delta::bigint, g.created_at;
                    busy := busy + g.n;
                    first_requeued := least(first_requeued, v_id);
                END IF;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
            IF NOT pgcounters._quarantinable(v_state) THEN
                RAISE;
            END IF;
            INSERT INTO pgcounters.quarantine
                   (target_id, counter, key, delta, unlogged, created_at, sqlstate, error)
            SELECT r.target_id,
                   coalesce((SELECT name FROM pgcounters.targets WHERE id = r.target_id),
                            (SELECT name FROM pgcounters.dropped_targets WHERE id = r.target_id)),
                   r.key, r.delta, p_unlogged, r.created_at, v_state, v_message
              FROM unnest(v_rows) AS r
             WHERE r.id = ANY (g.ids)
             ORDER BY r.id;
            quarantined := quarantined + g.n;
            RAISE WARNING 'pgcounters: % delta(s) of counter % key % set aside: %',
                g.n, coalesce(t.name, '#' || g.target_id), g.key, v_message;
        END;
    END LOOP;
END;
$$;

-- The version 5 entry point, same signature and result: deltas applied and
-- counter values changed. Deltas left busy or set aside are reported by
-- drain_queue.
CREATE OR REPLACE FUNCTION pgcounters.drain_batch(
    p_limit integer DEFAULT 10000,
    p_unlogged boolean DEFAULT false,
    OUT deltas bigint,
    OUT keys bigint
)
LANGUAGE sql AS $$
    SELECT d.deltas, d.keys FROM pgcounters.drain_queue(p_limit, p_unlogged) AS d
$$;

-- Move set-aside deltas back into their queues (after their cause was fixed):
-- the given ids, or all of one counter's (by name, also a counter re-created
-- under that name: its deltas go to the counter of that name now), or all.
-- Returns the number of deltas moved.
CREATE FUNCTION pgcounters.replay_quarantined(
    p_ids bigint[] DEFAULT NULL, p_counter text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    WITH taken AS (
        DELETE FROM pgcounters.quarantine AS q
         WHERE (p_ids IS NULL OR q.id = ANY (p_ids))
           AND (p_counter IS NULL OR q.counter = p_counter)
        RETURNING q.id, q.target_id, q.counter, q.key, q.delta, q.unlogged, q.created_at
    ), routed AS (
        SELECT k.id, coalesce(t.id, k.target_id) AS target_id, k.key, k.delta, k.unlogged,
               k.created_at
          FROM taken AS k
          LEFT JOIN pgcounters.targets AS old ON old.id = k.target_id
          LEFT JOIN pgcounters.targets AS t ON old.id IS NULL AND t.name = k.counter
    ), logged AS (
        INSERT INTO pgcounters.queue (target_id, key, delta, created_at)
        SELECT r.target_id, r.key, r.delta, r.created_at FROM routed AS r
         WHERE NOT r.unlogged ORDER BY r.id
        RETURNING 1
    ), unlogged AS (
        INSERT INTO pgcounters.queue_unlogged (target_id, key, delta, created_at)
        SELECT r.target_id, r.key, r.delta, r.created_at FROM routed AS r
         WHERE r.unlogged ORDER BY r.id
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM logged) + (SELECT count(*) FROM unlogged) INTO v_n;
    RETURN v_n;
END;
$$;

-- Delete set-aside deltas: the given ids, or all of one counter's, or all.
CREATE FUNCTION pgcounters.discard_quarantined(
    p_ids bigint[] DEFAULT NULL, p_counter text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    DELETE FROM pgcounters.quarantine AS q
     WHERE (p_ids IS NULL OR q.id = ANY (p_ids))
       AND (p_counter IS NULL OR q.counter = p_counter);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- ---------------------------------------------------------------------------
-- Rights
-- ---------------------------------------------------------------------------

REVOKE EXECUTE ON FUNCTION
    pgcounters._remember_dropped(),
    pgcounters._is_canonical(text[], text[]),
    pgcounters._canonical_key(pgcounters.targets, text[]),
    pgcounters._quarantinable(text),
    pgcounters._record_drain(boolean, bigint, bigint, double precision, bigint, bigint),
    pgcounters.record_retry(text, text),
    pgcounters._apply_column(pgcounters.targets, text[], numeric[], text[]),
    pgcounters._lock_parents(text, text, text, text, text[]),
    pgcounters._drain_columns(pgcounters.batch_delta[], boolean),
    pgcounters.drain_queue(integer, boolean),
    pgcounters._drain_carefully(integer, boolean, boolean, text, integer[]),
    pgcounters.replay_quarantined(bigint[], text),
    pgcounters.discard_quarantined(bigint[], text)
    FROM PUBLIC;

-- grant_app and grant_worker of version 6 keep their bodies under other names;
-- the functions of those names add the rights on this version's objects.
ALTER FUNCTION pgcounters.grant_app(text) RENAME TO _grant_app_v6;
ALTER FUNCTION pgcounters.grant_worker(text) RENAME TO _grant_worker_v6;

CREATE FUNCTION pgcounters.grant_app(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgcounters._grant_app_v6(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT SELECT ON pgcounters.quarantine, pgcounters.retries,'
            ' pgcounters.dropped_targets TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters._canonical_key(pgcounters.targets, text[]) TO %I'
    ]);
END;
$$;

CREATE FUNCTION pgcounters.grant_worker(p_role text) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgcounters._grant_worker_v6(p_role) || pgcounters._for_role(p_role, ARRAY[
        'GRANT SELECT ON pgcounters.quarantine, pgcounters.retries,'
            ' pgcounters.dropped_targets TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters._canonical_key(pgcounters.targets, text[]) TO %I',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON pgcounters.quarantine, pgcounters.retries TO %I',
        'GRANT EXECUTE ON FUNCTION pgcounters._quarantinable(text),'
            ' pgcounters._record_drain(boolean, bigint, bigint, double precision, bigint, bigint),'
            ' pgcounters.record_retry(text, text),'
            ' pgcounters._apply_column(pgcounters.targets, text[], numeric[], text[]),'
            ' pgcounters._lock_parents(text, text, text, text, text[]),'
            ' pgcounters._drain_columns(pgcounters.batch_delta[], boolean),'
            ' pgcounters.drain_queue(integer, boolean),'
            ' pgcounters._drain_carefully(integer, boolean, boolean, text, integer[]),'
            ' pgcounters.replay_quarantined(bigint[], text),'
            ' pgcounters.discard_quarantined(bigint[], text) TO %I'
    ]);
END;
$$;

REVOKE EXECUTE ON FUNCTION pgcounters._grant_app_v6(text), pgcounters._grant_worker_v6(text),
    pgcounters.grant_app(text), pgcounters.grant_worker(text)
    FROM PUBLIC;
