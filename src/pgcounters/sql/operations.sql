-- Named queries of the worker and of `pgcounters status` ("-- name: NAME" blocks).
-- Values are always bound parameters.

-- name: worker_session
-- the worker's session: timeouts, and Read Committed by default (a batch is one statement);
-- a batch running when the worker's process dies is cancelled within a second (without
-- the check, PostgreSQL notices a lost client only when it answers: the statement would
-- run on, holding its rows, and commit)
SELECT set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, false),
       set_config('default_transaction_isolation', 'read committed', false),
       set_config('client_connection_check_interval', '1s', false);

-- name: refresh_target_ids
-- A worker's refresh of the ids listed for the counters' triggers: at once or not at all
-- (another transaction writing the list is not waited for).
SELECT pgcounters.refresh_target_ids(false)
 WHERE pg_catalog.has_function_privilege('pgcounters.refresh_target_ids(boolean)', 'EXECUTE');

-- name: queue_spans
-- How many deltas each queue may hold: last id - first id + 1 by the primary key (0 when
-- empty; dead rows of drained batches are not read one by one). A worker drains only the
-- queues holding some, and a queue holding more than a batch in one larger batch (each key
-- is then written once for all its deltas). An upper bound: ids of rolled-back inserts and
-- of rows other drainers hold count too.
SELECT coalesce((SELECT id FROM pgcounters.queue ORDER BY id DESC LIMIT 1)
                - (SELECT id FROM pgcounters.queue ORDER BY id LIMIT 1) + 1, 0),
       coalesce((SELECT id FROM pgcounters.queue_unlogged ORDER BY id DESC LIMIT 1)
                - (SELECT id FROM pgcounters.queue_unlogged ORDER BY id LIMIT 1) + 1, 0);

-- name: listen
-- the worker listens for wake-ups
LISTEN pgcounters_queue;

-- name: unlisten
-- the worker stops listening for wake-ups
UNLISTEN pgcounters_queue;

-- name: enable_wakeups
-- install (or re-time) the wake-up triggers on the queues
SELECT pgcounters.enable_wakeups(make_interval(secs => %(seconds)s));

-- name: disable_wakeups
-- remove the wake-up triggers
SELECT pgcounters.disable_wakeups();

-- name: operations_installed
-- whether the drain statistics exist
SELECT to_regclass('pgcounters.drain_stats') IS NOT NULL;

-- name: wakeup_interval
-- the wake-up interval in milliseconds, NULL when wake-ups are off
SELECT pgcounters.wakeup_interval_ms();

-- name: status_clock
-- the time the status is taken
SELECT clock_timestamp();

-- name: status_pending
-- Pending deltas per counter and queue, with the age of the oldest one. One
-- scan of each queue. Deltas of a counter dropped while they were in flight
-- show under the target id.
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
-- every counter and its mode
SELECT name, mode FROM pgcounters.targets ORDER BY name;

-- name: status_tables
-- The tables pgcounters writes to: its own, and the user tables holding
-- counter columns (a drain updates their rows).
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

-- name: status_drain
-- Drain statistics per queue: deltas applied in each window (the current
-- minute included, so a window of N minutes spans N to N+1 minutes), and
-- totals since install.
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
-- drain statistics since the install, per queue
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

-- name: status_workers
-- Worker connections, recognised by their application_name.
SELECT pid, application_name, state, backend_start, state_change
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND application_name LIKE %(prefix)s
 ORDER BY backend_start;

-- name: status_quarantine
-- Deltas set aside, per counter and error (schema version 8).
SELECT coalesce(counter, '#' || target_id::text), sqlstate, min(error), count(*),
       min(quarantined_at)
  FROM pgcounters.quarantine
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- name: status_retries
-- retried batches per operation and reason
SELECT operation, reason, retries, last_at FROM pgcounters.retries ORDER BY 1, 2;

