-- Named statements of the SQLAlchemy and Alembic integration (contrib/sqlalchemy,
-- contrib/alembic). Blocks with {placeholders} are composed with psycopg.sql: the compiled
-- truth and pending queries of a counter, identifiers and literals quoted by psycopg, and,
-- in exact(), the key column as SQLAlchemy compiled it.

-- name: target_of
-- the id of a counter's target, by its name (a scalar subquery)
(SELECT t.id FROM pgcounters.targets AS t WHERE t.name = {name});

-- name: exact_pending
-- exact(): the pending deltas (in units) of one key ({key_text}) of a counter in one queue
coalesce((SELECT sum(q.delta) FROM pgcounters.{queue} AS q
           WHERE q.target_id = {target} AND q.key = ({key_text})::text), 0);

-- name: exact_units
-- exact(): stored + pending of a counter column in units; while the counter is backfilled,
-- a key beyond the backfill's cursor is counted from the source table (one snapshot)
(CASE WHEN NOT EXISTS (SELECT 1 FROM pgcounters.backfills AS b WHERE b.name = {name})
        OR {key} <= (SELECT (b.cursor_key[1])::{key_type} FROM pgcounters.backfills AS b
                      WHERE b.name = {name})
      THEN {stored} + {pending} + {pending_unlogged}
      ELSE (SELECT coalesce(sum(k.delta), 0) FROM ({truth}) AS k) END);

-- name: lock_all_parent_rows
-- a backfill in a migration: lock every row of a counter column's table, in key order
SELECT count(*) FROM (SELECT 1 FROM {p} ORDER BY {k} FOR NO KEY UPDATE) AS locked;

-- name: backfill_column
-- a backfill in a migration: stored = truth - pending for every row of a counter column's
-- table, from one snapshot
WITH truth AS ({truth}), pending AS ({pending}),
wanted AS (
    SELECT x.{k} AS k, coalesce(t.delta, 0) - coalesce(p.delta, 0) AS value
      FROM {p} AS x
      LEFT JOIN truth AS t ON t.key = {text_key}
      LEFT JOIN pending AS p ON p.key = {text_key})
UPDATE {p} AS x SET {c} = {value} FROM wanted AS w
 WHERE x.{k} = w.k AND x.{c} IS DISTINCT FROM {value};

-- name: backfill_named_rows
-- a backfill in a migration: a row of value 0 for every key of a named counter that has
-- rows to count or pending deltas and no stored row yet
INSERT INTO pgcounters.counters (target_id, key, value)
SELECT {t}, k.key, 0 FROM (SELECT key FROM ({truth}) AS t UNION SELECT key FROM ({pending}) AS p) AS k
 ORDER BY 2
ON CONFLICT (target_id, key) DO NOTHING;

-- name: lock_named_rows
-- a backfill in a migration: lock every stored row of a named counter, in key order
SELECT count(*) FROM (SELECT 1 FROM pgcounters.counters WHERE target_id = {t}
                       ORDER BY key FOR UPDATE) AS locked;

-- name: backfill_named
-- a backfill in a migration: stored = truth - pending for every stored row of a named
-- counter, from one snapshot
WITH truth AS ({truth}), pending AS ({pending}),
wanted AS (
    SELECT c.key, coalesce(t.delta, 0) - coalesce(p.delta, 0) AS value
      FROM pgcounters.counters AS c
      LEFT JOIN truth AS t ON t.key = c.key LEFT JOIN pending AS p ON p.key = c.key
     WHERE c.target_id = {t})
UPDATE pgcounters.counters AS c SET value = w.value FROM wanted AS w
 WHERE c.target_id = {t} AND c.key = w.key AND c.value <> w.value;
