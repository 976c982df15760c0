-- The seed's own tables (seed 004), used by the demo and the benchmarks to run
-- the naive and hand-written techniques next to pgcounters.
DROP TABLE IF EXISTS seed_counters, seed_queue, seed_queue_unlogged;
CREATE TABLE seed_counters (
    counter_name  text PRIMARY KEY,
    current_value int8 NOT NULL DEFAULT 0
);
CREATE TABLE seed_queue (id serial PRIMARY KEY, counter_name text, value_change int4);
-- the seed's advice: "with index on counter_name column ... it will be fast"
CREATE INDEX ON seed_queue (counter_name);
CREATE UNLOGGED TABLE seed_queue_unlogged (
    id serial PRIMARY KEY, counter_name text, value_change int4
);
CREATE INDEX ON seed_queue_unlogged (counter_name);
