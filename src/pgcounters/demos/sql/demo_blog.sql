-- The blog of `pgcounters demo`, in its own schema so
-- that each run starts from nothing. Counter columns start at 0; the demo's
-- counters (declared in pgcounters/demos/blog.py) keep them from the first row on.
DROP SCHEMA IF EXISTS demo_blog CASCADE;
CREATE SCHEMA demo_blog;

CREATE TABLE demo_blog.users (
    id                   bigserial PRIMARY KEY,
    username             text NOT NULL,
    -- public comments written by the user
    public_comments      bigint NOT NULL DEFAULT 0,
    -- the user's unread notifications
    unread_notifications bigint NOT NULL DEFAULT 0
);

CREATE TABLE demo_blog.articles (
    id              bigserial PRIMARY KEY,
    title           text NOT NULL,
    -- public comments on the article
    public_comments bigint NOT NULL DEFAULT 0
);
-- top-N articles by public comments reads this index, not the comments
CREATE INDEX ON demo_blog.articles (public_comments DESC);

CREATE TABLE demo_blog.comments (
    id             bigserial PRIMARY KEY,
    article_id     bigint REFERENCES demo_blog.articles,
    creator_id     bigint NOT NULL REFERENCES demo_blog.users,
    writer         integer NOT NULL,  -- the demo thread that owns the row
    publish_status text NOT NULL DEFAULT 'private'
        CHECK (publish_status IN ('public', 'private')),
    message        text NOT NULL DEFAULT ''
);
CREATE INDEX ON demo_blog.comments (article_id);
CREATE INDEX ON demo_blog.comments (creator_id);
CREATE INDEX ON demo_blog.comments (writer, id);

CREATE TABLE demo_blog.notifications (
    id      bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES demo_blog.users,
    message text NOT NULL DEFAULT '',
    is_read boolean NOT NULL DEFAULT false
);
CREATE INDEX ON demo_blog.notifications (user_id);
CREATE INDEX ON demo_blog.notifications (id) WHERE NOT is_read;
