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
SELECT id, name, key_types, mode, target_schema, target_table, target_column, target_key_column
  FROM pgcounters.targets
 WHERE name = %(name)s;

-- name: list_targets
SELECT id, name, key_types, mode, target_schema, target_table, target_column, target_key_column
  FROM pgcounters.targets
 ORDER BY name;

-- name: enqueue
INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (%s, %s::text[], %s);

-- name: enqueue_unlogged
INSERT INTO pgcounters.queue_unlogged (target_id, key, delta) VALUES (%s, %s::text[], %s);

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
SELECT (coalesce((SELECT value FROM pgcounters.counters
                   WHERE target_id = %(t)s AND key = %(k)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                   WHERE target_id = %(t)s AND key = %(k)s), 0))::bigint;

-- name: stored_named
SELECT coalesce((SELECT value FROM pgcounters.counters
                  WHERE target_id = %(t)s AND key = %(k)s), 0);

-- name: exact_column
SELECT (coalesce((SELECT x.{column} FROM {table} AS x WHERE x.{key_column} = %(v)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue
                   WHERE target_id = %(t)s AND key = %(k)s), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged
                   WHERE target_id = %(t)s AND key = %(k)s), 0))::bigint;

-- name: stored_column
SELECT coalesce((SELECT x.{column} FROM {table} AS x WHERE x.{key_column} = %(v)s), 0);

-- name: exact_named_many
SELECT w.ord,
       (coalesce(c.value, 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue q
                   WHERE q.target_id = %(t)s AND q.key = w.key), 0)
      + coalesce((SELECT sum(delta) FROM pgcounters.queue_unlogged q
                   WHERE q.target_id = %(t)s AND q.key = w.key), 0))::bigint
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
SELECT x.{key_column}::text, x.{column}
  FROM {table} AS x
 ORDER BY x.{column} DESC NULLS LAST, x.{key_column}
 LIMIT %(n)s;

-- name: drain_batch
SELECT deltas, keys FROM pgcounters.drain_batch(%(limit)s, %(unlogged)s);

-- name: pending_counts
SELECT (SELECT count(*) FROM pgcounters.queue), (SELECT count(*) FROM pgcounters.queue_unlogged);

-- name: counter_triggers
-- Triggers compiled by pgcounters, whatever delivered them: their function
-- source carries a marker line with the spec name and fingerprint.
SELECT n.nspname, c.relname, t.tgname, t.tgenabled <> 'D', p.prosrc
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE NOT t.tgisinternal
   AND p.prosrc LIKE '%-- pgcounters spec fingerprint=%'
 ORDER BY 1, 2, 3

-- name: record_spec
INSERT INTO pgcounters.specs (name, fingerprint, definition)
VALUES (%(name)s, %(fingerprint)s, %(definition)s)
ON CONFLICT (name) DO UPDATE
   SET fingerprint = excluded.fingerprint, definition = excluded.definition, updated_at = now()

-- name: forget_spec
DELETE FROM pgcounters.specs WHERE name = %(name)s

-- name: declared_specs
SELECT definition FROM pgcounters.specs ORDER BY name

-- name: set_paused
SELECT set_config('pgcounters.paused', %(value)s, false)

-- name: get_paused
SELECT coalesce(current_setting('pgcounters.paused', true), '')

-- name: record_flush
SELECT pgcounters.record_flush(
    %(flush_id)s, %(buffer)s, %(keys)s, %(total)s, %(retention)s::interval, %(keep)s::text[]);

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
