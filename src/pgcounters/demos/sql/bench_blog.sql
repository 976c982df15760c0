-- Statements of the blog benchmarks (`trigger-overhead`, `top-n`, `exact-read`), run on
-- the reference blog of reference_blog.sql. {comments} is one of its comment tables, filled in by
-- the benchmark with psycopg.sql.Identifier; values are parameters.

-- name: create_users
INSERT INTO reference_blog.blog_user (username)
SELECT 'user ' || g FROM generate_series(1, %(n)s::integer) AS g;

-- name: create_articles
INSERT INTO reference_blog.blog_article (content)
SELECT 'article ' || g FROM generate_series(1, %(n)s::integer) AS g;

-- name: add_foreign_keys
-- The comment table's foreign keys as Django declares them (checked at COMMIT, per row).
ALTER TABLE {comments}
    ADD FOREIGN KEY (creator_id) REFERENCES reference_blog.blog_user (id) DEFERRABLE INITIALLY DEFERRED,
    ADD FOREIGN KEY (article_id) REFERENCES reference_blog.blog_article (id)
        DEFERRABLE INITIALLY DEFERRED;

-- name: insert_comments
-- A bulk insert of comments numbered first..last, spread evenly over the users and the
-- articles by multiplicative hashing; two comments in three are public.
INSERT INTO {comments} (creator_id, article_id, message, publish_status)
SELECT 1 + (g * 7919) %% %(users)s,
       1 + (g * 104729) %% %(articles)s,
       'comment ' || g,
       CASE WHEN g %% 3 = 0 THEN 'private' ELSE 'public' END
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g;

-- name: insert_skewed_comments
-- The same with the articles skewed (a few articles get most comments), so that the
-- top 10 stands out from the rest.
INSERT INTO {comments} (creator_id, article_id, message, publish_status)
SELECT 1 + (g * 7919) %% %(users)s,
       1 + floor(%(articles)s * power(((g * 2654435761) %% 1000003) / 1000003.0, 3))::bigint,
       'comment ' || g,
       CASE WHEN g %% 3 = 0 THEN 'private' ELSE 'public' END
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g;

-- name: insert_hot_comments
-- Public comments numbered first..last on the articles 1..hot, in turn.
INSERT INTO {comments} (creator_id, article_id, message, publish_status)
SELECT 1 + (g * 7919) %% %(users)s, 1 + g %% %(hot)s, 'comment ' || g, 'public'
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g;

-- name: enqueue_hot_deltas
-- One pending delta of +1 per comment of insert_hot_comments, as single-row inserts with
-- the counter's trigger leave them in the queue.
INSERT INTO pgcounters.queue (target_id, key, delta)
SELECT %(target)s, ARRAY[(1 + g %% %(hot)s)::text], 1
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g;

-- name: reset_article_counts
UPDATE reference_blog.blog_article SET total_public_comments = 0 WHERE total_public_comments <> 0;

-- name: reset_user_counts
UPDATE reference_blog.blog_user SET total_public_comments = 0 WHERE total_public_comments <> 0;

-- name: article_mismatches
-- Articles whose counter column differs from the public comments counted (the truth).
SELECT count(*)
  FROM reference_blog.blog_article AS a
  LEFT JOIN (SELECT article_id, count(*) AS n FROM {comments}
              WHERE publish_status = 'public' GROUP BY article_id) AS t
    ON t.article_id = a.id
 WHERE a.total_public_comments <> coalesce(t.n, 0);

-- name: user_mismatches
SELECT count(*)
  FROM reference_blog.blog_user AS u
  LEFT JOIN (SELECT creator_id, count(*) AS n FROM {comments}
              WHERE publish_status = 'public' GROUP BY creator_id) AS t
    ON t.creator_id = u.id
 WHERE u.total_public_comments <> coalesce(t.n, 0);

-- name: count_rows
SELECT count(*) FROM {comments};

-- name: reference_pending_tasks
SELECT count(*) FROM reference_blog.counting_task;

-- name: reference_process_tasks
SELECT reference_blog.counting_process_tasks(%(limit)s);

-- name: top_annotate
-- What Django runs for
--   Article.objects.annotate(n=Count("comments", filter=Q(comments__publish_status="public")))
--                  .order_by("-n", "pk")[:10]
-- (Django groups by the primary key only; the filter value is inlined here).
SELECT "blog_article"."id", "blog_article"."content", "blog_article"."total_public_comments",
       COUNT("blog_comment"."id") FILTER (WHERE "blog_comment"."publish_status" = 'public') AS "n"
  FROM "reference_blog"."blog_article"
  LEFT OUTER JOIN {comments} AS "blog_comment"
    ON ("blog_article"."id" = "blog_comment"."article_id")
 GROUP BY "blog_article"."id"
 ORDER BY 4 DESC, "blog_article"."id" ASC
 LIMIT %(n)s;

-- name: top_column_index
CREATE INDEX IF NOT EXISTS blog_article_top_public
    ON reference_blog.blog_article (total_public_comments DESC, id);

-- name: top_column
-- What Django runs for Article.objects.order_by("-total_public_comments", "pk")[:10]
SELECT "blog_article"."id", "blog_article"."content", "blog_article"."total_public_comments"
  FROM "reference_blog"."blog_article"
 ORDER BY "blog_article"."total_public_comments" DESC, "blog_article"."id" ASC
 LIMIT %(n)s;

-- name: count_public
-- The naive exact read: count the article's public comments.
SELECT count(*) FROM {comments} WHERE article_id = %(id)s AND publish_status = 'public';
