-- The reference technique's own table (unread notifications per user), used by the redis-buffer
-- benchmark to run the reference techniques next to pgcounters: a plain UPDATE per
-- increment, and the reference Redis sorted set flushed key by key.
DROP TABLE IF EXISTS reference_unread_counts;
CREATE TABLE reference_unread_counts (
    user_id      integer PRIMARY KEY,
    unread_count bigint NOT NULL DEFAULT 0
);

