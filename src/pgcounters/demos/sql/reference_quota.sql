-- The reference quota technique as published: a limits table with a tstzrange and an
-- exclusion constraint, a request log, a count table with FILLFACTOR=60 and the
-- register_call function (a CTE reads the limit, a CTE logs the request, one
-- upsert counts). The benchmark runs it next to pgcounters.register_call.
--
-- Only two things differ from the published text: the objects live in their own
-- schema "reference_quota" (so that nothing of an application's is dropped or shadowed),
-- and btree_gist is created only if it is not there yet.
DROP SCHEMA IF EXISTS reference_quota CASCADE;
CREATE SCHEMA reference_quota;

CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE reference_quota.t_customer
(
    id                    serial PRIMARY KEY,
    customer_email        text NOT NULL UNIQUE,
    login_whatever_else   text
);

CREATE TABLE reference_quota.t_customer_limit
(
    id                serial  PRIMARY KEY,
    customer_id       int     REFERENCES reference_quota.t_customer (id)
                              ON UPDATE CASCADE
                              ON DELETE SET NULL,
    clicks_per_day    int     CHECK (clicks_per_day > 0) NOT NULL,
    trange            tstzrange,
    EXCLUDE USING gist (trange WITH &&, customer_id WITH =)
);

CREATE INDEX idx_limit ON reference_quota.t_customer_limit(customer_id);

CREATE TABLE reference_quota.t_log
(
    id                  serial         PRIMARY KEY,
    tstamp              timestamptz    DEFAULT now() NOT NULL,
    customer_id         int            NOT NULL,
    http_referrer       inet,
    http_other_fields   text           NOT NULL,    -- put in more fields
    request_infos       jsonb                       -- what else we know from the request
);

CREATE INDEX idx_log ON reference_quota.t_log (tstamp, customer_id);

CREATE TABLE reference_quota.t_log_count
(
    customer_id           int REFERENCES reference_quota.t_customer (id)
                              ON UPDATE CASCADE
                              ON DELETE SET NULL,
    tdate                 date NOT NULL,
    counter_limit         int DEFAULT 0,
    counter_limit_real    int DEFAULT 0,
    UNIQUE (customer_id, tdate)
) WITH (FILLFACTOR=60);

CREATE INDEX idx_log_count ON reference_quota.t_log_count (tdate, customer_id);

-- The call is allowed when counter_limit = counter_limit_real in the returned row.
CREATE FUNCTION reference_quota.register_call(int)
   RETURNS reference_quota.t_log_count AS
$$
   WITH x AS (SELECT * FROM reference_quota.t_customer_limit WHERE now() <@ trange AND customer_id = $1),
        y AS (INSERT INTO reference_quota.t_log (customer_id, http_other_fields) VALUES ($1, 'whatever info') )
   INSERT INTO reference_quota.t_log_count (customer_id, tdate, counter_limit, counter_limit_real)
        VALUES ($1, now()::date, 1, 1)
        ON CONFLICT (customer_id, tdate)
        DO UPDATE
           SET counter_limit_real = t_log_count.counter_limit_real + 1,
               counter_limit = CASE WHEN t_log_count.counter_limit < (SELECT clicks_per_day FROM x)
                               THEN t_log_count.counter_limit + 1 ELSE t_log_count.counter_limit END

           WHERE EXCLUDED.customer_id = $1
                 AND EXCLUDED.tdate = now()::date
   RETURNING *;
$$ LANGUAGE 'sql';
