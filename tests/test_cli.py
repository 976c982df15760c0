from __future__ import annotations

import pytest

from pgcounters import cli

pytestmark = pytest.mark.fast


def run(capsys: pytest.CaptureFixture[str], dsn: str, *args: str) -> tuple[int, str, str]:
    code = cli.run(["--dsn", dsn, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_commands_end_to_end(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, dsn, "install")[1].startswith("the pgcounters schema is already installed")
    assert run(capsys, dsn, "version")[0] == 0
    assert run(capsys, dsn, "create", "views", "--key", "bigint", "--key", "date")[0] == 0
    assert run(capsys, dsn, "create", "total")[0] == 0
    assert run(capsys, dsn, "create", "bal", "--key", "text", "--mode", "direct")[0] == 0
    assert run(capsys, dsn, "incr", "views", "7,2026-11-21", "--delta", "3")[0] == 0
    assert run(capsys, dsn, "incr", "total")[0] == 0
    assert run(capsys, dsn, "incr", "bal", "alice", "--delta", "5")[1].strip() == "5"
    assert run(capsys, dsn, "get", "views", "7,2026-11-21")[1].strip() == "3"
    assert run(capsys, dsn, "get", "views", "7,2026-11-21", "--stored")[1].strip() == "0"
    code, out, _ = run(capsys, dsn, "drain")
    assert code == 0
    assert out.startswith("applied 2 deltas to 2 keys")
    assert run(capsys, dsn, "top", "views")[1] == "7,2026-11-21\t3\n"
    assert "views" in run(capsys, dsn, "list")[1]
    assert run(capsys, dsn, "drop", "views")[0] == 0
    assert run(capsys, dsn, "drop", "views")[0] == 1


def test_drain_with_a_bound_reports_what_is_left(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, dsn, "create", "c", "--key", "bigint")
    for k in range(5):
        run(capsys, dsn, "incr", "c", str(k))
    code, out, _ = run(
        capsys, dsn, "drain", "--batch-size", "2", "--max-batch-size", "2", "--max-batches", "1"
    )
    assert code == cli.EXIT_MORE
    assert "3 still queued" in out
    assert run(capsys, dsn, "drain", "--max-batches", "10")[0] == 0


def test_errors_are_one_line_and_exit_1(
    dsn: str, empty_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, dsn, "incr", "missing")
    assert code == 1
    assert "no counter named 'missing'" in err
    code, _, err = run(capsys, dsn, "create", "x", "--key", "bigint")
    code, _, err = run(capsys, dsn, "incr", "x", "abc")
    assert (code, "not a valid bigint" in err) == (1, True)
    code, _, err = run(capsys, empty_dsn, "get", "x")
    assert (code, "pgcounters install" in err) == (1, True)
    code, _, err = run(capsys, "host=127.0.0.1 port=1 connect_timeout=2", "version")
    assert (code, "could not connect" in err) == (1, True)


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.run(["create"])
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("args", "verb", "message"),
    [
        (["incr", "views", "1", "--bogus"], "incr", "unrecognized arguments: --bogus"),
        (["quota", "call", "api", "s", "--bogus"], "quota call", "unrecognized arguments"),
        (["drain", "extra"], "drain", "unrecognized arguments: extra"),
        (["drain", "--statement-timeout", "3000000"], "drain", "at most 2147483 seconds"),
        (["worker", "--statement-timeout", "1e12"], "worker", "at most 2147483 seconds"),
    ],
)
def test_a_verbs_usage_error_names_the_verb_before_any_connection(
    capsys: pytest.CaptureFixture[str], args: list[str], verb: str, message: str
) -> None:
    with pytest.raises(SystemExit) as info:  # port 1: nothing is opened
        cli.run(["--dsn", "host=127.0.0.1 port=1 connect_timeout=2", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pgcounters {verb}: error: ")
    assert message in err
    assert err.endswith(f"(see `pgcounters {verb} --help`)\n")
    assert err.count("\n") == 1


def test_a_failed_connection_says_why_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "host=127.0.0.1 port=1 connect_timeout=2", "list")
    assert code == 1
    assert err.count("\n") == 1
    assert "Connection refused" in err  # the reason, not only libpq's hint
    code, _, err = run(capsys, "not a dsn", "list")
    assert code == 1
    assert err.startswith("pgcounters: error: invalid DSN 'not a dsn': ")
    assert err.count("\n") == 1


def test_a_wakeup_interval_under_a_millisecond_is_refused(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # a usage error, before any connection, as for an interval of 0 (exit 2)
    with pytest.raises(SystemExit) as usage:
        run(capsys, dsn, "wakeup", "on", "--interval", "0.0001")
    assert usage.value.code == cli.EXIT_USAGE
    assert "--interval must be between 1 ms and 1 hour, got 0.0001 seconds" in (
        capsys.readouterr().err
    )
    assert run(capsys, dsn, "wakeup", "show")[1].startswith("wake-ups are off")


def test_version_says_when_the_schema_is_not_installed(
    empty_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, empty_dsn, "version")
    assert code == 1
    assert "schema not installed, expected" in out
    assert "None" not in out