-- name: status_drain_aside
-- deltas left busy and set aside by the drain, per queue
SELECT q.unlogged, coalesce(sum(d.busy), 0)::bigint, coalesce(sum(d.quarantined), 0)::bigint
  FROM (VALUES (false), (true)) AS q(unlogged)
  LEFT JOIN pgcounters.drain_stats d ON d.unlogged = q.unlogged
 GROUP BY q.unlogged
 ORDER BY q.unlogged;

-- name: status_backfills
-- the counters being backfilled: keys done, seconds since the request
SELECT name, keys_done, extract(epoch FROM now() - requested_at)::float8
  FROM pgcounters.backfills ORDER BY name;

-- name: status_direct_changes_readable
-- whether this role may read the change reports of direct-mode counters
SELECT has_table_privilege('pgcounters.change_listeners', 'SELECT')
   AND has_table_privilege('pgcounters.direct_changes', 'SELECT');

-- name: status_direct_changes
-- change reports of direct-mode counters: reporting workers alive, registrations of sessions gone, notes waiting (at most; read from the id range, no scan)
SELECT count(a.pid), count(*) - count(a.pid),
       (SELECT coalesce(max(d.id) - min(d.id) + 1, 0) FROM pgcounters.direct_changes AS d)
  FROM pgcounters.change_listeners AS l
  LEFT JOIN LATERAL pg_catalog.pg_stat_get_activity(l.pid) AS a ON true;

-- name: quarantine_list
-- Set-aside deltas, oldest first (pgcounters quarantine list).
SELECT id, coalesce(counter, '#' || target_id::text), key, delta, unlogged, created_at,
       quarantined_at, sqlstate, error
  FROM pgcounters.quarantine
 WHERE (%(counter)s::text IS NULL OR counter = %(counter)s)
 ORDER BY id
 LIMIT %(limit)s;

-- name: quarantine_replay
-- move set-aside deltas back into their queues
SELECT pgcounters.replay_quarantined(%(ids)s, %(counter)s);

-- name: quarantine_discard
-- delete set-aside deltas
SELECT pgcounters.discard_quarantined(%(ids)s, %(counter)s);

-- name: horizon_holders
-- What keeps VACUUM from removing row versions in this database, oldest first: the
-- snapshots of its sessions and of standbys' feedback, replication slots, prepared
-- transactions (this session left out). `xid_age` is the age of the oldest transaction the
-- holder may still see as running; `since` the start of a session's transaction, of a
-- standby's connection, of a prepared transaction's preparation. A role without
-- pg_read_all_stats sees other roles' snapshots (`xid_age`) and application names, not
-- their state nor since when.
SELECT h.kind, h.pid, h.name, h.state, h.since,
       extract(epoch FROM clock_timestamp() - h.since)::double precision AS seconds,
       h.xid_age
  FROM (
        SELECT 'session' AS kind, a.pid, a.application_name AS name, a.state,
               a.xact_start AS since, age(a.backend_xmin) AS xid_age
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.datname = current_database()
           AND a.backend_xmin IS NOT NULL
           AND a.pid <> pg_catalog.pg_backend_pid()
        UNION ALL
        SELECT 'standby', a.pid, a.application_name, a.state, a.backend_start,
               age(a.backend_xmin)
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.backend_type = 'walsender' AND a.backend_xmin IS NOT NULL
        UNION ALL
        SELECT 'replication slot', s.active_pid, s.slot_name,
               CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL, age(s.xmin)
          FROM pg_catalog.pg_replication_slots AS s
         WHERE s.xmin IS NOT NULL
           AND (s.database IS NULL OR s.database = current_database())
        UNION ALL
        SELECT 'prepared transaction', NULL, p.gid, 'prepared', p.prepared,
               age(p.transaction)
          FROM pg_catalog.pg_prepared_xacts AS p
         WHERE p.database = current_database()
       ) AS h
 ORDER BY h.xid_age DESC, h.since
 LIMIT %(limit)s;
