"""The worker's log: each line once when the program configured the ``pgcounters``
logger (Django's LOGGING), retried batches as WARNINGs, and malformed input to
incr_many as a PgCountersError."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from pgcounters import Counters
from pgcounters.cli import configure_worker_logging
from pgcounters.errors import PgCountersError


@pytest.fixture
def clean_logging() -> Iterator[None]:
    root = logging.getLogger()
    pkg = logging.getLogger("pgcounters")
    saved = (list(root.handlers), root.level, list(pkg.handlers), pkg.level, pkg.propagate)
    try:
        yield
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        pkg.handlers[:], pkg.level, pkg.propagate = saved[2], saved[3], saved[4]


@pytest.mark.usefixtures("clean_logging")
def test_a_configured_pgcounters_logger_prints_each_line_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As Django's dictConfig does for LOGGING = {"loggers": {"pgcounters": ...}}: a handler
    on the pgcounters logger, propagating to the root. The worker command used to add a
    root handler as well: every line came out twice."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    pkg = logging.getLogger("pgcounters")
    pkg.addHandler(handler)
    pkg.setLevel(logging.INFO)
    logging.getLogger().handlers.clear()
    configure_worker_logging("info")
    logging.getLogger("pgcounters.worker").info("worker starting: once")
    assert stream.getvalue().count("worker starting: once") == 1
    assert "worker starting: once" not in capsys.readouterr().err


@pytest.mark.usefixtures("clean_logging")
def test_without_configuration_the_worker_logs_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logging.getLogger().handlers.clear()
    logging.getLogger("pgcounters").handlers.clear()
    configure_worker_logging("warning")
    logging.getLogger("pgcounters.worker").warning("a retried batch")
    logging.getLogger("pgcounters.worker").info("not shown")
    err = capsys.readouterr().err
    assert err.count("a retried batch") == 1
    assert "not shown" not in err


@pytest.mark.parametrize("item", [("c", 1), ("c",), "c", 7, None, ("c", 1, 1, 1)])
def test_incr_many_with_a_malformed_item_raises_a_pgcounters_error(
    pc: Counters, item: object
) -> None:
    pc.create_counter("c", key=int)
    with pytest.raises(PgCountersError, match="tuples"):
        pc.incr_many([("c", 1, 1), item])  # type: ignore[list-item]
    assert pc.pending() == (0, 0)
