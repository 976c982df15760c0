-- The pieces of the plain SQL scripts that `pgcounters schema --sql` prints: the
-- schema's install script and its upgrade scripts, for psql or any migration tool.
-- Each script is one transaction under the advisory lock that install and upgrade
-- take; :version stands for a version number the script is written for.

-- name: script_begin
-- the opening of a script: one transaction, one install or upgrade at a time
BEGIN;
DO $$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('pgcounters.install')); END $$;

-- name: script_lock
-- the opening of a script run in a transaction of its own tool: one install or upgrade at a time
DO $$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('pgcounters.install')); END $$;

-- name: script_expect_absent
-- an install script refuses a database where the schema is installed already
DO $$
BEGIN
    IF to_regclass('pgcounters.migrations') IS NOT NULL THEN
        RAISE EXCEPTION 'the pgcounters schema is already installed (version %): '
                        'run the upgrade script of that version instead',
                        (SELECT max(version) FROM pgcounters.migrations)
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
END;
$$;

-- name: script_expect_version
-- an upgrade script refuses a database whose schema is not at the version it starts from
DO $$
DECLARE
    v_found integer;
BEGIN
    IF to_regclass('pgcounters.migrations') IS NULL THEN
        RAISE EXCEPTION 'the pgcounters schema is not installed: run the install script'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    SELECT max(version) INTO v_found FROM pgcounters.migrations;
    IF v_found IS DISTINCT FROM :version THEN
        RAISE EXCEPTION 'the pgcounters schema is at version %, this script upgrades '
                        'version :version: print the script of version % instead',
                        v_found, v_found
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
END;
$$;

-- name: script_record
-- a migration recorded as applied (:version, :name)
INSERT INTO pgcounters.migrations (version, name) VALUES (:version, :name);

-- name: script_commit
-- the end of a script
COMMIT;
