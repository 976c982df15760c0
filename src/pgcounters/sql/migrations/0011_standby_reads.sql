-- pgcounters schema, version 11: exact reads on a hot standby.
--
-- A hot standby refuses to plan any statement that names an unlogged table
-- ("cannot access temporary or unlogged relations during recovery"), and its
-- unlogged tables hold nothing: their rows are never written to the WAL. The
-- exact read of a queued or direct counter therefore sums the logged queue
-- only when the server is a standby; on a primary it still sums both queues
-- (a declared counter whose mode changed from unlogged may have deltas left
-- in the unlogged queue until the next drain). The pending deltas of an
-- unlogged counter exist on the primary only: on a standby its exact read is
-- refused with SQLSTATE PCR01, and its stored value stays readable
-- (SELECT value FROM pgcounters.counters, or the client's exact=False).
--
-- PL/pgSQL plans each statement when it first runs it, so the branch that
-- reads the unlogged queue is never planned on a standby.

-- get as in version 9 (canonical keys, refused while backfilled), reading the
-- unlogged queue on a primary only.
CREATE OR REPLACE FUNCTION pgcounters.get(p_name text, p_key text[] DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_key text[] := pgcounters._canonical_key(t, p_key);
    v_text text := v_key::text;
    v_standby boolean := pg_is_in_recovery();
    v_stored bigint;
    v_pending bigint;
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
        EXECUTE format('SELECT x.%I FROM %I.%I AS x WHERE x.%I = $1::%s',
            t.target_column, t.target_schema, t.target_table,
            t.target_key_column, t.key_types[1]::regtype)
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
