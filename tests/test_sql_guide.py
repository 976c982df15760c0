"""docs/sql.md, run block by block on a fresh database: the ``sh`` blocks as shell commands
(``pgcounters`` and ``psql`` on the PATH, the PG* variables naming the database), the
``sql`` blocks through psql, whose output must be the ``text`` block that follows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from test_sql_interface import _psql

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "sql.md"

_ENV_OF = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "dbname": "PGDATABASE",
           "password": "PGPASSWORD"}  # fmt: skip


def _blocks() -> list[tuple[str, str]]:
    text = GUIDE.read_text(encoding="utf-8")
    return re.findall(r"^```(\w+)\n(.*?)^```", text, re.S | re.M)


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def test_sql_guide_runs_and_prints_what_it_says(empty_dsn: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.pop("DATABASE_URL", None)
    for key, value in conninfo_to_dict(empty_dsn).items():
        if key in _ENV_OF:
            env[_ENV_OF[key]] = str(value)
    psql_dir = str(Path(_psql()).parent)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), psql_dir, env["PATH"]])
    blocks = _blocks()
    ran = {"sh": 0, "sql": 0}
    for index, (language, body) in enumerate(blocks):
        if language == "sh":
            for line in body.strip().splitlines():
                done = subprocess.run(line, shell=True, env=env, cwd=tmp_path, check=False,
                                      capture_output=True, text=True, timeout=300)  # fmt: skip
                assert done.returncode == 0, f"{line}: {done.stderr}"
            ran["sh"] += 1
        elif language == "sql":
            script = tmp_path / f"block{index}.sql"
            script.write_text(body, encoding="utf-8")
            done = subprocess.run(
                ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script)],
                env=env, cwd=tmp_path, check=False, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 0, f"{body}: {done.stderr}"
            following = blocks[index + 1] if index + 1 < len(blocks) else ("", "")
            assert following[0] == "text", f"the sql block {body!r} shows no output"
            assert _lines(done.stdout) == _lines(following[1]), done.stdout
            ran["sql"] += 1
        else:
            assert language == "text", f"a {language} block: the test runs sh and sql only"
    assert ran["sh"] == 2
    assert ran["sql"] >= 5
    assert (tmp_path / "pgcounters-upgrade-15.sql").read_text(encoding="utf-8").count("COMMIT;")
