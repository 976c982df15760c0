-- Change notifications: which counters and keys a drain batch changed.

-- name: note_changes
-- ask this transaction's drain batches to note the keys they change, at most max_keys of a
-- counter (a counter of more is noted once as [name, null]; '' lists every key)
SELECT pg_catalog.set_config('pgcounters.note_changes', 'on', true),
       pg_catalog.set_config('pgcounters.note_max_keys', %(max_keys)s, true);

-- name: noted_changes
-- the keys the batches of this transaction changed (before it commits): the noted JSON
-- array as text, and the key types of the counters (JSON object name -> types; all of
-- them, a small table, rather than parse the notes a second time to pick theirs)
SELECT coalesce(nullif(current_setting('pgcounters.changes', true), ''), '[]'),
       (SELECT jsonb_object_agg(t.name, t.key_types) FROM pgcounters.targets AS t);

-- name: notify_changes
-- one notification for listeners in other processes
SELECT pg_catalog.pg_notify(%(channel)s, %(payload)s);

-- name: direct_counter_names
-- the direct-mode counters, reported as changed (keys not listed) by a worker that
-- registers again after a lost connection
SELECT name FROM pgcounters.targets WHERE mode = 'direct' ORDER BY name;

-- name: listen_direct_changes
-- register this session as a reporting worker: direct-mode counters note their changes
SELECT pgcounters.listen_direct_changes();

-- name: unlisten_direct_changes
-- unregister this session (the notes nobody will report are dropped with the last one)
SELECT pgcounters.unlisten_direct_changes();

-- name: take_direct_changes
-- take committed changes of direct-mode counters: counter name, key parts, key types, rows taken
SELECT name, key, key_types, taken FROM pgcounters.take_direct_changes(%(limit)s);
