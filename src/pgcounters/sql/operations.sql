-- Named queries of the worker and of `pgcounters status` ("-- name: NAME" blocks).
-- Values are always bound parameters.

-- name: worker_session
SELECT set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, false);

-- name: queues_holding
-- Which queues hold a delta (the first id by the primary key: dead rows of drained
-- batches are not read one by one). A worker drains only those: an empty queue costs
-- this one look instead of a drain transaction.
SELECT (SELECT id FROM pgcounters.queue ORDER BY id LIMIT 1) IS NOT NULL,
       (SELECT id FROM pgcounters.queue_unlogged ORDER BY id LIMIT 1) IS NOT NULL;

-- name: listen
LISTEN pgcounters_queue;

-- name: unlisten
UNLISTEN pgcounters_queue;

-- name: enable_wakeups
SELECT pgcounters.enable_wakeups(make_interval(secs => %(seconds)s));

-- name: disable_wakeups
SELECT pgcounters.disable_wakeups();

-- name: operations_installed
SELECT to_regclass('pgcounters.drain_stats') IS NOT NULL;

-- name: wakeup_interval
SELECT pgcounters.wakeup_interval_ms();

-- name: status_clock
SELECT clock_timestamp();

-- Pending deltas per counter and queue, with the age of the oldest one. One
-- scan of each queue. Deltas of a counter dropped while they were in flight
-- show under the target id.
-- name: status_pending
WITH pending AS (
    SELECT target_id, false AS unlogged, count(*) AS deltas, min(created_at) AS oldest
      FROM pgcounters.queue
     GROUP BY target_id
    UNION ALL
    SELECT target_id, true, count(*), min(created_at)
      FROM pgcounters.queue_unlogged
     GROUP BY target_id
)
SELECT coalesce(t.name, '#' || p.target_id::text) AS counter,
       t.mode,
       p.unlogged,
       p.deltas,
       greatest(extract(epoch FROM clock_timestamp() - p.oldest), 0)::double precision AS age
  FROM pending p
  LEFT JOIN pgcounters.targets t ON t.id = p.target_id
 ORDER BY 1, 3;

-- name: status_counters
SELECT name, mode FROM pgcounters.targets ORDER BY name;

-- The tables pgcounters writes to: its own, and the user tables holding
-- counter columns (a drain updates their rows).
-- name: status_tables
WITH rels AS (
    SELECT c.oid, n.nspname, c.relname,
           CASE c.relname
               WHEN 'queue' THEN 'queue'
               WHEN 'queue_unlogged' THEN 'queue'
               WHEN 'counters' THEN 'counters'
               ELSE 'internal'
           END AS role
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'pgcounters' AND c.relkind = 'r'
    UNION
    SELECT c.oid, n.nspname, c.relname, 'counter columns'
      FROM pgcounters.targets t
      JOIN pg_namespace n ON n.nspname = t.target_schema
      JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.target_table
     WHERE t.target_table IS NOT NULL
)
SELECT r.nspname, r.relname, r.role,
       c.relpersistence = 'u' AS unlogged,
       pg_total_relation_size(r.oid),
       pg_relation_size(r.oid),
       coalesce(s.n_live_tup, 0),
       coalesce(s.n_dead_tup, 0),
       greatest(s.last_vacuum, s.last_autovacuum),
       coalesce(s.vacuum_count, 0) + coalesce(s.autovacuum_count, 0)
  FROM rels r
  JOIN pg_class c ON c.oid = r.oid
  LEFT JOIN pg_stat_user_tables s ON s.relid = r.oid
 ORDER BY r.role = 'counter columns', r.nspname, r.relname;

-- Drain statistics per queue: deltas applied in each window (the current
-- minute included, so a window of N minutes spans N to N+1 minutes), and
-- totals since install.
-- name: status_drain
WITH now AS (SELECT clock_timestamp() AS at),
windows AS (SELECT unnest(%(windows)s::integer[]) AS minutes)
SELECT q.unlogged,
       w.minutes,
       coalesce(sum(d.deltas) FILTER (
           WHERE d.bucket >= date_trunc('minute', now.at) - make_interval(mins => w.minutes)), 0
       )::bigint AS deltas,
       extract(epoch FROM now.at - (date_trunc('minute', now.at)
                                    - make_interval(mins => w.minutes)))::double precision
  FROM now
 CROSS JOIN windows w
 CROSS JOIN (VALUES (false), (true)) AS q(unlogged)
  LEFT JOIN pgcounters.drain_stats d ON d.unlogged = q.unlogged
 GROUP BY q.unlogged, w.minutes, now.at
 ORDER BY q.unlogged, w.minutes;

-- name: status_drain_totals
SELECT q.unlogged,
       coalesce(sum(d.batches), 0)::bigint,
       coalesce(sum(d.deltas), 0)::bigint,
       coalesce(sum(d.keys), 0)::bigint,
       coalesce(sum(d.seconds), 0)::double precision,
       max(d.bucket) FILTER (WHERE d.bucket > '-infinity')
  FROM (VALUES (false), (true)) AS q(unlogged)
  LEFT JOIN pgcounters.drain_stats d ON d.unlogged = q.unlogged
 GROUP BY q.unlogged
 ORDER BY q.unlogged;

-- Worker connections, recognised by their application_name.
-- name: status_workers
SELECT pid, application_name, state, backend_start, state_change
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND application_name LIKE %(prefix)s
 ORDER BY backend_start;

-- Deltas set aside, per counter and error (schema version 8).
-- name: status_quarantine
SELECT coalesce(counter, '#' || target_id::text), sqlstate, min(error), count(*),
       min(quarantined_at)
  FROM pgcounters.quarantine
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- name: status_retries
SELECT operation, reason, retries, last_at FROM pgcounters.retries ORDER BY 1, 2;

-- name: status_drain_aside
SELECT q.unlogged, coalesce(sum(d.busy), 0)::bigint, coalesce(sum(d.quarantined), 0)::bigint
  FROM (VALUES (false), (true)) AS q(unlogged)
  LEFT JOIN pgcounters.drain_stats d ON d.unlogged = q.unlogged
 GROUP BY q.unlogged
 ORDER BY q.unlogged;

-- Set-aside deltas, oldest first (pgcounters quarantine list).
-- name: quarantine_list
SELECT id, coalesce(counter, '#' || target_id::text), key, delta, unlogged, created_at,
       quarantined_at, sqlstate, error
  FROM pgcounters.quarantine
 WHERE (%(counter)s::text IS NULL OR counter = %(counter)s)
 ORDER BY id
 LIMIT %(limit)s;

-- name: quarantine_replay
SELECT pgcounters.replay_quarantined(%(ids)s, %(counter)s);

-- name: quarantine_discard
SELECT pgcounters.discard_quarantined(%(ids)s, %(counter)s);
