-- Change notifications: which counters and keys a drain batch changed.

-- name: note_changes
-- ask this transaction's drain batches to note the keys they change
SELECT pg_catalog.set_config('pgcounters.note_changes', 'on', true);

-- name: noted_changes
-- the keys the batches of this transaction changed (before it commits), with
-- their counter's key types (NULL when the counter was dropped meanwhile)
SELECT e.value ->> 0 AS counter,
       ARRAY(SELECT jsonb_array_elements_text(e.value -> 1)) AS key,
       t.key_types
  FROM jsonb_array_elements(
         coalesce(nullif(current_setting('pgcounters.changes', true), ''), '[]')::jsonb) AS e
  LEFT JOIN pgcounters.targets AS t ON t.name = e.value ->> 0;

-- name: notify_changes
-- one notification for listeners in other processes
SELECT pg_catalog.pg_notify(%(channel)s, %(payload)s);
