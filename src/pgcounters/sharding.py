"""Counters and quotas sharded over several PostgreSQL servers through PL/Proxy.

Every shard is an ordinary pgcounters database (``pgcounters install``). A
proxy database, with the PL/Proxy extension, gets the functions of
``sql/plproxy.sql`` in the schema ``pgcounters_proxy``: ``incr``, ``get``,
``get_many``, ``top`` (merged over the shards), ``incr_many`` (one shard only),
``register_call``, ``quota_status``, ``set_limit`` (routed by subject),
``create_counter``, ``drop_counter``, ``define_quota`` (on every shard) and
``drain`` (every shard). Applications call them on the proxy, in SQL. See
docs/scale-out.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from pgcounters import sqlfiles
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import ConfigurationError

CLUSTER = "pgcounters_shards"
SCHEMA = "pgcounters_proxy"


def _sql(name: str) -> str:
    """A named statement of ``sql/sharding.sql``."""
    return sqlfiles.named("sharding.sql")[name]


def _composed(name: str, **parts: sql.Composable) -> sql.Composed:
    """A named statement of ``sql/sharding.sql`` with the cluster's and schema's names."""
    return sql.SQL(_sql(name)).format(
        cluster=sql.Identifier(CLUSTER), schema=sql.Identifier(SCHEMA), **parts
    )


def install_proxy(conn: Conn, shards: Sequence[str]) -> None:
    """Install (or reinstall with new shards) the proxy functions on ``conn``'s database.

    ``shards``: the shards' connection strings, as the proxy server reaches them
    (PL/Proxy connects with them as given: put the user, and a password if one is
    needed, in them). PL/Proxy needs a power of two of them; the same server may
    be listed more than once. Runs in one transaction.
    """
    count = len(shards)
    if count == 0 or count & (count - 1):
        raise ConfigurationError(
            f"PL/Proxy needs a power of two of shards (1, 2, 4, ...), got {count}; "
            "a server may be listed more than once"
        )
    if any(not isinstance(dsn, str) or not dsn.strip() for dsn in shards):
        raise ConfigurationError("every shard needs a connection string")
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ConfigurationError("install_proxy must run outside a transaction")
    options = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(f"p{i}"), sql.Literal(dsn))
        for i, dsn in enumerate(shards)
    )
    with translated(), conn.transaction(), conn.cursor() as cur:
        available = cur.execute(_sql("plproxy_available")).fetchone()
        if not available or not available[0]:
            raise ConfigurationError(
                "PL/Proxy is not installed on the proxy's server: install it "
                "(Debian: apt-get install postgresql-NN-plproxy)"
            )
        cur.execute(_sql("create_plproxy"))
        cur.execute(_composed("drop_cluster"))
        cur.execute(_composed("create_cluster", options=options))
        cur.execute(_composed("create_user_mapping"))
        cur.execute(sqlfiles.read("plproxy.sql").encode())
        cur.execute(_composed("clear_settings"))
        cur.execute(_composed("set_partitions"), (count,))
        cur.execute(_composed("clear_key_types"))
