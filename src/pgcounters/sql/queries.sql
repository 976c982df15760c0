-- Named queries of the Python client. Each block starts with "-- name: NAME".
-- Blocks with {placeholders} are composed with psycopg.sql (identifiers only);
-- values are always bound parameters.

-- name: installed_version
-- the installed schema version
SELECT max(version) FROM pgcounters.migrations;

-- name: schema_exists
-- whether the schema is installed (its migrations table exists)
SELECT to_regclass('pgcounters.migrations') IS NOT NULL;

-- name: record_migration
-- record one migration as applied
INSERT INTO pgcounters.migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: migration_recorded
-- whether one migration is recorded as applied
SELECT 1 FROM pgcounters.migrations WHERE version = %(version)s;

-- name: install_lock
-- one install or upgrade at a time (held to the end of the transaction)
SELECT pg_advisory_xact_lock(hashtext('pgcounters.install'));

-- name: select_call
-- the value of one function call composed by the caller (ensure_target of a spec)
SELECT {call};

-- name: refresh_target_ids
-- list the counters' ids for their triggers (a role without the right leaves it to a worker)
SELECT pgcounters.refresh_target_ids()
 WHERE pg_catalog.has_function_privilege('pgcounters.refresh_target_ids(boolean)', 'EXECUTE');

-- name: explain
-- the plan of a statement composed by the caller (planning checks what it reads exists)
EXPLAIN {statement};

