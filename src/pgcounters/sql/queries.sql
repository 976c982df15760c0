-- Named queries of the Python client. Each block starts with "-- name: NAME".
-- Blocks with {placeholders} are composed with psycopg.sql (identifiers only);
-- values are always bound parameters.

-- name: installed_version
SELECT max(version) FROM pgcounters.migrations;

-- name: schema_exists
SELECT to_regclass('pgcounters.migrations') IS NOT NULL;

-- name: record_migration
INSERT INTO pgcounters.migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: install_lock
SELECT pg_advisory_xact_lock(hashtext('pgcounters.install'));

-- name: create_counter
SELECT pgcounters.create_counter(%(name)s, %(key_types)s::text[], %(mode)s);

-- name: create_column_counter
SELECT pgcounters.create_column_counter(
    %(name)s, %(table)s::regclass, %(column)s, %(key_column)s, %(mode)s);

-- name: drop_counter
SELECT pgcounters.drop_counter(%(name)s);

-- name: target_by_name
SELECT id, name, key_types, mode, target_schema, target_table, target_column, target_key_column,
       (to_jsonb(t) ->> 'scale')::integer  -- from schema version 13 (NULL before it)
  FROM pgcounters.targets AS t
 WHERE name = %(name)s;

-- name: targets_by_names
SELECT id, name, key_types, mode, target_schema, target_table, target_column, target_key_column,
       (to_jsonb(t) ->> 'scale')::integer  -- from schema version 13 (NULL before it)
  FROM pgcounters.targets AS t
 WHERE name = ANY (%(names)s::text[]);

-- name: list_targets
SELECT id, name, key_types, mode, target_schema, target_table, target_column, target_key_column,
       (to_jsonb(t) ->> 'scale')::integer  -- from schema version 13 (NULL before it)
  FROM pgcounters.targets AS t
 ORDER BY name;

-- name: enqueue
INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (%s, %s::text[], %s);

-- name: enqueue_unlogged
INSERT INTO pgcounters.queue_unlogged (target_id, key, delta) VALUES (%s, %s::text[], %s);

-- name: direct_named_update
-- the common case of a direct counter: its row exists, one UPDATE (as the naive way)
UPDATE pgcounters.counters SET value = value + %s
 WHERE target_id = %s AND key = %s::text[]
RETURNING value;

-- name: direct_named
INSERT INTO pgcounters.counters AS c (target_id, key, value)
VALUES (%s, %s, %s)
ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
RETURNING c.value;

-- name: direct_column
UPDATE {table} AS x SET {column} = coalesce(x.{column}, 0) + %s
 WHERE x.{key_column} = %s
RETURNING x.{column};

