-- Version 24: note_direct notes only what its caller may write.
--
-- note_direct (version 20) is SECURITY DEFINER and granted to every application
-- role, so that the direct triggers of counter columns may note the keys they
-- changed for a reporting worker. Called by hand, it noted any key of any counter:
-- cache invalidations for keys nothing changed, and rows of direct_changes at will.
-- Its callers are the triggers of direct counters (inside a trigger) and the
-- client's direct writes (a plain statement of a role that wrote the counter's
-- storage itself: the counter column of a column counter, pgcounters.counters for a
-- named one). A call outside a trigger by a role that may not write that storage is
-- now refused (SQLSTATE 42501), whether or not a reporting worker listens.

-- Whether a row version visible here was written by this transaction (or one of its
-- subtransactions): no other transaction's uncommitted row is visible, so a visible
-- version whose writer is still in progress is this transaction's.
CREATE FUNCTION pgcounters._written_here(p_xmin xid) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pgcounters, pg_temp AS $$
    SELECT coalesce(pg_catalog.pg_xact_status(
               (CASE WHEN c.cur - c.low + x.low > c.cur + 2147483648
                     THEN c.cur - c.low + x.low - 4294967296
                     WHEN c.cur - c.low + x.low < c.cur - 2147483648
                     THEN c.cur - c.low + x.low + 4294967296
                     ELSE c.cur - c.low + x.low END)::text::xid8) = 'in progress', false)
      FROM (SELECT f AS cur, f % 4294967296 AS low
              FROM (SELECT pg_catalog.pg_current_xact_id()::text::bigint AS f) AS g) AS c,
           (SELECT p_xmin::text::bigint AS low) AS x
$$;

CREATE OR REPLACE FUNCTION pgcounters.note_direct(p_target integer, p_keys anyarray) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pgcounters, pg_temp AS $$
DECLARE
    v_target pgcounters.targets;
    v_role text;
    v_allowed boolean;
    v_table text;
BEGIN
    IF pg_catalog.pg_trigger_depth() = 0 THEN
        -- the role of the calling statement (this function runs as its owner): the
        -- one SET ROLE chose, else the session's
        v_role := pg_catalog.current_setting('role');
        IF v_role = 'none' THEN
            v_role := session_user;
        END IF;
        SELECT * INTO v_target FROM pgcounters.targets WHERE id = p_target;
        IF v_target.target_table IS NULL THEN
            v_allowed := pg_catalog.has_table_privilege(v_role, 'pgcounters.counters', 'UPDATE');
        ELSE
            -- a counter column: a role that may write it, and only the keys of rows this
            -- transaction wrote (visible, written by a transaction still in progress)
            v_table := pg_catalog.format('%I.%I', v_target.target_schema, v_target.target_table);
            v_allowed := pg_catalog.has_column_privilege(
                v_role, v_table, v_target.target_column, 'UPDATE');
            IF v_allowed THEN
                EXECUTE pg_catalog.format(
                    'SELECT NOT EXISTS (SELECT 1 FROM unnest($1::text::text[]) AS k'
                    ' WHERE NOT EXISTS (SELECT 1 FROM %s AS x WHERE x.%I = k::%s'
                    ' AND pgcounters._written_here(x.xmin)))',
                    v_table, v_target.target_key_column,
                    (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod)
                       FROM pg_catalog.pg_attribute AS a
                      WHERE a.attrelid = v_table::regclass
                        AND a.attname = v_target.target_key_column))
                    INTO v_allowed USING p_keys;
            END IF;
        END IF;
        IF v_target.id IS NULL OR v_target.mode <> 'direct' OR NOT v_allowed THEN
            RAISE EXCEPTION 'note_direct notes the changes of a direct counter: it is called by '
                'the triggers of direct counters and by a role that writes the counter itself; '
                'role % may not write counter id % (or these keys)', v_role, p_target
                USING ERRCODE = '42501';
        END IF;
    END IF;
    IF p_keys IS NOT NULL AND cardinality(p_keys) > 0 AND pgcounters._direct_listened() THEN
        IF array_ndims(p_keys) = 2 THEN
            INSERT INTO pgcounters.direct_changes (target_id, keys)
            VALUES (p_target, ARRAY(SELECT DISTINCT k::text::text[]::text FROM unnest(p_keys) AS k));
        ELSE
            INSERT INTO pgcounters.direct_changes (target_id, keys)
            VALUES (p_target, ARRAY(SELECT ARRAY[k::text]::text FROM unnest(p_keys) AS k));
        END IF;
    END IF;
END;
$$;

REVOKE EXECUTE ON FUNCTION pgcounters._written_here(xid) FROM PUBLIC;
