-- Named SQL of the Django layer (contrib/django). Each block starts with
-- "-- name: NAME" and a one-line description. The blocks run through Django's
-- cursor or inside SQL Django compiles: values are %s / %(name)s parameters;
-- {placeholders} are filled with Django's own compiled SQL (str.format).

-- name: exact_pending
-- Exact(): the pending deltas of one key in one queue ({queue}), the key being Django's compiled {key} column
coalesce((SELECT sum(q.delta) FROM pgcounters.{queue} AS q
           WHERE q.target_id = (SELECT t.id FROM pgcounters.targets AS t WHERE t.name = %s)
             AND q.key = ARRAY[({key})::text]::text), 0);

-- name: exact_pending_decimal
-- Exact() of a sum of decimals: the pending deltas (in units of 10^-{scale}) of one key as a decimal
pgcounters.unscaled(coalesce((SELECT sum(q.delta) FROM pgcounters.{queue} AS q
           WHERE q.target_id = (SELECT t.id FROM pgcounters.targets AS t WHERE t.name = %s)
             AND q.key = ARRAY[({key})::text]::text), 0), {scale});

-- name: backfill_lookup
-- Exact(): one value ({value}) of the counter's backfill row, NULL when it is not backfilled
(SELECT {value} FROM pgcounters.backfills AS b WHERE b.name = %s);

-- name: truth_of_key
-- Exact() of a key beyond a backfill's cursor: its truth, summed from the compiled truth query
SELECT coalesce(sum(k.delta), 0) FROM ({truth}) AS k;

-- name: truth_of_key_decimal
-- Exact() of a key of a sum of decimals beyond a backfill's cursor: its truth as a decimal
SELECT pgcounters.unscaled(coalesce(sum(k.delta), 0), {scale}) FROM ({truth}) AS k;

-- name: backfill_progress
-- the admin's counters page: the keys a backfill of the row's counter has done
SELECT b.keys_done FROM pgcounters.backfills AS b WHERE b.name = pgcounters.targets.name;

-- name: target_id
-- the id of a counter, by name
SELECT id FROM pgcounters.targets WHERE name = %s;

-- name: held
-- what pgcounters holds of one counter per key: stored values and pending deltas, summed
SELECT h.key, sum(h.value)::bigint FROM (
    SELECT key, value FROM pgcounters.counters WHERE target_id = %(t)s
    UNION ALL SELECT key::text[], delta FROM pgcounters.queue WHERE target_id = %(t)s
    UNION ALL SELECT key::text[], delta FROM pgcounters.queue_unlogged WHERE target_id = %(t)s
) AS h GROUP BY h.key;

-- name: first_period_kept
-- the key part (as text) of the first period a counter per period keeps: its period,
-- time zone and number of periods kept
SELECT pgcounters.bucket_text(%(period)s, %(zone)s,
                              pgcounters.bucket_horizon(%(period)s, %(zone)s, %(keep)s));

-- name: snapshot
-- the comparison of the ORM's truth with pgcounters reads one snapshot
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;
