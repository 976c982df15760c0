-- The reference drains, for the `drain` benchmark (run after reference_queue.sql).

-- depesz's queue drain, as published but for its name: take the id range
-- [min(id), min(id) + p_limit] of the queue, delete it, sum per counter and
-- UPDATE the counters. Not safe with two drainers at once (both take the same
-- range: one waits for the other, and the reference UPDATE-only merge drops the
-- deltas of counters that have no row yet).
CREATE OR REPLACE FUNCTION reference_apply_counter_queue(IN p_limit INT4 DEFAULT 1000) RETURNS INT8 AS $$
WITH id_range AS (
    SELECT MIN(id) AS min_id, MIN(id) + p_limit AS max_id FROM reference_queue
), deleted_rows AS (
    DELETE FROM reference_queue WHERE id BETWEEN (SELECT min_id FROM id_range) AND (SELECT max_id FROM id_range) returning *
), summarized_change AS (
    SELECT counter_name, SUM(value_change) FROM deleted_rows GROUP BY counter_name HAVING SUM(value_change) <> 0
), update_counters AS (
    UPDATE reference_counters AS c SET current_value = c.current_value + s.sum FROM summarized_change s WHERE c.counter_name = s.counter_name returning c.counter_name
)
SELECT COUNT(*) FROM update_counters;
$$ LANGUAGE 'sql';

-- The reference BETWEEN claim on pgcounters' own queue, with pgcounters' sum per
-- (target, key) and upsert: the same data and the same apply step as
-- pgcounters.drain_batch, so that the two differ only in the claim.
CREATE OR REPLACE FUNCTION reference_between_drain_batch(p_limit integer) RETURNS bigint AS $$
WITH claimed AS (
    DELETE FROM pgcounters.queue AS q
     WHERE q.id BETWEEN (SELECT min(id) FROM pgcounters.queue)
                    AND (SELECT min(id) FROM pgcounters.queue) + p_limit - 1
    RETURNING q.target_id, q.key, q.delta
), summed AS (
    SELECT target_id, key::text[] AS key, sum(delta) AS delta, count(*) AS n
      FROM claimed
     GROUP BY target_id, claimed.key
), named AS (
    INSERT INTO pgcounters.counters AS k (target_id, key, value)
    SELECT s.target_id, s.key, s.delta
      FROM summed s
      JOIN pgcounters.targets t ON t.id = s.target_id AND t.target_table IS NULL
     WHERE s.delta <> 0
     ORDER BY s.target_id, s.key
    ON CONFLICT (target_id, key) DO UPDATE SET value = k.value + excluded.value
    RETURNING 1
)
SELECT coalesce(sum(s.n), 0)::bigint FROM summed s;  -- "named" runs whether read or not
$$ LANGUAGE sql;