-- name: exact_named
-- (refused while the counter is backfilled: pgcounters._backfilling)
SELECT CASE WHEN EXISTS (SELECT 1 FROM pgcounters.backfills AS b
                          JOIN pgcounters.targets AS g ON g.name = b.name
                         WHERE g.id = %(t)s)
            THEN pgcounters._backfilling(%(t)s) ELSE
       (coalesce((SELECT value FROM pgcounters.counters
                   WHERE target_id = %(t)s AND key = %(k)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0))::bigint END;

-- name: exact_named_logged
-- on a hot standby: the logged queue only (a standby cannot plan a statement
-- that names the unlogged queue, which is empty there); refused while the
-- counter is backfilled, as on the primary
SELECT CASE WHEN EXISTS (SELECT 1 FROM pgcounters.backfills AS b
                          JOIN pgcounters.targets AS g ON g.name = b.name
                         WHERE g.id = %(t)s)
            THEN pgcounters._backfilling(%(t)s) ELSE
       (coalesce((SELECT value FROM pgcounters.counters
                   WHERE target_id = %(t)s AND key = %(k)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0))::bigint END;

-- name: stored_named
SELECT coalesce((SELECT value FROM pgcounters.counters
                  WHERE target_id = %(t)s AND key = %(k)s), 0);

-- name: exact_column
-- (refused while the counter is backfilled: pgcounters._backfilling)
SELECT CASE WHEN EXISTS (SELECT 1 FROM pgcounters.backfills AS b
                          JOIN pgcounters.targets AS g ON g.name = b.name
                         WHERE g.id = %(t)s)
            THEN pgcounters._backfilling(%(t)s) ELSE
       (coalesce((SELECT {units} FROM {table} AS x WHERE x.{key_column} = %(v)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0))::bigint END;

-- name: exact_column_logged
SELECT CASE WHEN EXISTS (SELECT 1 FROM pgcounters.backfills AS b
                          JOIN pgcounters.targets AS g ON g.name = b.name
                         WHERE g.id = %(t)s)
            THEN pgcounters._backfilling(%(t)s) ELSE
       (coalesce((SELECT {units} FROM {table} AS x WHERE x.{key_column} = %(v)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0))::bigint END;

-- name: stored_column
SELECT coalesce((SELECT {units} FROM {table} AS x WHERE x.{key_column} = %(v)s), 0);

-- name: exact_named_many
-- (refused while the counter is backfilled: pgcounters._backfilling)
SELECT w.ord,
       CASE WHEN EXISTS (SELECT 1 FROM pgcounters.backfills AS b
                           JOIN pgcounters.targets AS g ON g.name = b.name
                          WHERE g.id = %(t)s)
            THEN pgcounters._backfilling(%(t)s) ELSE
       (coalesce(c.value, 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue q
                   WHERE q.target_id = %(t)s AND q.key = w.key::text), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged q
                   WHERE q.target_id = %(t)s AND q.key = w.key::text), 0))::bigint END
  FROM jsonb_array_elements(%(keys)s::jsonb) WITH ORDINALITY AS e(k, ord)
 CROSS JOIN LATERAL (
       SELECT e.ord, ARRAY(SELECT x FROM jsonb_array_elements_text(e.k) WITH ORDINALITY AS a(x, i)
                            ORDER BY i) AS key) AS w
  LEFT JOIN pgcounters.counters c ON c.target_id = %(t)s AND c.key = w.key;

-- name: exact_named_many_logged
SELECT w.ord,
       CASE WHEN EXISTS (SELECT 1 FROM pgcounters.backfills AS b
                           JOIN pgcounters.targets AS g ON g.name = b.name
                          WHERE g.id = %(t)s)
            THEN pgcounters._backfilling(%(t)s) ELSE
       (coalesce(c.value, 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue q
                   WHERE q.target_id = %(t)s AND q.key = w.key::text), 0))::bigint END
  FROM jsonb_array_elements(%(keys)s::jsonb) WITH ORDINALITY AS e(k, ord)
 CROSS JOIN LATERAL (
       SELECT e.ord, ARRAY(SELECT x FROM jsonb_array_elements_text(e.k) WITH ORDINALITY AS a(x, i)
                            ORDER BY i) AS key) AS w
  LEFT JOIN pgcounters.counters c ON c.target_id = %(t)s AND c.key = w.key;

-- name: stored_named_many
SELECT w.ord, coalesce(c.value, 0)
  FROM jsonb_array_elements(%(keys)s::jsonb) WITH ORDINALITY AS e(k, ord)
 CROSS JOIN LATERAL (
       SELECT e.ord, ARRAY(SELECT x FROM jsonb_array_elements_text(e.k) WITH ORDINALITY AS a(x, i)
                            ORDER BY i) AS key) AS w
  LEFT JOIN pgcounters.counters c ON c.target_id = %(t)s AND c.key = w.key;

-- name: top_named
SELECT key, value
  FROM pgcounters.counters
 WHERE target_id = %(t)s
 ORDER BY value DESC, key
 LIMIT %(n)s;

-- name: top_column
SELECT x.{key_column}::text, {units}
  FROM {table} AS x
 ORDER BY x.{column} DESC NULLS LAST, x.{key_column}
 LIMIT %(n)s;

-- name: wal_insert_position
-- The insert position covers every committed record, even one not yet flushed.
-- When the last record ended exactly at the end of a WAL page, it points past
-- the next page's header, where no record ends: a standby's replay position
-- would reach it only with the next record, written who knows when (seconds
-- on an idle primary). That page boundary is the position to wait for.
WITH p AS (SELECT pg_current_wal_insert_lsn() AS lsn,
                  current_setting('wal_block_size')::numeric AS page,
                  pg_size_bytes(current_setting('wal_segment_size')) AS segment)
SELECT (CASE WHEN (lsn - '0/0') % segment = 40 THEN lsn - 40  -- long header: a new segment
             WHEN (lsn - '0/0') % page = 24 THEN lsn - 24     -- short header: a new page
             ELSE lsn END)::text
  FROM p;

-- name: replay_reached
-- (in recovery, replayed up to the position): a primary has everything it wrote
SELECT pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn() >= %(lsn)s::pg_lsn, false);

