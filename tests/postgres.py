"""A private PostgreSQL server for tests: ``initdb`` into a temporary directory, ``pg_ctl start`` on
127.0.0.1 at a free port, its socket in that directory, trust authentication for user ``postgres``.

``initdb`` refuses to run as root: as root, the directory is handed to the ``postgres`` system user
and every server command runs as it (``runuser -u postgres --``). The directory is made outside
pytest's temporary tree, whose top is private to the user running the tests. The server is stopped
and its directory removed at the end, also when a test fails; ``stop``/``start`` take it down and
bring it back on the same port (a test of a database outage). Each test gets its own database
(``records_database``).

Debian's package does not put ``initdb`` on PATH: the newest ``/usr/lib/postgresql/*/bin`` is used.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import psycopg
import pytest

from tests.ports import free_port

__all__ = ["PostgresServer", "postgres_server", "records_database"]

_START_TIMEOUT_S = 30
_STOP_TIMEOUT_S = 30
_PORT_TRIES = 5


def postgres_bin() -> Path | None:
    """The directory of the newest installed PostgreSQL's server programs, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresServer:
    """One private ``postgres`` on loopback; a context manager that stops it and removes its files."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.directory = Path(tempfile.mkdtemp(prefix="vcrawl-pg-"))
        self.data = self.directory / "data"
        self.port = 0
        self._as_postgres = os.geteuid() == 0

    def __enter__(self) -> PostgresServer:
        try:
            self._initdb()
            for _ in range(_PORT_TRIES):  # another process may take the port between the probe and the start
                self.port = free_port()
                if self.start(check=False):
                    return self
            raise RuntimeError(f"postgres did not start; log:\n{self.log()}")
        except BaseException:
            self.close()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        """A URL of ``database`` (trust authentication: a password given is accepted and not checked)."""
        secret = f":{password}" if password is not None else ""
        return f"postgresql://postgres{secret}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create the database ``name`` (dropped first if a run left it); return its URL."""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def start(self, check: bool = True) -> bool:
        """Start the server on ``self.port`` and wait until it takes connections; False if it did not."""
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        done = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.directory / "log"), "-o", options,
                         "-w", "-t", str(_START_TIMEOUT_S), "start", check=False)  # fmt: skip
        if done.returncode != 0 and check:
            raise RuntimeError(f"postgres did not start on port {self.port}; log:\n{self.log()}")
        return done.returncode == 0

    def stop(self) -> None:
        """Stop the server (fast: connections are cut), if it runs."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", str(_STOP_TIMEOUT_S), "stop",
                      check=False)  # fmt: skip

    def log(self) -> str:
        """The server's log so far."""
        path = self.directory / "log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop the server and remove its directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _initdb(self) -> None:
        if self._as_postgres:
            shutil.chown(self.directory, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")

    def _run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / program), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=_START_TIMEOUT_S + 30, check=check)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (skipped outside CI when none is installed)."""
    bindir = postgres_bin()
    if bindir is None:
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL is not installed (make setup installs it)")
        pytest.skip("PostgreSQL is not installed (make setup installs it)")
    with PostgresServer(bindir) as server:
        yield server


@pytest.fixture
def records_database(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> str:
    """A database of its own for this test, on the session's server; its URL."""
    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:50]
    return postgres_server.create_database(name)