-- name: explain_json
-- the plan of a statement composed by the caller, as JSON (the planner's estimates)
EXPLAIN (FORMAT JSON) {statement};

-- name: estimate_table
-- a table's estimated rows: reltuples / relpages times its current pages (0 before the first ANALYZE)
SELECT CASE WHEN c.reltuples < 0 THEN 0
            WHEN c.relpages = 0 THEN c.reltuples
            ELSE c.reltuples / c.relpages * (pg_relation_size(c.oid)
                                             / current_setting('block_size')::int) END
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = %s;

-- name: drop_trigger
-- drop one trigger of a counter
DROP TRIGGER {trigger} ON {table};

-- name: drop_trigger_if_exists
-- drop one trigger of a counter, if it is there
DROP TRIGGER IF EXISTS {trigger} ON {table};

-- name: drop_trigger_function
-- drop one trigger function of a counter, if it is there
DROP FUNCTION IF EXISTS {function}();

-- name: create_counter
-- declare a named counter
SELECT pgcounters.create_counter(%(name)s, %(key_types)s::text[], %(mode)s);

-- name: create_column_counter
-- declare a counter kept in a column of a user table
SELECT pgcounters.create_column_counter(
    %(name)s, %(table)s::regclass, %(column)s, %(key_column)s, %(mode)s);

-- name: drop_counter
-- forget a counter: its declaration, stored values and pending deltas
SELECT pgcounters.drop_counter(%(name)s);

-- name: triggers_as_compiled
-- how many of the given triggers exist, enabled, on their tables with exactly the given
-- function bodies (installed as compiled: nothing to install again)
SELECT count(*)
  FROM unnest(%(names)s::text[], %(tables)s::text[], %(sources)s::text[]) AS w(name, tbl, src)
  JOIN pg_catalog.pg_trigger AS t
    ON t.tgname = w.name AND t.tgrelid = to_regclass(w.tbl) AND t.tgenabled <> 'D'
  JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid AND p.prosrc = w.src;

-- name: drop_changed_target
-- drop the counter of a recorded declaration whose target is defined otherwise (key types,
-- target table and columns, decimal places): its values are in another shape, and the
-- backfill counts them again (a counter never declared, made by hand, is left alone;
-- declared: the caller knows it was declared, its recorded spec forgotten already)
SELECT pgcounters.drop_counter(t.name)
  FROM pgcounters.targets AS t
 WHERE t.name = %(name)s
   AND (%(declared)s::boolean OR EXISTS (SELECT 1 FROM pgcounters.specs AS s WHERE s.name = t.name))
   AND (t.key_types IS DISTINCT FROM %(key_types)s::text[]
        OR t.target_schema IS DISTINCT FROM %(schema)s::text
        OR t.target_table IS DISTINCT FROM %(table)s::text
        OR t.target_column IS DISTINCT FROM %(column)s::text
        OR t.target_key_column IS DISTINCT FROM %(key_column)s::text
        OR t.scale IS DISTINCT FROM %(scale)s::integer);

-- name: target_by_name
-- one counter's declaration
SELECT id, name, key_types, mode, target_schema, target_table, target_column, target_key_column,
       (to_jsonb(t) ->> 'scale')::integer  -- from schema version 13 (NULL before it)
  FROM pgcounters.targets AS t
 WHERE name = %(name)s;

-- name: targets_by_names
-- the declarations of some counters
SELECT id, name, key_types, mode, target_schema, target_table, target_column, target_key_column,
       (to_jsonb(t) ->> 'scale')::integer  -- from schema version 13 (NULL before it)
  FROM pgcounters.targets AS t
 WHERE name = ANY (%(names)s::text[]);

-- name: list_targets
-- every counter's declaration, by name
SELECT id, name, key_types, mode, target_schema, target_table, target_column, target_key_column,
       (to_jsonb(t) ->> 'scale')::integer  -- from schema version 13 (NULL before it)
  FROM pgcounters.targets AS t
 ORDER BY name;

-- name: enqueue
-- one delta into the logged queue, written only while its counter exists (a client's
-- cached id may outlive a drop: no row then, and the client looks the name up again)
INSERT INTO pgcounters.queue (target_id, key, delta)
SELECT v.t, v.k, v.d FROM (VALUES (%s::integer, %s::text[], %s::bigint)) AS v (t, k, d)
 WHERE EXISTS (SELECT FROM pgcounters.targets AS s WHERE s.id = v.t);

-- name: enqueue_unlogged
-- one delta into the unlogged queue, written only while its counter exists (see enqueue)
INSERT INTO pgcounters.queue_unlogged (target_id, key, delta)
SELECT v.t, v.k, v.d FROM (VALUES (%s::integer, %s::text[], %s::bigint)) AS v (t, k, d)
 WHERE EXISTS (SELECT FROM pgcounters.targets AS s WHERE s.id = v.t);

-- name: applying_on
-- the counter-column writes of pgcounters say so (transaction-local), for a guard on
-- the table to tell them from other writers
SELECT set_config('pgcounters.applying', 'on', true);

-- name: applying_off
-- the end of a counter-column write of pgcounters
SELECT set_config('pgcounters.applying', '', true);

-- name: enqueue_many
-- several deltas into one queue ({values}: one (%s, %s::text[], %s) per delta), all of
-- them or none: none when a counter they name no longer exists (see enqueue)
WITH v (t, k, d) AS (VALUES {values})
INSERT INTO {queue} (target_id, key, delta)
SELECT v.t, v.k, v.d FROM v
 WHERE NOT EXISTS (SELECT FROM v AS w
                    WHERE NOT EXISTS (SELECT FROM pgcounters.targets AS s WHERE s.id = w.t));

-- name: direct_named_many
-- several increments of direct named counters, summed per (target, key) by the caller; their keys noted for a reporting worker, one note per counter
WITH v (t, k, d) AS (VALUES {values}),
written AS (
    -- all of them or none: none when a counter they name no longer exists (see enqueue)
    INSERT INTO pgcounters.counters AS c (target_id, key, value)
    SELECT v.t, v.k, v.d FROM v
     WHERE NOT EXISTS (SELECT FROM v AS w
                        WHERE NOT EXISTS (SELECT FROM pgcounters.targets AS s WHERE s.id = w.t))
    ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
    RETURNING c.target_id, c.key
)
SELECT pgcounters.note_direct(w.target_id, array_agg(ARRAY[w.key::text]))
  FROM written AS w GROUP BY w.target_id;

-- name: direct_named_update
-- the common case of a direct counter: its row exists, one UPDATE (as the naive way), its key noted for a reporting worker
WITH written AS (
    UPDATE pgcounters.counters SET value = value + %(delta)s
     WHERE target_id = %(target)s AND key = %(key)s::text[]
    RETURNING value
)
SELECT w.value,
       CASE WHEN %(delta)s <> 0
            THEN pgcounters.note_direct(%(target)s, ARRAY[ARRAY[%(key)s::text[]::text]]) END
  FROM written AS w;

-- name: direct_named
-- a direct named counter's first increment of a key: create its row or add to it, its key noted for a reporting worker (no row when the counter no longer exists)
WITH written AS (
    INSERT INTO pgcounters.counters AS c (target_id, key, value)
    SELECT %(target)s, %(key)s::text[], %(delta)s
     WHERE EXISTS (SELECT 1 FROM pgcounters.targets AS s WHERE s.id = %(target)s)
    ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value
    RETURNING c.value
)
SELECT w.value,
       CASE WHEN %(delta)s <> 0
            THEN pgcounters.note_direct(%(target)s, ARRAY[ARRAY[%(key)s::text[]::text]]) END
  FROM written AS w;

-- name: direct_column
-- a direct column counter: add to the column of one row, returning the value
UPDATE {table} AS x SET {column} = coalesce(x.{column}, 0) + %(delta)s
 WHERE x.{key_column} = %(key)s
RETURNING x.{column} AS value;

-- name: note_direct_column
-- the key of a row a direct column counter's write just changed, noted for a reporting worker (a statement of its own: note_direct checks that this transaction wrote the row)
SELECT pgcounters.note_direct(%(target)s, ARRAY[%(key)s::text]);

-- name: exact_named
-- the exact value of one key of a named counter: stored + pending, from one snapshot
-- (refused while the counter is backfilled: pgcounters._backfilling; NULL when the
-- counter no longer exists: one lookup of the target answers both); 0 for a period the
-- counter no longer keeps (pgcounters._kept)
SELECT CASE (SELECT b.name IS NOT NULL
               FROM pgcounters.targets AS g
               LEFT JOIN pgcounters.backfills AS b ON b.name = g.name
              WHERE g.id = %(t)s)
            WHEN true THEN pgcounters._backfilling(%(t)s)
            WHEN false THEN CASE WHEN pgcounters._kept(
                (%(k)s::text[])[cardinality(%(k)s::text[])], (SELECT pgcounters._first_kept(%(t)s)))
            THEN
       (coalesce((SELECT value FROM pgcounters.counters
                   WHERE target_id = %(t)s AND key = %(k)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0))::bigint
            ELSE 0 END END;

-- name: exact_named_logged
-- on a hot standby: the logged queue only (a standby cannot plan a statement
-- that names the unlogged queue, which is empty there); refused while the
-- counter is backfilled, as on the primary
SELECT CASE (SELECT b.name IS NOT NULL
               FROM pgcounters.targets AS g
               LEFT JOIN pgcounters.backfills AS b ON b.name = g.name
              WHERE g.id = %(t)s)
            WHEN true THEN pgcounters._backfilling(%(t)s)
            WHEN false THEN CASE WHEN pgcounters._kept(
                (%(k)s::text[])[cardinality(%(k)s::text[])], (SELECT pgcounters._first_kept(%(t)s)))
            THEN
       (coalesce((SELECT value FROM pgcounters.counters
                   WHERE target_id = %(t)s AND key = %(k)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0))::bigint
            ELSE 0 END END;

-- name: stored_named
-- the stored value of one key of a named counter (without pending deltas); NULL when the
-- counter no longer exists
SELECT CASE WHEN EXISTS (SELECT 1 FROM pgcounters.targets AS s WHERE s.id = %(t)s)
            THEN coalesce((SELECT value FROM pgcounters.counters
                            WHERE target_id = %(t)s AND key = %(k)s
                              AND pgcounters._kept(key[cardinality(key)],
                                                   (SELECT pgcounters._first_kept(%(t)s)))),
                          0) END;

-- name: exact_column
-- the exact value of one row of a column counter: stored + pending, from one snapshot
-- (refused while the counter is backfilled: pgcounters._backfilling; NULL when the
-- counter no longer exists: one lookup of the target answers both)
SELECT CASE (SELECT b.name IS NOT NULL
               FROM pgcounters.targets AS g
               LEFT JOIN pgcounters.backfills AS b ON b.name = g.name
              WHERE g.id = %(t)s)
            WHEN true THEN pgcounters._backfilling(%(t)s)
            WHEN false THEN
       (coalesce((SELECT {units} FROM {table} AS x WHERE x.{key_column} = %(v)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0))::bigint END;

-- name: exact_column_logged
-- on a hot standby: the exact value of one key of a column counter, from the logged queue
SELECT CASE (SELECT b.name IS NOT NULL
               FROM pgcounters.targets AS g
               LEFT JOIN pgcounters.backfills AS b ON b.name = g.name
              WHERE g.id = %(t)s)
            WHEN true THEN pgcounters._backfilling(%(t)s)
            WHEN false THEN
       (coalesce((SELECT {units} FROM {table} AS x WHERE x.{key_column} = %(v)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s::text[]::text), 0))::bigint END;

-- name: stored_column
-- the stored value of one row of a column counter (without pending deltas); NULL when the
-- counter no longer exists
SELECT CASE WHEN EXISTS (SELECT 1 FROM pgcounters.targets AS s WHERE s.id = %(t)s)
            THEN coalesce((SELECT {units} FROM {table} AS x WHERE x.{key_column} = %(v)s), 0)
       END;

-- name: exact_named_many
-- the exact values of several keys of a named counter, in the order asked, from one snapshot
-- (refused while the counter is backfilled: pgcounters._backfilling); each key's stored
-- value and pending deltas are lookups by key (a join with the counters could be planned as
-- a scan of every row of the counter)
SELECT w.ord,
       CASE (SELECT b.name IS NOT NULL
               FROM pgcounters.targets AS g
               LEFT JOIN pgcounters.backfills AS b ON b.name = g.name
              WHERE g.id = %(t)s)
            WHEN true THEN pgcounters._backfilling(%(t)s)
            WHEN false THEN CASE WHEN pgcounters._kept(e.k ->> -1,  -- the key's period
                                                       (SELECT pgcounters._first_kept(%(t)s)))
            THEN
       (coalesce((SELECT c.value FROM pgcounters.counters AS c
                  WHERE c.target_id = %(t)s AND c.key = w.key), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue q
                   WHERE q.target_id = %(t)s AND q.key = w.key::text), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged q
                   WHERE q.target_id = %(t)s AND q.key = w.key::text), 0))::bigint
            ELSE 0 END END
  FROM jsonb_array_elements(%(keys)s::jsonb) WITH ORDINALITY AS e(k, ord)
 CROSS JOIN LATERAL (
       SELECT e.ord, ARRAY(SELECT x FROM jsonb_array_elements_text(e.k) WITH ORDINALITY AS a(x, i)
                            ORDER BY i) AS key) AS w;

-- name: exact_named_many_logged
-- on a hot standby: the exact values of several keys of a named counter, from the logged queue
SELECT w.ord,
       CASE (SELECT b.name IS NOT NULL
               FROM pgcounters.targets AS g
               LEFT JOIN pgcounters.backfills AS b ON b.name = g.name
              WHERE g.id = %(t)s)
            WHEN true THEN pgcounters._backfilling(%(t)s)
            WHEN false THEN CASE WHEN pgcounters._kept(e.k ->> -1,  -- the key's period
                                                       (SELECT pgcounters._first_kept(%(t)s)))
            THEN
       (coalesce((SELECT c.value FROM pgcounters.counters AS c
                  WHERE c.target_id = %(t)s AND c.key = w.key), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue q
                   WHERE q.target_id = %(t)s AND q.key = w.key::text), 0))::bigint
            ELSE 0 END END
  FROM jsonb_array_elements(%(keys)s::jsonb) WITH ORDINALITY AS e(k, ord)
 CROSS JOIN LATERAL (
       SELECT e.ord, ARRAY(SELECT x FROM jsonb_array_elements_text(e.k) WITH ORDINALITY AS a(x, i)
                            ORDER BY i) AS key) AS w;

-- name: stored_named_many
-- the stored values of several keys of a named counter, in the order asked (NULL when the
-- counter no longer exists)
SELECT w.ord, CASE WHEN EXISTS (SELECT 1 FROM pgcounters.targets AS s WHERE s.id = %(t)s)
                   THEN CASE WHEN pgcounters._kept(e.k ->> -1,  -- the key's period
                                                  (SELECT pgcounters._first_kept(%(t)s)))
                             THEN coalesce((SELECT c.value FROM pgcounters.counters AS c
                                             WHERE c.target_id = %(t)s AND c.key = w.key), 0)
                             ELSE 0 END END
  FROM jsonb_array_elements(%(keys)s::jsonb) WITH ORDINALITY AS e(k, ord)
 CROSS JOIN LATERAL (
       SELECT e.ord, ARRAY(SELECT x FROM jsonb_array_elements_text(e.k) WITH ORDINALITY AS a(x, i)
                            ORDER BY i) AS key) AS w;

-- name: top_named
-- the n highest values of a named counter (none when the counter no longer exists: the
-- caller tells an empty counter from a dropped one with target_exists)
-- The band is monotonic in the value, so this order is ORDER BY value DESC, key;
-- the index (target_id, band DESC) gives the bands from the top, an incremental
-- sort orders each band, and the scan stops after the band holding the n-th row. Ties
-- in the order of the key's parts as text, byte order; periods no longer kept left out.
SELECT key, value
  FROM pgcounters.counters
 WHERE target_id = %(t)s
   AND pgcounters._kept(key[cardinality(key)], (SELECT pgcounters._first_kept(%(t)s)))
 ORDER BY band DESC, value DESC, key COLLATE "C"
 LIMIT %(n)s;

-- name: targets_alive
-- which of some counter ids still name a counter
SELECT array_agg(id) FROM pgcounters.targets WHERE id = ANY (%(ids)s::integer[]);

-- name: target_exists
-- whether the counter of an id still exists (a client's cached id may outlive it)
SELECT EXISTS (SELECT 1 FROM pgcounters.targets WHERE id = %(t)s);

-- name: top_column
-- the n highest values of a column counter
SELECT x.{key_column}::text, {units}
  FROM {table} AS x
 ORDER BY x.{column} DESC NULLS LAST, x.{key_column}
 LIMIT %(n)s;

-- name: wal_insert_position
-- the WAL position a standby must replay to see what this primary committed
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
-- whether this server has everything up to a WAL position
-- (in recovery, replayed up to the position): a primary has everything it wrote
SELECT pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn() >= %(lsn)s::pg_lsn, false);

-- name: drain_batch
-- one drain batch of one queue: deltas applied, counter values changed
SELECT deltas, keys FROM pgcounters.drain_batch(%(limit)s, %(unlogged)s);

-- name: queue_span
-- How many deltas one queue may hold (operations.sql, queue_spans, says how): a drain to
-- the end takes a queue holding more than a batch in one larger batch.
SELECT CASE WHEN %(unlogged)s THEN
    coalesce((SELECT id FROM pgcounters.queue_unlogged ORDER BY id DESC LIMIT 1)
             - (SELECT id FROM pgcounters.queue_unlogged ORDER BY id LIMIT 1) + 1, 0)
ELSE
    coalesce((SELECT id FROM pgcounters.queue ORDER BY id DESC LIMIT 1)
             - (SELECT id FROM pgcounters.queue ORDER BY id LIMIT 1) + 1, 0)
END;

-- name: drain_queue
-- one drain batch of one queue, with the deltas left busy and set aside
SELECT deltas, keys, busy, quarantined, ahead
  FROM pgcounters.drain_queue(%(limit)s, %(unlogged)s);

-- name: record_retry
-- count one retried batch of an operation, by reason
SELECT pgcounters.record_retry(%s, %s);

-- name: pending_counts
-- how many deltas each queue holds
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
-- record a declared counter's spec (definition, fingerprint, probe)
INSERT INTO pgcounters.specs (name, fingerprint, definition, probe, rows_delta)
VALUES (%(name)s, %(fingerprint)s, %(definition)s, %(probe)s, %(rows_delta)s)
ON CONFLICT (name) DO UPDATE
   SET fingerprint = excluded.fingerprint, definition = excluded.definition,
       probe = excluded.probe, rows_delta = excluded.rows_delta, updated_at = now()

-- name: forget_spec
-- forget a declared counter's spec
DELETE FROM pgcounters.specs WHERE name = %(name)s

-- name: declared_specs
-- every recorded spec, by name
SELECT definition FROM pgcounters.specs ORDER BY name

-- name: set_paused
-- pause counting in this session ('all' or a list of counter names)
SELECT set_config('pgcounters.paused', %(value)s, false)

-- name: get_paused
-- the counters paused in this session
SELECT coalesce(current_setting('pgcounters.paused', true), '')

-- name: record_flush
-- record a buffer's flush (false: it was recorded before)
SELECT pgcounters.record_flush(%(flush_id)s, %(buffer)s, %(keys)s, %(total)s, %(keep)s::text[]);

-- name: flush_recorded
-- whether one flush is recorded
SELECT EXISTS (SELECT 1 FROM pgcounters.buffer_flushes WHERE flush_id = %(flush_id)s);

-- name: exact_and_flushes
-- a buffered key's exact value and which of some flushes are recorded, from one snapshot
SELECT ({exact}), ({flushes});

-- name: flushes_recorded
-- which of some flushes are recorded
SELECT ARRAY(SELECT flush_id FROM pgcounters.buffer_flushes WHERE flush_id = ANY (%(ids)s::text[]));

-- name: copy_queue
-- many deltas into the logged queue at once
COPY pgcounters.queue (target_id, key, delta) FROM STDIN;

-- name: copy_queue_unlogged
-- many deltas into the unlogged queue at once
COPY pgcounters.queue_unlogged (target_id, key, delta) FROM STDIN;

-- name: quota_define
-- declare a quota, or change its default limit and logging
SELECT pgcounters.define_quota(
    %(name)s, %(default_limit)s, %(period)s, %(window_seconds)s, %(time_zone)s, %(log)s,
    %(bucket_seconds)s);

-- name: quota_drop
-- forget a quota with its limits, usage and log
SELECT pgcounters.drop_quota(%(name)s);

-- name: quota_by_name
-- one quota's definition
SELECT id, name, period, window_seconds, time_zone, default_limit, log_calls, bucket_seconds
  FROM pgcounters.quotas
 WHERE name = %(name)s;

-- name: quota_list
-- every quota's definition, by name
SELECT id, name, period, window_seconds, time_zone, default_limit, log_calls, bucket_seconds
  FROM pgcounters.quotas
 ORDER BY name;

-- name: quota_set_limit
-- give a subject a limit over a time range
SELECT pgcounters.set_limit(%(quota)s, %(subject)s, %(calls)s, %(from)s, %(until)s);

-- name: quota_remove_limits
-- remove one limit of a subject, or all of them
SELECT pgcounters.remove_limits(%(quota)s, %(subject)s, %(id)s);

-- name: quota_limits
-- the limits of a quota (of one subject, or all)
SELECT l.id, l.subject, l.calls, lower(l.valid), upper(l.valid)
  FROM pgcounters.quota_limits AS l
 WHERE l.quota_id = %(quota_id)s
   AND (%(subject)s::text IS NULL OR l.subject = %(subject)s::text)
 ORDER BY l.subject, lower(l.valid) NULLS FIRST;

-- name: quota_register_call
-- register a call and decide whether it is allowed
SELECT allowed, used, attempts, call_limit, window_start, window_end, retry_after
  FROM pgcounters.register_call(%s, %s, %s, %s, %s, %s);

-- name: quota_status
-- a subject's usage in the window containing an instant
SELECT used, attempts, rejected, call_limit, window_start, window_end
  FROM pgcounters.quota_status(%(quota)s, %(subject)s, %(at)s);

-- name: quota_report
-- the usage rows of a quota
-- (a sliding window's row: its buckets as of the subject's latest call)
SELECT u.subject, u.window_start, u.window_end, u.call_limit, u.used, u.attempts, u.rejected
  FROM (SELECT f.quota_id, f.subject, f.window_start, f.window_end, f.call_limit, f.used,
               f.attempts, f.rejected
          FROM pgcounters.quota_usage AS f
        UNION ALL
        SELECT s.quota_id, s.subject,
               to_timestamp((s.head - q.window_seconds / q.bucket_seconds) * q.bucket_seconds),
               to_timestamp((s.head + 1) * q.bucket_seconds), s.call_limit,
               (SELECT sum(x) FROM unnest(s.granted) AS x)::bigint,
               (SELECT sum(x) FROM unnest(s.tried) AS x)::bigint,
               (SELECT sum(x) FROM unnest(s.refused) AS x)::bigint
          FROM pgcounters.quota_sliding_usage AS s
          JOIN pgcounters.quotas AS q ON q.id = s.quota_id) AS u
 WHERE u.quota_id = %(quota_id)s
   AND (%(subject)s::text IS NULL OR u.subject = %(subject)s::text)
   AND (%(since)s::timestamptz IS NULL OR u.window_end > %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR u.window_start < %(until)s::timestamptz)
   AND (NOT %(rejected_only)s OR u.rejected > 0)
 ORDER BY u.window_start DESC, u.rejected DESC, u.subject
 LIMIT %(limit)s;

-- name: quota_top_rejected
-- the subjects of a quota with the most rejected calls
SELECT u.subject, sum(u.rejected)::bigint, sum(u.attempts)::bigint, count(*)::bigint
  FROM (SELECT f.quota_id, f.subject, f.window_start, f.window_end, f.attempts, f.rejected
          FROM pgcounters.quota_usage AS f
        UNION ALL
        SELECT s.quota_id, s.subject,
               to_timestamp((s.head - q.window_seconds / q.bucket_seconds) * q.bucket_seconds),
               to_timestamp((s.head + 1) * q.bucket_seconds),
               (SELECT sum(x) FROM unnest(s.tried) AS x)::bigint,
               (SELECT sum(x) FROM unnest(s.refused) AS x)::bigint
          FROM pgcounters.quota_sliding_usage AS s
          JOIN pgcounters.quotas AS q ON q.id = s.quota_id) AS u
 WHERE u.quota_id = %(quota_id)s
   AND (%(since)s::timestamptz IS NULL OR u.window_end > %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR u.window_start < %(until)s::timestamptz)
 GROUP BY u.subject
HAVING sum(u.rejected) > 0
 ORDER BY 2 DESC, u.subject
 LIMIT %(limit)s;

-- name: quota_log
-- the request log of a quota
SELECT g.subject, g.at, g.cost, g.allowed, g.details::text
  FROM pgcounters.quota_log AS g
 WHERE g.quota_id = %(quota_id)s
   AND (%(subject)s::text IS NULL OR g.subject = %(subject)s::text)
   AND (%(since)s::timestamptz IS NULL OR g.at >= %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR g.at < %(until)s::timestamptz)
 ORDER BY g.at DESC, g.subject
 LIMIT %(limit)s;

-- name: quota_purge
-- remove old windows and log rows
SELECT windows, log_rows FROM pgcounters.purge_quotas(%(before)s, %(quota)s);

-- name: direct_named_add
-- add to direct named counters (without write rights on pgcounters.counters)
SELECT pgcounters.add_direct(%s::integer[], %s::text[], %s::bigint[]);

-- name: grant_app
-- give a role what the application needs
SELECT pgcounters.grant_app(%(role)s);

-- name: grant_worker
-- give a role what the worker needs
SELECT pgcounters.grant_worker(%(role)s);

-- name: revoke_role
-- take back what grant_app and grant_worker gave a role
SELECT pgcounters.revoke_role(%(role)s);

-- name: grant_pause
-- let a role pause counting in its own sessions
SELECT pgcounters.grant_pause(%(role)s);

-- name: drain_read_committed
-- a drain batch runs in READ COMMITTED whatever the session's default
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

-- name: careful_limit
-- the largest batch of this transaction taken one key at a time when it holds a delta
-- that cannot be applied (a larger one is refused: PC022)
SELECT set_config('pgcounters.careful_limit', %(limit)s, true);

-- name: counters_writable
-- whether this role may write pgcounters.counters itself (and note what it changed)
SELECT has_table_privilege('pgcounters.counters', 'INSERT')
   AND has_table_privilege('pgcounters.counters', 'UPDATE')
   AND has_function_privilege('pgcounters.note_direct(integer, anyarray)', 'EXECUTE');

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
-- the counters that missed writes, until a recount of them starts
SELECT name, reason, since, statements FROM pgcounters.stale_counters ORDER BY name

-- name: set_replica_writes
-- what a counter does with writes of replica-mode sessions
SELECT pgcounters.set_replica_writes(%(name)s, %(mode)s)

-- name: statement_timeout
-- the session's statement timeout, to put it back after a drain that set its own
SELECT current_setting('statement_timeout');

-- name: set_statement_timeout
-- set the session's statement timeout (a drain's own, or the one it put aside)
SELECT set_config('statement_timeout', %(timeout)s, false);

