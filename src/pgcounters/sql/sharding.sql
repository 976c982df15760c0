-- Named statements of install_proxy (sharding.py), run on the proxy database
-- before and after sql/plproxy.sql. Each block starts with "-- name: NAME" and a
-- one-line description; {cluster} and {schema} are the cluster's and the proxy
-- schema's names, {options} the shards' connection strings (quoted by psycopg).

-- name: plproxy_available
-- whether the server has the PL/Proxy extension to install
SELECT count(*) FROM pg_available_extensions WHERE name = 'plproxy';

-- name: create_plproxy
-- the PL/Proxy extension
CREATE EXTENSION IF NOT EXISTS plproxy;

-- name: drop_cluster
-- forget the shards of a previous install
DROP SERVER IF EXISTS {cluster} CASCADE;

-- name: create_cluster
-- the cluster: a foreign server whose options p0, p1, ... are the shards' connection strings
CREATE SERVER {cluster} FOREIGN DATA WRAPPER plproxy OPTIONS ({options});

-- name: create_user_mapping
-- every role reaches the shards with the connection strings as given
CREATE USER MAPPING FOR PUBLIC SERVER {cluster};

-- name: clear_settings
-- forget the number of partitions of a previous install
DELETE FROM {schema}.settings;

-- name: set_partitions
-- the number of shards, for routing
INSERT INTO {schema}.settings (partitions) VALUES (%s);

-- name: clear_key_types
-- forget the key types the proxy learnt from the shards
TRUNCATE {schema}.key_types;
