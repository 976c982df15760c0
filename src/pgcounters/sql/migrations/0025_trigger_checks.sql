-- Version 25: the pause check of a counting trigger costs no function call, and
-- the replica-writes watch costs no other session anything.
--
-- Every counting trigger starts with IF pgcounters.is_paused(name). The function
-- read the setting in a FROM clause, so PostgreSQL could not inline it: each
-- trigger of each statement ran it as a SQL function of its own (about 1 µs of a
-- single-row INSERT's CPU per counter). The same test written as one expression
-- without FROM is inlined into the trigger's IF, which PL/pgSQL then evaluates
-- without starting the executor. Same signature, same results, same error for a
-- role that may not pause.

CREATE OR REPLACE FUNCTION pgcounters.is_paused(p_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN coalesce(current_setting('pgcounters.paused', true), '') = '' THEN false
        WHEN current_setting('pgcounters.paused', true) = 'all'
             OR p_name = ANY (string_to_array(current_setting('pgcounters.paused', true), ','))
            THEN pgcounters._check_may_pause()
        ELSE false
    END
$$;

-- The watch triggers of a counted table (pgc_replica_watch, pgc_replica_watch_trn)
-- were enabled in every mode, with a WHEN condition on session_replication_role:
-- PostgreSQL evaluated that condition for every statement of every session (about
-- 1 µs of a single-row INSERT). Enabled in replica mode only, they are skipped
-- before any evaluation in the other modes, and fire in replica mode as before
-- (the condition kept). _sync_replica_writes creates them so, and turns those of
-- an earlier version to it the next time it runs (installing or following
-- counters, Django's migrate): this migration does not alter the counted tables,
-- whose owner may not be the role that runs it.

CREATE OR REPLACE FUNCTION pgcounters._sync_replica_writes() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT t.tgrelid::regclass AS tbl
          FROM pg_catalog.pg_trigger AS t JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid
         WHERE NOT t.tgisinternal
           AND p.prosrc ~ '-- pgcounters spec fingerprint=\w+ event=(insert|update|delete|truncate) '
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger AS w
                            WHERE w.tgrelid = t.tgrelid AND w.tgname = 'pgc_replica_watch')
         ORDER BY 1
    LOOP
        EXECUTE format('CREATE TRIGGER pgc_replica_watch AFTER INSERT OR UPDATE OR DELETE ON %s'
                       ' FOR EACH STATEMENT'
                       ' WHEN (pg_catalog.current_setting(''session_replication_role'') = ''replica'')'
                       ' EXECUTE FUNCTION pgcounters._replica_write()', r.tbl);
        EXECUTE format('CREATE TRIGGER pgc_replica_watch_trn AFTER TRUNCATE ON %s'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION pgcounters._replica_write()', r.tbl);
        EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER pgc_replica_watch', r.tbl);
        EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER pgc_replica_watch_trn', r.tbl);
    END LOOP;
    -- the watch triggers an earlier version enabled in every mode
    FOR r IN
        SELECT w.tgrelid::regclass AS tbl, w.tgname
          FROM pg_catalog.pg_trigger AS w
         WHERE w.tgname IN ('pgc_replica_watch', 'pgc_replica_watch_trn')
           AND w.tgfoid = 'pgcounters._replica_write'::regproc
           AND w.tgenabled = 'A'
         ORDER BY 1, 2
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER %I', r.tbl, r.tgname);
    END LOOP;
    FOR r IN
        SELECT w.tgrelid::regclass AS tbl
          FROM pg_catalog.pg_trigger AS w
         WHERE w.tgname = 'pgc_replica_watch'
           AND NOT EXISTS (
               SELECT 1 FROM pg_catalog.pg_trigger AS t JOIN pg_catalog.pg_proc AS p
                   ON p.oid = t.tgfoid
                WHERE t.tgrelid = w.tgrelid AND NOT t.tgisinternal
                  AND p.prosrc
                      ~ '-- pgcounters spec fingerprint=\w+ event=(insert|update|delete|truncate) ')
         ORDER BY 1
    LOOP
        EXECUTE format('DROP TRIGGER pgc_replica_watch ON %s', r.tbl);
        EXECUTE format('DROP TRIGGER IF EXISTS pgc_replica_watch_trn ON %s', r.tbl);
    END LOOP;
    -- each counter's triggers, on its table and every descendant, in its mode
    FOR r IN
        SELECT t.tgrelid::regclass AS tbl, t.tgname,
               CASE s.replica_writes WHEN 'count' THEN 'ALWAYS' ELSE '' END AS enable
          FROM pgcounters.specs AS s
          JOIN pgcounters._installed_on_source(NULL) AS i ON i.name = s.name
          JOIN pg_catalog.pg_trigger AS t
            ON t.tgname = i.trigger_name
           AND (t.tgrelid = i.root OR t.tgrelid IN (SELECT pgcounters._descendants(i.root)))
         WHERE t.tgenabled <> 'D'
           AND t.tgenabled <> CASE s.replica_writes WHEN 'count' THEN 'A' ELSE 'O' END
         ORDER BY 1, 2
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE %s TRIGGER %I', r.tbl, r.enable, r.tgname);
    END LOOP;
END;
$$;
