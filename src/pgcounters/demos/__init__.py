"""The demo and the benchmarks, on top of the library.

``pgcounters demo`` (:mod:`.demo`, then the blog under load in :mod:`.blog`),
``pgcounters bench`` (:mod:`.bench`, one module per group of scenarios), the
hot-counter workloads both run (:mod:`.workloads`), a Redis server for the
benchmarks and the tests (:mod:`.redis_server`), and their SQL (``demos/sql``,
read by :mod:`.sqlfiles`).

Nothing in the library imports this package: the CLI imports it inside its
``demo`` and ``bench`` commands only, so ``import pgcounters`` never loads it.
"""
