-- Statements of the `range-read` benchmark: comments counted per article per day (a
-- counter per period) beside a plain counter per article; values are parameters.

-- name: drop_table
DROP TABLE IF EXISTS public.bench_range_comment;

-- name: create_table
CREATE TABLE public.bench_range_comment (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    article_id bigint NOT NULL,
    created_at timestamptz NOT NULL
);

-- name: insert_comments
-- %(per_day)s comments a day for each of %(articles)s articles over the %(days)s days
-- before %(until)s (noon in Paris)
INSERT INTO public.bench_range_comment (article_id, created_at)
SELECT a, (%(until)s::date - d)::timestamp AT TIME ZONE 'Europe/Paris' + interval '12 hours'
  FROM generate_series(1, %(articles)s::integer) AS a,
       generate_series(1, %(days)s::integer) AS d,
       generate_series(1, %(per_day)s::integer) AS n;

-- name: truth
-- the comments of one article over a range of days in Paris
SELECT count(*) FROM public.bench_range_comment
 WHERE article_id = %(article)s
   AND created_at >= %(first)s::timestamp AT TIME ZONE 'Europe/Paris'
   AND created_at < %(last)s::timestamp AT TIME ZONE 'Europe/Paris';

-- name: analyze
-- fresh statistics of the tables read, as autovacuum keeps them on a running database
ANALYZE pgcounters.counters, pgcounters.queue, public.bench_range_comment;
