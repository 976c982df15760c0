-- The statements of the demo's mixed load on the blog (demo_blog.sql).
-- Each comment writer works on its own rows (column `writer`), so the writers
-- never wait for each other's comment rows; they share articles and users,
-- which is where the counters are.

-- name: fill_users
INSERT INTO demo_blog.users (username)
SELECT 'user' || g FROM generate_series(1, %(n)s) AS g;

-- name: fill_articles
INSERT INTO demo_blog.articles (title)
SELECT 'article ' || g FROM generate_series(1, %(n)s) AS g;

-- name: fill_comments
INSERT INTO demo_blog.comments (article_id, creator_id, writer, publish_status)
SELECT 1 + (g * 7919) %% %(articles)s, 1 + (g * 104729) %% %(users)s, g %% %(writers)s,
       CASE WHEN g %% 3 = 0 THEN 'private' ELSE 'public' END
FROM generate_series(1, %(n)s) AS g;

-- name: add_comment
INSERT INTO demo_blog.comments (article_id, creator_id, writer, publish_status, message)
VALUES (%(article)s, %(user)s, %(writer)s, %(status)s, 'hello');

-- name: add_comments_bulk
INSERT INTO demo_blog.comments (article_id, creator_id, writer, publish_status)
SELECT 1 + floor(random() * %(articles)s)::bigint, 1 + floor(random() * %(users)s)::bigint,
       %(writer)s, CASE WHEN random() < 0.6 THEN 'public' ELSE 'private' END
FROM generate_series(1, %(n)s);

-- name: pick_comment
SELECT id FROM demo_blog.comments
WHERE writer = %(writer)s AND id >= %(from)s ORDER BY id LIMIT 1;

-- name: move_comment
UPDATE demo_blog.comments SET article_id = %(article)s WHERE id = %(id)s;

-- name: set_status
UPDATE demo_blog.comments SET publish_status = %(status)s WHERE id = %(id)s;

-- name: set_status_bulk
UPDATE demo_blog.comments SET publish_status = %(status)s
WHERE writer = %(writer)s AND id >= %(from)s::bigint AND id < %(from)s::bigint + %(span)s::bigint;

-- name: move_bulk
UPDATE demo_blog.comments SET article_id = %(article)s
WHERE writer = %(writer)s AND id >= %(from)s::bigint AND id < %(from)s::bigint + %(span)s::bigint;

-- name: delete_comment
DELETE FROM demo_blog.comments WHERE id = %(id)s;

-- name: delete_comments_bulk
DELETE FROM demo_blog.comments
WHERE writer = %(writer)s AND id >= %(from)s::bigint AND id < %(from)s::bigint + %(span)s::bigint;

-- name: id_range
SELECT coalesce(min(id), 0), coalesce(max(id), 0) FROM demo_blog.comments;

-- name: add_user
INSERT INTO demo_blog.users (username) VALUES ('newcomer') RETURNING id;

-- name: add_users_bulk
INSERT INTO demo_blog.users (username) SELECT 'newcomer' FROM generate_series(1, %(n)s);

-- name: delete_newcomer
-- newcomers (ids above the initial users) have no comments nor notifications
DELETE FROM demo_blog.users
WHERE id = (SELECT max(id) FROM demo_blog.users WHERE id > %(initial)s);

-- name: notify
INSERT INTO demo_blog.notifications (user_id, message) VALUES (%(user)s, 'news')
RETURNING id;

-- name: notify_bulk
INSERT INTO demo_blog.notifications (user_id, message)
SELECT 1 + floor(random() * %(users)s)::bigint, 'digest' FROM generate_series(1, %(n)s);

-- name: mark_read
-- "mark as read" from a request; only the statement that flips the row counts
UPDATE demo_blog.notifications SET is_read = true WHERE id = %(id)s AND NOT is_read;

-- name: delete_notification
DELETE FROM demo_blog.notifications WHERE id = %(id)s;

-- name: delete_read_notifications
DELETE FROM demo_blog.notifications
WHERE id IN (SELECT id FROM demo_blog.notifications WHERE is_read ORDER BY id LIMIT %(n)s);

-- name: pick_notification
SELECT id FROM demo_blog.notifications WHERE id >= %(from)s ORDER BY id LIMIT 1;

-- name: tamper
-- a hand edit that breaks a counter (the recount in the middle repairs it)
UPDATE demo_blog.articles SET public_comments = public_comments + %(by)s WHERE id = %(id)s;
