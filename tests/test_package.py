"""The package as users get it: an sdist and a wheel built from the checkout, checked by
twine, the wheel holding every file of the package, and installed (not the checkout) in a
clean virtual environment where `pgcounters install` and the README's quickstart run."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import psycopg
import pytest

from pgcounters import Counters
from test_readme import _quickstart_lines

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

pytestmark = pytest.mark.slow


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PGCOUNTERS_DSN")}
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{args}: {proc.stdout}\n{proc.stderr}"
    return proc


def _one(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def test_the_wheel_holds_every_file_and_runs_from_a_clean_environment(
    tmp_path: Path, empty_dsn: str
) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", dist, ROOT, cwd=tmp_path)
    wheel, sdist = _one(dist, "*.whl"), _one(dist, "*.tar.gz")
    _run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=tmp_path)
    # every file of the package's source tree is in the wheel (SQL, templates, py.typed...)
    package = SRC / "pgcounters"
    expected = {
        p.relative_to(SRC).as_posix()
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert expected - set(zipfile.ZipFile(wheel).namelist()) == set()
    # installed alone, away from the checkout
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    _run(bin_dir / "python", "-m", "pip", "install", "--quiet", wheel, cwd=tmp_path)
    where = _run(bin_dir / "python", "-c", "import pgcounters; print(pgcounters.__file__)",
                 cwd=tmp_path).stdout  # fmt: skip
    assert where.startswith(str(env_dir))
    _run(bin_dir / "pgcounters", "--dsn", empty_dsn, "install", cwd=tmp_path)
    code = "\n".join(line.replace('"dbname=app"', repr(empty_dsn)) for line in _quickstart_lines())
    _run(bin_dir / "python", "-c", code, cwd=tmp_path)
    # what the quickstart wrote, read here: 3 at key 42, 1 at key 7, all drained
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        pc = Counters(conn)
        assert pc.get_many("article.views", [42, 7], exact=False) == [3, 1]
        assert pc.pending() == (0, 0)
