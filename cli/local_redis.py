"""A private ``redis-server`` child process on loopback, for the embedded default and tests.

Listens on a free port of 127.0.0.1 only (protected mode on), so any Celery or redis-py
client reaches it with a plain ``redis://`` URL.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis

from vcrawl.errors import ConfigError

__all__ = ["LocalRedis"]

_PORT_TRIES = 5

logger = logging.getLogger(__name__)


class LocalRedis:
    """Start ``redis-server`` in a fresh directory; stop it (by PID) on exit.

    AOF is on with ``appendfsync everysec`` so a restart loses at most a second. ``bind``: the
    addresses it listens on; besides loopback only a test's own network (tests/netns.py), with
    protected mode off so that clients there are let in. ``url`` stays on loopback.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        start_timeout_s: float = 10.0,
        port: int = 0,
        pass_fds: Sequence[int] = (),
        stop_timeout_s: float = 5.0,
        bind: Sequence[str] = ("127.0.0.1",),
    ) -> None:
        self._owns_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="vcrawl-redis-"))
        self._fixed_port = port  # 0: a free port; else this one (a restart where clients reconnect)
        self.port = port
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._pass_fds = tuple(pass_fds)  # e.g. a lock the server holds for as long as it runs
        self._process: subprocess.Popen[bytes] | None = None
        # More than loopback (a test's network namespace): protected mode would refuse those clients.
        self._bind = tuple(bind)

    @property
    def url(self) -> str:
        """The Redis URL of this server (db 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> LocalRedis:
        """Start the server and wait until it answers PING.

        Raises:
            ConfigError: redis-server is not installed or does not start.
        """
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigError("redis-server is not installed (run `make setup`, or set VCRAWL_REDIS_URL)")
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(_PORT_TRIES):  # another process may take the free port before redis binds it
            self.port = self._fixed_port or _free_port()
            if self._try_start(binary):
                return self
        raise ConfigError(f"redis-server did not start; see {self.directory}/redis.log")

    def _try_start(self, binary: str) -> bool:
        command = [
            binary, "--port", str(self.port), "--bind", *self._bind,
            "--protected-mode", "yes" if self._bind == ("127.0.0.1",) else "no",
            "--dir", str(self.directory), "--save", "", "--appendonly", "yes",
            "--appendfsync", "everysec", "--daemonize", "no", "--loglevel", "warning",
        ]  # fmt: skip
        with open(self.directory / "redis.log", "ab") as log:
            # A session of its own: a terminal's Ctrl-C reaches our process only, which then
            # stops the server after the workers, not before.
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                pass_fds=self._pass_fds, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            try:
                with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1) as client:
                    client.ping()
                logger.debug("private redis-server ready on port %s", self.port)
                return True
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        return False

    @property
    def pid(self) -> int | None:
        """The server's PID while it runs."""
        return self._process.pid if self._process is not None else None

    def stop(self) -> None:
        """Stop the server we started and remove a temp dir.

        SIGTERM is Redis's clean shutdown: it writes and fsyncs the AOF, then exits. A server
        still running after ``stop_timeout_s`` (say, a full disk) is killed, with a warning.
        """
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(self._stop_timeout_s)
                except subprocess.TimeoutExpired:
                    logger.warning("redis-server %s did not stop in %ss; killing it (see %s/redis.log)",
                                   self._process.pid, self._stop_timeout_s, self.directory)  # fmt: skip
                    self._process.kill()
                    self._process.wait(5)
            self._process = None
        if self._owns_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
