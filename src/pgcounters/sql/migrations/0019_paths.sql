-- Version 19: counters through a path of tables. A spec's "via" steps put triggers on the
-- tables of its path (marked event=via1_insert, via2_insert, ...): a change to such a table
-- that breaks the counter's probe (a link, key or condition column dropped or renamed) is
-- refused like one to the counted table. broken_specs is redefined (same signature).

CREATE OR REPLACE FUNCTION pgcounters.broken_specs(p_table regclass) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    s record;
    v_broken text[] := '{}';
BEGIN
    FOR s IN
        SELECT sp.name, sp.probe
          FROM pgcounters.specs AS sp
         WHERE sp.probe IS NOT NULL
           -- its triggers installed on p_table, the table it counts or a table of
           -- its path (event=via1_insert, ...) ...
           AND (EXISTS (
               SELECT 1 FROM pg_catalog.pg_trigger AS t
                 JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid
                WHERE t.tgrelid = p_table AND NOT t.tgisinternal
                  AND (position(format('-- pgcounters spec fingerprint=%s event=insert name=%s',
                                       sp.fingerprint, sp.name) IN p.prosrc) > 0
                       OR p.prosrc ~ format('-- pgcounters spec fingerprint=%s event=via\d_insert ',
                                            sp.fingerprint)))
           -- ... or installed, and p_table the parent table that holds its column
             OR (EXISTS (
                   SELECT 1 FROM pgcounters.targets AS g
                    WHERE g.name = sp.name AND g.target_table IS NOT NULL
                      AND to_regclass(format('%I.%I', g.target_schema, g.target_table)) = p_table)
                 AND EXISTS (
                   SELECT 1 FROM pg_catalog.pg_trigger AS t
                     JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid
                    WHERE NOT t.tgisinternal
                      AND position(format('-- pgcounters spec fingerprint=%s event=insert name=%s',
                                          sp.fingerprint, sp.name) IN p.prosrc) > 0)))
         ORDER BY sp.name
    LOOP
        BEGIN
            EXECUTE 'EXPLAIN ' || s.probe;
        EXCEPTION WHEN OTHERS THEN
            v_broken := v_broken || ARRAY[s.name, SQLERRM];
        END;
    END LOOP;
    RETURN v_broken;
END;
$$;
