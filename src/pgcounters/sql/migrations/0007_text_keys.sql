-- pgcounters schema, version 7: the queues keep a delta's key as the text of
-- its array ('{42}', '{7,2026-11-21}', '{}'), the canonical form PostgreSQL
-- gives a text[] cast to text.
--
-- Measured on the drain's own statement (range claim, GROUP BY, upsert) over
-- 200k queued deltas: 1.05 M deltas/s with text keys against 0.77 M/s with
-- text[] keys, and a heap of 20 MB against 36 MB. An array carries a header of
-- about 20 bytes per row, and grouping and comparing arrays goes element by
-- element; a text compares and hashes as one value. The counters table keeps
-- text[] keys (the drain casts each group's key once).
--
-- Every writer produces the canonical text: SQL writers insert a text[] into
-- the text column (the assignment cast is array_out), the Python client sends
-- a text[] and lets the same cast happen, COPY writers use keys.canonical_text,
-- which is checked against PostgreSQL's own output by a property test.

ALTER TABLE pgcounters.queue ALTER COLUMN key TYPE text USING key::text;
ALTER TABLE pgcounters.queue_unlogged ALTER COLUMN key TYPE text USING key::text;

-- Exact value of one named counter (version 1's function, comparing the
-- queues' text keys).
CREATE OR REPLACE FUNCTION pgcounters.get(p_name text, p_key text[] DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t pgcounters.targets := pgcounters._target(p_name);
    v_key text := p_key::text;
    v_stored bigint;
BEGIN
    PERFORM pgcounters._check_key(t, p_key);
    IF t.target_table IS NULL THEN
        SELECT value INTO v_stored FROM pgcounters.counters WHERE target_id = t.id AND key = p_key;
    ELSE
        EXECUTE format('SELECT x.%I FROM %I.%I AS x WHERE x.%I = $1::%s',
            t.target_column, t.target_schema, t.target_table,
            t.target_key_column, t.key_types[1]::regtype)
        INTO v_stored USING p_key[1];
    END IF;
    RETURN coalesce(v_stored, 0)
         + coalesce((SELECT sum(delta) FROM pgcounters.queue
                      WHERE target_id = t.id AND key = v_key), 0)
         + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                      WHERE target_id = t.id AND key = v_key), 0);
END;
$$;
