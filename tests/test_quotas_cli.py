from __future__ import annotations

import json

import pytest

from pgcounters import cli


def run(capsys: pytest.CaptureFixture[str], dsn: str, *args: str) -> tuple[int, str, str]:
    code = cli.run(["--dsn", dsn, "quota", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_quota_commands_end_to_end(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, dsn, "define", "api", "--limit", "2", "--time-zone", "Europe/Berlin")
    assert (code, out) == (0, "api: window day in Europe/Berlin, default limit 2\n")
    assert run(capsys, dsn, "define", "per-min", "--window", "minute", "--log")[0] == 0
    code, out, _ = run(capsys, dsn, "list", "--json")
    assert [q["name"] for q in json.loads(out)] == ["api", "per-min"]
    assert json.loads(out)[1] == {
        "name": "per-min",
        "window": "60s",
        "time_zone": "UTC",
        "default_limit": None,
        "log": True,
    }

    code, out, _ = run(
        capsys, dsn, "limit", "api", "acme", "3", "--from", "2025-10-01", "--until", "2025-11-01"
    )
    assert code == 0
    assert out.startswith("limit ")
    assert "[2025-10-01T00:00:00+00:00, 2025-11-01T00:00:00+00:00)" in out

    at = "2025-10-26T12:00:00+01:00"
    codes = [run(capsys, dsn, "call", "api", "acme", "--at", at)[0] for _ in range(4)]
    assert codes == [0, 0, 0, cli.EXIT_REFUSED]
    code, out, _ = run(capsys, dsn, "call", "api", "acme", "--at", at, "--json")
    result = json.loads(out)
    assert code == cli.EXIT_REFUSED
    assert result == {
        "allowed": False,
        "used": 3,
        "attempts": 5,
        "limit": 3,
        "remaining": 0,
        "window_start": "2025-10-25T22:00:00+00:00",
        "window_end": "2025-10-26T23:00:00+00:00",
        "retry_after": 12 * 3600.0,
    }
    code, out, _ = run(capsys, dsn, "status", "api", "acme", "--at", at)
    assert out.startswith("used 3/3, 5 attempts, 2 refused")

    code, out, _ = run(capsys, dsn, "report", "api", "--rejected", "--json")
    assert [(r["subject"], r["rejected"]) for r in json.loads(out)] == [("acme", 2)]
    code, out, _ = run(capsys, dsn, "report", "api", "--top", "5")
    assert out.splitlines() == ["subject\trejected\tattempts\twindows", "acme\t2\t5\t1"]

    # per-min has no default limit: refused, and logged with the details given
    code, out, _ = run(capsys, dsn, "call", "per-min", "x", "--details", '{"path": "/v1"}')
    assert (code, out.startswith("refused: used 0/0")) == (cli.EXIT_REFUSED, True)

    code, out, _ = run(capsys, dsn, "limits", "api", "--json")
    limits = json.loads(out)
    assert [(x["subject"], x["limit"]) for x in limits] == [("acme", 3)]
    assert run(capsys, dsn, "unlimit", "api", "acme", "--id", str(limits[0]["id"]))[0] == 0
    assert run(capsys, dsn, "unlimit", "api", "acme")[0] == 1

    code, out, _ = run(capsys, dsn, "purge", "--before", "2025-10-27T00:00:00+01:00")
    assert (code, out.startswith("removed 1 window(s)")) == (0, True)
    code, out, _ = run(capsys, dsn, "purge", "--older-than", "1d", "--quota", "per-min")
    assert (code, "and 0 log row(s)" in out) == (0, True)
    assert run(capsys, dsn, "drop", "per-min")[0] == 0
    assert run(capsys, dsn, "drop", "per-min")[0] == 1


def test_quota_errors_are_one_line(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, dsn, "call", "missing", "s")
    assert (code, err) == (1, "pgcounters: error: unknown quota 'missing'\n")
    run(capsys, dsn, "define", "q", "--limit", "5")
    with pytest.raises(SystemExit) as usage:
        run(capsys, dsn, "define", "q", "--limit", "0")
    assert (usage.value.code, "positive" in capsys.readouterr().err) == (cli.EXIT_USAGE, True)
    code, _, err = run(capsys, dsn, "define", "q", "--window", "hour")
    assert (code, "another window" in err) == (1, True)
    code, _, err = run(capsys, dsn, "call", "q", " ")
    assert (code, "non-blank" in err) == (1, True)
    with pytest.raises(SystemExit) as usage:
        run(capsys, dsn, "call", "q", "s", "--cost", "0")
    err = capsys.readouterr().err
    assert (usage.value.code, "positive integer" in err) == (cli.EXIT_USAGE, True)
    run(capsys, dsn, "limit", "q", "s", "3")
    code, _, err = run(capsys, dsn, "limit", "q", "s", "4", "--from", "2030-01-01")
    assert (code, "overlaps" in err) == (1, True)
    with pytest.raises(SystemExit) as usage:
        run(capsys, dsn, "purge", "--older-than", "week")
    assert (usage.value.code, "duration" in capsys.readouterr().err) == (cli.EXIT_USAGE, True)
    with pytest.raises(SystemExit) as usage:
        run(capsys, dsn, "call", "q", "s", "--at", "yesterday")
    assert usage.value.code == cli.EXIT_USAGE
