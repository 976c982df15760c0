-- Statements of the write benchmarks (`sql-increment`, `counters-per-table`). The
-- pgbench scripts use pgbench's script language: `\set` draws a key, `:name` is a
-- variable (pgbench sends it as a parameter of the prepared statement); :queued and
-- :unlogged are the ids of the counters bench.queued and bench.unlogged.

-- name: pgbench_update
\set k random(0, 9)
UPDATE seed_counters SET current_value = current_value + 1 WHERE counter_name = :k::text;

-- name: pgbench_seed_queue
\set k random(0, 9)
INSERT INTO seed_queue (counter_name, value_change) VALUES (:k::text, 1);

-- name: pgbench_seed_unlogged_queue
\set k random(0, 9)
INSERT INTO seed_queue_unlogged (counter_name, value_change) VALUES (:k::text, 1);

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

-- name: reset_increments
TRUNCATE seed_queue, seed_queue_unlogged, pgcounters.queue, pgcounters.queue_unlogged;
UPDATE seed_counters SET current_value = 0;

-- name: updated
SELECT coalesce(sum(current_value), 0) FROM seed_counters;

-- name: seed_queued
SELECT count(*) FROM {table};

-- name: queued
SELECT coalesce(sum(delta), 0) FROM {table} WHERE target_id = %(target)s;
