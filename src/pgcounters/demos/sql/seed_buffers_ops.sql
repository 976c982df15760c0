-- The statements of the redis-buffer benchmark on seed_buffers.sql's table.

-- name: seed_unread_rows
INSERT INTO seed_unread_counts (user_id) SELECT generate_series(0, %(keys)s - 1);

-- name: seed_unread_incr
UPDATE seed_unread_counts SET unread_count = unread_count + %s WHERE user_id = %s;

-- name: seed_unread_values
SELECT user_id, unread_count FROM seed_unread_counts WHERE unread_count <> 0;
