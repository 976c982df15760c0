-- Named statements of verify, recount and backfill (repair.py, backfill.py).
-- Each block starts with "-- name: NAME" and a one-line description. Blocks
-- with {placeholders} are composed with psycopg.sql: identifiers of the counted
-- tables, the compiled truth query, key sets and literals quoted by psycopg.

-- name: text_keys
-- a set of text[] keys, given as a JSON array of arrays, as a subquery
SELECT ARRAY(SELECT jsonb_array_elements_text(e))::text[] FROM jsonb_array_elements({keys}) e;

-- name: pending
-- the pending deltas of one counter per key, from both queues (which keep a key as its array's text)
SELECT q.key::text[] AS key, sum(q.delta)::bigint AS delta FROM (
    SELECT key, delta FROM pgcounters.queue WHERE target_id = {target}
    UNION ALL
    SELECT key, delta FROM pgcounters.queue_unlogged WHERE target_id = {target}
) AS q GROUP BY q.key;

-- name: pending_of_keys
-- the pending deltas of some keys ({keys}: a subquery of text[] keys) of one counter
SELECT q.key::text[] AS key, sum(q.delta)::bigint AS delta FROM (
    SELECT key, delta FROM pgcounters.queue
     WHERE target_id = {target} AND key IN (SELECT k::text FROM ({keys}) AS s(k))
    UNION ALL
    SELECT key, delta FROM pgcounters.queue_unlogged
     WHERE target_id = {target} AND key IN (SELECT k::text FROM ({keys}) AS s(k))
) AS q GROUP BY q.key;

-- name: parent_keys
-- every key of a column counter's parent table
SELECT {k} AS k FROM {p};

-- name: parent_keys_sample
-- {n} randomly chosen keys of a column counter's parent table
SELECT {k} AS k FROM {p} ORDER BY random() LIMIT {n};

-- name: verify_column
-- a column counter's exact values against the truth, for the keys chosen: the keys
-- that differ, then one summary row (NULL key, the number of keys compared)
WITH keys AS MATERIALIZED ({keys}), truth AS ({truth}), pending AS ({pending}),
compared AS (
    SELECT {text_key} AS key,
           coalesce({stored}, 0) + coalesce(p.delta, 0) AS actual,
           coalesce(t.delta, 0) AS expected
      FROM {p} AS x JOIN keys ON keys.k = x.{k}
      LEFT JOIN truth AS t ON t.key = {text_key}
      LEFT JOIN pending AS p ON p.key = {text_key})
SELECT key, actual, expected FROM compared WHERE actual <> expected
UNION ALL
SELECT NULL, count(*), 0 FROM compared;

-- name: verify_named
-- a named counter's exact values against the truth, for every key known (or a sample:
-- {limit}): the keys that differ, then one summary row (NULL key, the number compared)
WITH truth AS ({truth}),
stored AS (SELECT key, value FROM pgcounters.counters WHERE target_id = {target}),
pending AS ({pending}),
keys AS MATERIALIZED (SELECT key FROM (SELECT key FROM truth UNION
                      SELECT key FROM stored UNION SELECT key FROM pending) AS u {limit}),
compared AS (
    SELECT k.key, coalesce(s.value, 0) + coalesce(p.delta, 0) AS actual,
           coalesce(t.delta, 0) AS expected
      FROM keys AS k LEFT JOIN truth AS t ON t.key = k.key
      LEFT JOIN stored AS s ON s.key = k.key LEFT JOIN pending AS p ON p.key = k.key)
SELECT key, actual, expected FROM compared WHERE actual <> expected
UNION ALL
SELECT NULL, count(*), 0 FROM compared;

-- name: recount_finished
-- a recount went through every key
UPDATE pgcounters.recounts SET finished_at = now() WHERE name = %s;

-- name: recount_progress
-- a batch of a recount committed: move the resume cursor, add to the counts
UPDATE pgcounters.recounts SET cursor_key = %s, keys_done = keys_done + %s,
       keys_fixed = keys_fixed + %s, updated_at = now()
 WHERE name = %s;

-- name: recount_busy_key_done
-- a key whose row was busy is recounted (the cursor does not move: it never passed it)
UPDATE pgcounters.recounts SET keys_done = keys_done + 1,
       keys_fixed = keys_fixed + %s, updated_at = now()
 WHERE name = %s;

-- name: recount_cursor
-- where the last recount of a counter stopped, and whether it is unfinished
SELECT cursor_key, finished_at IS NULL FROM pgcounters.recounts WHERE name = %s;

-- name: recount_start
-- a recount starts from the first key
INSERT INTO pgcounters.recounts (name) VALUES (%s)
ON CONFLICT (name) DO UPDATE
   SET cursor_key = NULL, keys_done = 0, keys_fixed = 0, started_at = now(),
       updated_at = now(), finished_at = NULL;

-- name: parent_key_count
-- how many rows of a parent table pass a filter on the key ({w})
SELECT count(*) FROM {p} WHERE {w};