-- name: drain_batch
SELECT deltas, keys FROM pgcounters.drain_batch(%(limit)s, %(unlogged)s);

-- name: drain_queue
SELECT deltas, keys, busy, quarantined, ahead
  FROM pgcounters.drain_queue(%(limit)s, %(unlogged)s);

-- name: record_retry
SELECT pgcounters.record_retry(%s, %s);

-- name: pending_counts
SELECT (SELECT count(*) FROM pgcounters.queue), (SELECT count(*) FROM pgcounters.queue_unlogged);

-- name: counter_triggers
-- Triggers compiled by pgcounters, whatever delivered them: their function
-- source carries a marker line with the spec name and fingerprint.
SELECT n.nspname, c.relname, t.tgname, t.tgenabled <> 'D', p.prosrc,
       -- a partition or child the counter follows (it counts for its counted table)
       EXISTS (SELECT 1 FROM pg_trigger u
                WHERE u.tgrelid = t.tgrelid
                  AND u.tgfoid = to_regproc('pgcounters._truncate_descendant'))
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE NOT t.tgisinternal
   AND p.prosrc LIKE '%-- pgcounters spec fingerprint=%'
 ORDER BY 1, 2, 3

-- name: record_spec
INSERT INTO pgcounters.specs (name, fingerprint, definition, probe, rows_delta)
VALUES (%(name)s, %(fingerprint)s, %(definition)s, %(probe)s, %(rows_delta)s)
ON CONFLICT (name) DO UPDATE
   SET fingerprint = excluded.fingerprint, definition = excluded.definition,
       probe = excluded.probe, rows_delta = excluded.rows_delta, updated_at = now()

-- name: forget_spec
DELETE FROM pgcounters.specs WHERE name = %(name)s

-- name: declared_specs
SELECT definition FROM pgcounters.specs ORDER BY name

-- name: set_paused
SELECT set_config('pgcounters.paused', %(value)s, false)

-- name: get_paused
SELECT coalesce(current_setting('pgcounters.paused', true), '')

-- name: record_flush
SELECT pgcounters.record_flush(%(flush_id)s, %(buffer)s, %(keys)s, %(total)s, %(keep)s::text[]);

-- name: flush_recorded
SELECT EXISTS (SELECT 1 FROM pgcounters.buffer_flushes WHERE flush_id = %(flush_id)s);

-- name: flushes_recorded
SELECT ARRAY(SELECT flush_id FROM pgcounters.buffer_flushes WHERE flush_id = ANY (%(ids)s::text[]));

-- name: seed_unread_rows
INSERT INTO seed_unread_counts (user_id) SELECT generate_series(0, %(keys)s - 1);

-- name: seed_unread_incr
UPDATE seed_unread_counts SET unread_count = unread_count + %s WHERE user_id = %s;

-- name: seed_unread_values
SELECT user_id, unread_count FROM seed_unread_counts WHERE unread_count <> 0;

-- name: copy_queue
COPY pgcounters.queue (target_id, key, delta) FROM STDIN;

-- name: copy_queue_unlogged
COPY pgcounters.queue_unlogged (target_id, key, delta) FROM STDIN;

-- name: quota_define
SELECT pgcounters.define_quota(
    %(name)s, %(default_limit)s, %(period)s, %(window_seconds)s, %(time_zone)s, %(log)s);

-- name: quota_drop
SELECT pgcounters.drop_quota(%(name)s);

-- name: quota_by_name
SELECT id, name, period, window_seconds, time_zone, default_limit, log_calls
  FROM pgcounters.quotas
 WHERE name = %(name)s;

-- name: quota_list
SELECT id, name, period, window_seconds, time_zone, default_limit, log_calls
  FROM pgcounters.quotas
 ORDER BY name;

-- name: quota_set_limit
SELECT pgcounters.set_limit(%(quota)s, %(subject)s, %(calls)s, %(from)s, %(until)s);

