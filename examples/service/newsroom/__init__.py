"""newsroom: a FastAPI service whose counters pgcounters keeps (see the README beside it)."""
