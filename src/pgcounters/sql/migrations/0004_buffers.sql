-- pgcounters schema, version 4: flushes of application-side increment buffers.
--
-- The batching incrementer (pgcounters/batching.py) and the Redis write-behind
-- buffer (pgcounters/redis_buffer.py) write their buffered increments in one
-- transaction that also records a flush id here. A flush whose outcome is in
-- doubt (its writer died, or the connection broke during COMMIT) is looked up
-- by id before it is written again, so it is never counted twice . Rows are pruned by age, never while their flush may still be in
-- doubt.

CREATE TABLE pgcounters.buffer_flushes (
    flush_id   text PRIMARY KEY
               CONSTRAINT buffer_flushes_id_format CHECK (flush_id ~ '^[0-9a-f]{32}$'),
    buffer     text NOT NULL
               CONSTRAINT buffer_flushes_buffer_format
               CHECK (buffer ~ '^[A-Za-z0-9_.:/-]{1,200}$'),
    keys       integer NOT NULL,
    total      numeric NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- pruning by age, per buffer
CREATE INDEX buffer_flushes_age ON pgcounters.buffer_flushes (buffer, applied_at);

-- Record flush p_flush_id of buffer p_buffer in the caller's transaction, which
-- then writes the flush's deltas and commits both together.
--
-- Returns true when the flush is new: the caller writes its deltas. Returns
-- false when this flush was already recorded (committed by an earlier attempt):
-- the caller must not write the deltas again. A concurrent attempt at the same
-- flush waits here on the primary key until the first one commits or rolls back.
--
-- Rows of this buffer older than p_retention are pruned, except the ids in
-- p_keep (flushes still in doubt, which a later attempt will look up). A
-- recorded flush that is attempted again is touched (applied_at = now()) so
-- it outlives its own resolution.
CREATE FUNCTION pgcounters.record_flush(
    p_flush_id text,
    p_buffer text,
    p_keys integer,
    p_total numeric,
    p_retention interval DEFAULT '1 day',
    p_keep text[] DEFAULT '{}'
) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgcounters.buffer_flushes (flush_id, buffer, keys, total)
    VALUES (p_flush_id, p_buffer, p_keys, p_total)
    ON CONFLICT (flush_id) DO NOTHING;
    IF NOT FOUND THEN
        UPDATE pgcounters.buffer_flushes SET applied_at = now() WHERE flush_id = p_flush_id;
        RETURN false;
    END IF;
    DELETE FROM pgcounters.buffer_flushes
     WHERE buffer = p_buffer
       AND applied_at < now() - p_retention
       AND flush_id <> ALL (coalesce(p_keep, '{}'));
    RETURN true;
END;
$$;