-- name: quota_remove_limits
SELECT pgcounters.remove_limits(%(quota)s, %(subject)s, %(id)s);

-- name: quota_limits
SELECT l.id, l.subject, l.calls, lower(l.valid), upper(l.valid)
  FROM pgcounters.quota_limits AS l
 WHERE l.quota_id = %(quota_id)s
   AND (%(subject)s::text IS NULL OR l.subject = %(subject)s::text)
 ORDER BY l.subject, lower(l.valid) NULLS FIRST;

-- name: quota_register_call
SELECT allowed, used, attempts, call_limit, window_start, window_end, retry_after
  FROM pgcounters.register_call(%s, %s, %s, %s, %s, %s);

-- name: quota_status
SELECT used, attempts, rejected, call_limit, window_start, window_end
  FROM pgcounters.quota_status(%(quota)s, %(subject)s, %(at)s);

-- name: quota_report
SELECT u.subject, u.window_start, u.window_end, u.call_limit, u.used, u.attempts, u.rejected
  FROM pgcounters.quota_usage AS u
 WHERE u.quota_id = %(quota_id)s
   AND (%(subject)s::text IS NULL OR u.subject = %(subject)s::text)
   AND (%(since)s::timestamptz IS NULL OR u.window_end > %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR u.window_start < %(until)s::timestamptz)
   AND (NOT %(rejected_only)s OR u.rejected > 0)
 ORDER BY u.window_start DESC, u.rejected DESC, u.subject
 LIMIT %(limit)s;

-- name: quota_top_rejected
SELECT u.subject, sum(u.rejected)::bigint, sum(u.attempts)::bigint, count(*)::bigint
  FROM pgcounters.quota_usage AS u
 WHERE u.quota_id = %(quota_id)s
   AND (%(since)s::timestamptz IS NULL OR u.window_end > %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR u.window_start < %(until)s::timestamptz)
 GROUP BY u.subject
HAVING sum(u.rejected) > 0
 ORDER BY 2 DESC, u.subject
 LIMIT %(limit)s;

-- name: quota_log
SELECT g.subject, g.at, g.cost, g.allowed, g.details::text
  FROM pgcounters.quota_log AS g
 WHERE g.quota_id = %(quota_id)s
   AND (%(subject)s::text IS NULL OR g.subject = %(subject)s::text)
   AND (%(since)s::timestamptz IS NULL OR g.at >= %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR g.at < %(until)s::timestamptz)
 ORDER BY g.at DESC, g.subject
 LIMIT %(limit)s;

-- name: quota_purge
SELECT windows, log_rows FROM pgcounters.purge_quotas(%(before)s, %(quota)s);

-- name: direct_named_add
SELECT pgcounters.add_direct(%s::integer[], %s::text[], %s::bigint[]);

-- name: grant_app
SELECT pgcounters.grant_app(%(role)s);

-- name: grant_worker
SELECT pgcounters.grant_worker(%(role)s);

-- name: revoke_role
SELECT pgcounters.revoke_role(%(role)s);

-- name: grant_pause
SELECT pgcounters.grant_pause(%(role)s);

-- name: drain_read_committed
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

-- name: counters_writable
SELECT has_table_privilege('pgcounters.counters', 'INSERT')
   AND has_table_privilege('pgcounters.counters', 'UPDATE');

-- name: broken_specs
-- Counters installed on a table whose probe does not plan: [name, error, ...].
SELECT pgcounters.broken_specs(%(table)s::regclass)

-- name: follow_descendants
-- Counters follow their tables' partitions and inheritance children (apply) or
-- say what is not followed yet (not apply).
SELECT pgcounters.follow_descendants(%(name)s, %(apply)s)

-- name: stale_mark
-- A counter's stale mark (since, statements), read as a whole recount starts.
SELECT since, statements FROM pgcounters.stale_counters WHERE name = %(name)s

-- name: clear_stale
-- A whole recount ended: the writes it missed before it started are in its truth; a mark
-- that changed since it started stays.
DELETE FROM pgcounters.stale_counters
 WHERE name = %(name)s AND since = %(since)s AND statements = %(statements)s

-- name: stale_counters
SELECT name, reason, since, statements FROM pgcounters.stale_counters ORDER BY name

-- name: set_replica_writes
SELECT pgcounters.set_replica_writes(%(name)s, %(mode)s)