-- name: parent_keys_after
-- the next {n} keys of a parent table that pass a filter on the key ({w}), in key order
SELECT {k} FROM {p} WHERE {w} ORDER BY {k} LIMIT {n};

-- name: lock_parent_rows
-- lock the parent rows of some keys in key order ({skip}: SKIP LOCKED, or nothing to wait)
SELECT {k} FROM {p} WHERE {k} = ANY ({keys}) ORDER BY {k} FOR NO KEY UPDATE{skip};

-- name: parent_rows
-- the keys of some parent rows that exist (a key among them another transaction holds is busy)
SELECT {k} FROM {p} WHERE {k} = ANY ({keys}) ORDER BY {k};

-- name: parent_key_texts
-- the one-part text[] keys (as the queues keep them) of an array of parent keys
SELECT {text_key} FROM unnest({keys}) AS u;

-- name: busy_lock_timeout
-- how long the transaction of a busy key waits for its row (below deadlock_timeout)
SET LOCAL lock_timeout = {timeout};

-- name: recount_column
-- set stored = truth - pending for the locked parent rows ({keys}), from one snapshot
WITH truth AS ({truth}), pending AS ({pending}),
wanted AS (
    SELECT x.{k} AS k, coalesce(t.delta, 0) - coalesce(p.delta, 0) AS value
      FROM {p} AS x
      LEFT JOIN truth AS t ON t.key = {text_key}
      LEFT JOIN pending AS p ON p.key = {text_key}
     WHERE x.{k} = ANY ({keys}))
UPDATE {p} AS x SET {c} = {value} FROM wanted AS w
 WHERE x.{k} = w.k AND x.{c} IS DISTINCT FROM {value};

-- name: named_keys
-- every key of a named counter known now (truth, stored, pending), in byte order
-- (COLLATE "C", Python's order of the same keys: the resume cursor is compared in Python)
SELECT key FROM (SELECT key FROM ({truth}) AS t UNION
                 SELECT key FROM pgcounters.counters WHERE target_id = {target} UNION
                 SELECT key FROM ({pending}) AS p) AS u
 ORDER BY key COLLATE "C";

-- name: create_named_rows
-- a row of value 0 for every key ({batch}) of a named counter that has none; rows that
-- exist are left out by a plain read (ON CONFLICT would wait for a transaction holding one)
INSERT INTO pgcounters.counters (target_id, key, value)
SELECT {t}, b.key, 0 FROM ({batch}) AS b(key)
 WHERE NOT EXISTS (SELECT 1 FROM pgcounters.counters AS c
                    WHERE c.target_id = {t} AND c.key = b.key)
 ORDER BY 2
ON CONFLICT (target_id, key) DO NOTHING;

-- name: lock_named_rows
-- lock the stored rows of some keys of a named counter in key order ({skip}: SKIP LOCKED, or nothing)
SELECT key FROM pgcounters.counters WHERE target_id = {t} AND key IN ({batch})
 ORDER BY key FOR UPDATE{skip};

-- name: recount_named
-- set stored = truth - pending for the locked rows ({batch}) of a named counter, from one snapshot
WITH truth AS ({truth}), pending AS ({pending}),
wanted AS (
    SELECT b.key, coalesce(t.delta, 0) - coalesce(p.delta, 0) AS value
      FROM ({batch}) AS b(key)
      LEFT JOIN truth AS t ON t.key = b.key LEFT JOIN pending AS p ON p.key = b.key)
UPDATE pgcounters.counters AS c SET value = w.value FROM wanted AS w
 WHERE c.target_id = {t} AND c.key = w.key AND c.value <> w.value;

-- name: backfill_request
-- mark a counter for a backfill from its first key
INSERT INTO pgcounters.backfills (name, fingerprint) VALUES (%s, %s)
ON CONFLICT (name) DO UPDATE
   SET fingerprint = excluded.fingerprint, cursor_key = NULL, keys_done = 0,
       requested_at = now(), updated_at = now();

-- name: backfill_cancel
-- forget the backfill of a counter
DELETE FROM pgcounters.backfills WHERE name = %s;

-- name: backfills
-- the counters being backfilled, by name
SELECT name, fingerprint, keys_done, cursor_key, requested_at
  FROM pgcounters.backfills ORDER BY name;

-- name: backfill_claim
-- the backfill of one counter, unless another process is running a batch of it
SELECT fingerprint, cursor_key, stale_since, stale_statements
  FROM pgcounters.backfills WHERE name = %s
   FOR UPDATE SKIP LOCKED;

-- name: backfill_stale_mark
-- the counter's stale mark as a backfill's first batch starts (cleared when it ends, if unchanged)
UPDATE pgcounters.backfills SET stale_since = %s, stale_statements = %s WHERE name = %s;

-- name: backfill_progress
-- a batch of a backfill is done: move its cursor
UPDATE pgcounters.backfills SET cursor_key = %s, keys_done = keys_done + %s, updated_at = now()
 WHERE name = %s;

-- name: first_period_kept
-- the key part of the first period a counter per period keeps ({kept})
SELECT {kept};
