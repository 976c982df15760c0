-- Version 25: the pause check of a counting trigger costs no function call.
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
