-- The reference technique's own tables (depesz's queue technique), used by the demo and the benchmarks to run
-- the naive and hand-written techniques next to pgcounters.
DROP TABLE IF EXISTS reference_counters, reference_queue, reference_queue_unlogged;
CREATE TABLE reference_counters (
    counter_name  text PRIMARY KEY,
    current_value int8 NOT NULL DEFAULT 0
);
CREATE TABLE reference_queue (id serial PRIMARY KEY, counter_name text, value_change int4);
-- the technique's own advice: "with index on counter_name column ... it will be fast"
CREATE INDEX ON reference_queue (counter_name);
CREATE UNLOGGED TABLE reference_queue_unlogged (
    id serial PRIMARY KEY, counter_name text, value_change int4
);
CREATE INDEX ON reference_queue_unlogged (counter_name);
