-- Statements of the write benchmarks (`sql-increment`, `counters-per-table`). The
-- pgbench scripts use pgbench's script language: `\set` draws a key, `:name` is a
-- variable (pgbench sends it as a parameter of the prepared statement); :queued and
-- :unlogged are the ids of the counters bench.queued and bench.unlogged.

-- name: pgbench_update
\set k random(0, 9)
UPDATE reference_counters SET current_value = current_value + 1 WHERE counter_name = :k::text;

-- name: pgbench_reference_queue
\set k random(0, 9)
INSERT INTO reference_queue (counter_name, value_change) VALUES (:k::text, 1);

-- name: pgbench_reference_unlogged_queue
\set k random(0, 9)
INSERT INTO reference_queue_unlogged (counter_name, value_change) VALUES (:k::text, 1);

-- name: pgbench_insert_queued
\set k random(0, 9)
INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (:queued, ARRAY[:k::text], 1);

-- name: pgbench_incr_queued
\set k random(0, 9)
SELECT pgcounters.incr('bench.queued', ARRAY[:k::text], 1);

-- name: pgbench_insert_unlogged
\set k random(0, 9)
INSERT INTO pgcounters.queue_unlogged (target_id, key, delta) VALUES (:unlogged, ARRAY[:k::text], 1);

-- name: pgbench_incr_unlogged
\set k random(0, 9)
SELECT pgcounters.incr('bench.unlogged', ARRAY[:k::text], 1);

-- name: enqueue_function
-- The least an SQL function that queues an increment costs: a PL/pgSQL function that
-- performs only the INSERT pgcounters.incr performs, the counter's id given (no lookup
-- by name, no check of the key).
CREATE OR REPLACE FUNCTION bench_enqueue(p_target integer, p_key text[], p_delta bigint,
                                         p_unlogged boolean)
RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF p_unlogged THEN
        INSERT INTO pgcounters.queue_unlogged (target_id, key, delta)
        VALUES (p_target, p_key, p_delta);
    ELSE
        INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (p_target, p_key, p_delta);
    END IF;
    RETURN NULL;
END;
$$;

-- name: drop_enqueue_function
DROP FUNCTION IF EXISTS bench_enqueue(integer, text[], bigint, boolean);

-- name: pgbench_function_insert_queued
\set k random(0, 9)
SELECT bench_enqueue(:queued, ARRAY[:k::text], 1, false);

-- name: pgbench_function_insert_unlogged
\set k random(0, 9)
SELECT bench_enqueue(:unlogged, ARRAY[:k::text], 1, true);

-- name: reset_increments
TRUNCATE reference_queue, reference_queue_unlogged, pgcounters.queue, pgcounters.queue_unlogged;
UPDATE reference_counters SET current_value = 0;

-- name: updated
SELECT coalesce(sum(current_value), 0) FROM reference_counters;

-- name: reference_queued
SELECT count(*) FROM {table};

-- name: queued
SELECT coalesce(sum(delta), 0) FROM {table} WHERE target_id = %(target)s;

-- name: width_table
-- A busy table of the counters-per-table benchmark ({table}), counted 0 to 10 times.
CREATE TABLE {table} (
    id bigserial PRIMARY KEY,
    a integer NOT NULL,
    b integer NOT NULL,
    c integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- name: pgbench_single_row
\set a random(1, 1000)
\set b random(1, 1000)
\set c random(1, 100)
INSERT INTO {table} (a, b, c) VALUES (:a, :b, :c);

-- name: floor_function
-- A statement trigger's function of the floors below, running {statement}.
CREATE FUNCTION {function}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    {statement};
    RETURN NULL;
END;
$$;

-- name: floor_row
-- The least a queued counter can add to a single-row statement: a statement trigger (with
-- a transition table, as each counter's) that queues each row's key for its counter, whose
-- id it is given: no pause check, no lookup of the counter, no grouping (one delta of +1 a
-- row). The key is the row's own, as a counter's: a constant key would write every queue
-- row to the same place of the queue's index, which costs less than a real counter can.
INSERT INTO pgcounters.queue (target_id, key, delta)
SELECT TG_ARGV[0]::integer, ARRAY[(n.{column})::bigint::text]::text[], 1 FROM pgc_new AS n;

-- name: floor_rows
-- The same for several counters served by one trigger: each row's key of each counter
-- whose id it is given ({rows}: one (id, key) pair a counter), in one INSERT.
INSERT INTO pgcounters.queue (target_id, key, delta)
SELECT v.target_id, v.key, 1 FROM pgc_new AS n, LATERAL (VALUES {rows}) AS v (target_id, key);

-- name: floor_grouped
-- The least a queued counter can add to a bulk statement: one pass over the statement's
-- rows grouped by its counter's key, one delta a key, for the counter whose id it is given.
INSERT INTO pgcounters.queue (target_id, key, delta)
SELECT TG_ARGV[0]::integer, ARRAY[(n.{column})::bigint::text]::text[], count(*)
  FROM pgc_new AS n GROUP BY n.{column};

-- name: rows_only
-- A trigger that asks PostgreSQL for the statement's rows (a transition table) and does
-- nothing with them: the copy of the rows that every counter's trigger starts from.
NULL;

-- name: floor_trigger
CREATE TRIGGER {trigger} AFTER INSERT ON {table} REFERENCING NEW TABLE AS pgc_new
FOR EACH STATEMENT EXECUTE FUNCTION {function}({targets});

-- name: floor_empty
-- The deltas queued by the floor's triggers (counters named in %(names)s).
DELETE FROM pgcounters.queue
 WHERE target_id IN (SELECT id FROM pgcounters.targets WHERE name = ANY (%(names)s::text[]));

-- name: width_bulk
INSERT INTO {table} (a, b, c)
SELECT 1 + mod(g, 1000), 1 + mod(g * 7, 1000), 1 + mod(g, 100) FROM generate_series(1, %(n)s::integer) AS g;

-- name: width_queued
-- Deltas queued per counter of the table, and their sum: one per row and counter.
SELECT t.name, count(q.id), coalesce(sum(q.delta), 0)
  FROM pgcounters.targets AS t LEFT JOIN pgcounters.queue AS q ON q.target_id = t.id
 WHERE t.name = ANY (%(names)s::text[])
 GROUP BY t.name;

-- name: pgbench_incr_lag
\set k random(0, 9)
SELECT pgcounters.incr('bench.lag', ARRAY[:k::text], 1);

-- name: worker_backend
-- The backend of the one worker connected to this database.
SELECT pid FROM pg_stat_activity
 WHERE application_name = %(name)s AND datname = current_database();

-- name: lag_total
SELECT coalesce(sum(value), 0) FROM pgcounters.counters
 WHERE target_id = (SELECT id FROM pgcounters.targets WHERE name = 'bench.lag');