-- name: replica_writes_choices
-- each declared counter's choice for writes made in replica mode
SELECT name, replica_writes FROM pgcounters.specs ORDER BY name;

-- name: column_type
-- the SQL type of one column of a table (NULL when there is no such column)
SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute AS a
 WHERE a.attrelid = to_regclass(%s) AND a.attname = %s AND NOT a.attisdropped;

-- name: target_scale
-- the decimal places of a counter's values (NULL: integer values)
SELECT scale FROM pgcounters.targets WHERE name = %s;

-- name: range_sum
-- the exact value of one key of a counter per period over a range of its periods, from
-- the key parts of the first and the last period: one index range scan a table; NULL
-- when the counter's periods are no longer %(bucket)s; refused while it is backfilled
SELECT pgcounters._range_sum(%(t)s, %(name)s, %(bucket)s::jsonb, %(key)s::text[],
                             %(first)s::text, %(last)s::text);

-- name: range_values
-- the exact values of one key of a counter per period over a range of its periods: one
-- row per period that has a value (key part, value); one row of NULLs when the
-- counter's periods are no longer %(bucket)s; refused while it is backfilled
SELECT bucket, value FROM pgcounters._range_values(%(t)s, %(name)s, %(bucket)s::jsonb,
                                                   %(key)s::text[], %(first)s::text,
                                                   %(last)s::text);

-- name: top_range
-- the n keys with the highest exact values of a counter per period over a range
SELECT t.key, t.value
  FROM pgcounters._bucket(%(name)s) AS b,
       pgcounters.top_range(%(name)s,
           coalesce(%(start)s::timestamptz, %(start_day)s::date::timestamp AT TIME ZONE b.zone),
           coalesce(%(end)s::timestamptz, %(end_day)s::date::timestamp AT TIME ZONE b.zone),
           %(n)s) AS t;

-- name: drop_expired_buckets
-- retention of counters per period: delete at most %(limit)s values of periods no longer kept
SELECT pgcounters.drop_expired_buckets(%(limit)s);

-- name: bucket_of
-- the recorded definition of the periods of a counter per period (refused for another counter)
SELECT s.definition -> 'bucket' FROM pgcounters._bucket(%(name)s) AS b, pgcounters.specs AS s
 WHERE s.name = %(name)s;
