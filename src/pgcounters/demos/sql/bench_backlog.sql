-- Named statements of the backlog-wait benchmark ("-- name: NAME" blocks).

-- name: drop_parent
-- The benchmark's parent table, dropped before and after a run.
DROP TABLE IF EXISTS bench_backlog_parent CASCADE;

-- name: create_parent
-- The parent rows a counter column counts into, with another column the application updates.
CREATE TABLE bench_backlog_parent (
    id    bigint PRIMARY KEY,
    n     bigint NOT NULL DEFAULT 0,
    saves bigint NOT NULL DEFAULT 0
);

-- name: fill_parent
-- The parent rows.
INSERT INTO bench_backlog_parent (id) SELECT generate_series(1, %(rows)s::integer);

-- name: queue
-- The backlog: deltas of 1 spread evenly over the parent rows.
INSERT INTO pgcounters.queue (target_id, key, delta)
SELECT %(id)s, '{' || (g %% %(rows)s + 1) || '}', 1
  FROM generate_series(1, %(deltas)s::integer) AS g;

-- name: touch
-- The application's write of a parent row (another column than the counter's).
UPDATE bench_backlog_parent SET saves = saves + 1 WHERE id = %(id)s;

-- name: pending
-- Deltas still queued.
SELECT count(*) FROM pgcounters.queue;

-- name: wrong_rows
-- Parent rows whose counter is not what the backlog held for each.
SELECT count(*) FROM bench_backlog_parent WHERE n <> %(each)s;

-- name: draining
-- Whether the worker's session is running a statement (a drain batch): its backend is active.
SELECT count(*) FROM pg_stat_activity
 WHERE application_name = 'pgcounters worker' AND state = 'active'
   AND query NOT LIKE '%%pg_stat_activity%%';
