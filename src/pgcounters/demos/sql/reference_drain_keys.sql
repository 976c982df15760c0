-- The parent table of the `drain-keys` benchmark's counter column, and its
-- textbook drain: the reference BETWEEN claim on pgcounters'
-- queue, one sum per key, one UPDATE of the parent rows. It waits on any row
-- an application holds and is not safe beside a second drainer; pgcounters'
-- column drain does neither, which is what the comparison prices.
CREATE TABLE IF NOT EXISTS bench_keys_parent (
    id bigint PRIMARY KEY,
    n  bigint NOT NULL DEFAULT 0
);

CREATE OR REPLACE FUNCTION reference_between_drain_column(p_limit integer) RETURNS bigint AS $$
WITH claimed AS (
    DELETE FROM pgcounters.queue AS q
     WHERE q.id BETWEEN (SELECT min(id) FROM pgcounters.queue)
                    AND (SELECT min(id) FROM pgcounters.queue) + p_limit - 1
    RETURNING q.key, q.delta
), summed AS (
    SELECT (c.key::text[])[1]::bigint AS id, sum(c.delta) AS delta
      FROM claimed AS c
     GROUP BY 1
), applied AS (
    UPDATE bench_keys_parent AS p SET n = p.n + s.delta
      FROM summed AS s
     WHERE p.id = s.id
    RETURNING 1
)
SELECT count(*) FROM applied;
$$ LANGUAGE sql;

-- top-N of a named counter as it was ranked before rank bands: by the value,
-- through an index on (target_id, value DESC) when the benchmark creates one,
-- else by a sort of every row of the counter
CREATE OR REPLACE FUNCTION reference_top_by_value(p_target integer, p_n integer)
RETURNS TABLE (key text[], value bigint) AS $$
    SELECT c.key, c.value FROM pgcounters.counters AS c
     WHERE c.target_id = p_target
     ORDER BY c.value DESC, c.key
     LIMIT p_n
$$ LANGUAGE sql STABLE;
