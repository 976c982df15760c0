-- Seed 003's own table (unread notifications per user), used by the redis-buffer
-- benchmark to run the seed's techniques next to pgcounters: a plain UPDATE per
-- increment, and the seed's Redis sorted set flushed key by key.
DROP TABLE IF EXISTS seed_unread_counts;
CREATE TABLE seed_unread_counts (
    user_id      integer PRIMARY KEY,
    unread_count bigint NOT NULL DEFAULT 0
);

