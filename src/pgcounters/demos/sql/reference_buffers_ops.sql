-- The statements of the redis-buffer benchmark on reference_buffers.sql's table.

-- name: reference_unread_rows
INSERT INTO reference_unread_counts (user_id) SELECT generate_series(0, %(keys)s - 1);

-- name: reference_unread_incr
UPDATE reference_unread_counts SET unread_count = unread_count + %s WHERE user_id = %s;

-- name: reference_unread_values
SELECT user_id, unread_count FROM reference_unread_counts WHERE unread_count <> 0;
