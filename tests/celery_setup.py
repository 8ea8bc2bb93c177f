"""pytest-celery's test setup, driven by local processes instead of Docker containers.

pytest-celery 1.x models a test environment as nodes (``CeleryTestWorker``, ``CeleryTestBroker``,
``CeleryTestBackend``) grouped in clusters and held by one ``CeleryTestSetup``. Its own nodes wrap
Docker containers, and no Docker engine runs on the machines these tests run on. A node only
calls a handful of members on its "container" (``ready``, ``logs``, ``name``, ``id``, ``status``,
``kill``, ``reload``, ``restart``, ``teardown``, ``celeryconfig``, and the worker's ``worker_name``,
``worker_queue``, ``log_level``, ``version``), so the two classes here give it a local
``redis-server`` and a local ``celery -A tasks worker`` with those members. Everything above them
(``wait_for_log``, ``assert_log_exists``, ``kill``, the clusters, the setup's app and its
readiness check) is pytest-celery's own code. The fixtures that assemble them are in
``tests/integration/conftest.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import celery
import kombu.exceptions
import redis
from celery import Celery
from pytest_celery import CeleryTestSetup

from celeryconfig import ANALYSIS_QUEUE, DOWNLOAD_QUEUE, DYNAMIC_QUEUE, celery_settings
from cli.local_redis import LocalRedis
from vcrawl.settings import Settings, celery_redis_url

__all__ = ["LocalRedisProcess", "LocalWorkerProcess", "VcrawlTestSetup"]

REPO = Path(__file__).resolve().parents[1]
WORKER_QUEUES = (DOWNLOAD_QUEUE, DYNAMIC_QUEUE, ANALYSIS_QUEUE)


def _signal_number(sig: str | int) -> int:
    """pytest-celery names signals as Docker does ("SIGKILL"); os.kill wants a number."""
    return int(signal.Signals[sig]) if isinstance(sig, str) else int(sig)


class LocalRedisProcess:
    """A private ``redis-server`` (``cli.local_redis.LocalRedis``) in the shape of a node's container."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.id = uuid.uuid4().hex[:12]
        self.name = f"redis-{self.id}"
        self._server = LocalRedis(directory)
        self._port = 0

    def start(self) -> LocalRedisProcess:
        """Start the server (a free port the first time, the same port on a restart)."""
        self._server = LocalRedis(self.directory, port=self._port)
        self._server.start()
        self._port = self._server.port
        return self

    @property
    def url(self) -> str:
        """The server's Redis URL (db 0), as vcrawl's settings spell it."""
        return self._server.url

    @property
    def status(self) -> str:
        """The Docker state ``CeleryTestNode.kill`` asks for: "running" or "exited"."""
        return "running" if self._server.pid is not None else "exited"

    @property
    def celeryconfig(self) -> dict[str, Any]:
        """What ``CeleryTestSetup.config`` reads to build the setup app's broker and backend URLs."""
        url = celery_redis_url(self.url)
        return {"url": url, "host_url": url, "hostname": "127.0.0.1", "port": self._port, "vhost": "0"}

    @property
    def client(self) -> redis.Redis:
        """A redis-py client of this server."""
        return redis.Redis.from_url(self.url, decode_responses=True)

    def ready(self) -> bool:
        """True when the server answers PING."""
        try:
            with self.client as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def logs(self) -> str:
        """The server's log file."""
        log = self.directory / "redis.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def kill(self, signal: str | int = "SIGKILL") -> None:
        """Send ``signal`` to the server's PID, then stop what is left of it and reap it."""
        if self._server.pid is not None:
            os.kill(self._server.pid, _signal_number(signal))
            self._server.stop()

    def reload(self) -> None:
        """Docker refreshes its view of a container here; a child process needs nothing."""

    def restart(self, timeout: int = 10) -> None:
        """Stop the server cleanly and start it again on the same port, with its data."""
        self._server.stop()
        self.start()

    def teardown(self) -> None:
        """Stop the server (by PID)."""
        self._server.stop()


class LocalWorkerProcess:
    """``celery -A tasks worker`` (threads pool, or ``pool``) as a subprocess, in the shape of a worker container.

    Its node name is ``<name>@<id>``, which is what ``CeleryTestWorker.hostname()`` builds, so
    control commands addressed to the node reach this worker. ``run_in``: a command the worker is
    run under, which must exec it (``ip netns exec NS``: a network namespace, tests/netns.py).
    """

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        name: str = "vcrawl",
        queues: Sequence[str] = WORKER_QUEUES,
        concurrency: int = 2,
        loglevel: str = "INFO",
        start_timeout_s: float = 30.0,
        run_in: Sequence[str] = (),
        pool: str = "threads",
    ) -> None:
        self.env = env
        self.log = log
        self.id = uuid.uuid4().hex[:12]
        self.name = f"{name}@{self.id}"
        self._worker_name = name
        self._queues = tuple(queues)
        self._concurrency = concurrency
        self._loglevel = loglevel
        self._start_timeout_s = start_timeout_s
        self._run_in = tuple(run_in)
        self._pool = pool
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalWorkerProcess:
        """Start the worker and wait until it answers a ping at its node name.

        Raises:
            AssertionError: it did not answer within the start timeout (its log says why).
        """
        command = [
            *self._run_in, sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", ",".join(self._queues),
            "-P", self._pool, "-c", str(self._concurrency), "-n", self.name,
            "--without-mingle", "--without-gossip", "-l", self._loglevel,
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(command, env=self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self._start_timeout_s
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.teardown()
                raise AssertionError(f"worker {self.name} did not answer a ping; see {self.log}:\n{self.logs()}")
        return self

    @property
    def pid(self) -> int:
        """The worker's PID."""
        assert self.process is not None, "the worker was not started"
        return self.process.pid

    @property
    def status(self) -> str:
        """The Docker state ``CeleryTestNode.kill`` asks for: "running" or "exited"."""
        return "running" if self.process is not None and self.process.poll() is None else "exited"

    @property
    def celeryconfig(self) -> dict[str, Any]:
        """The worker's broker, as the node API reports it: RabbitMQ's when ``VCRAWL_BROKER_URL`` is set."""
        url = self.env.get("VCRAWL_BROKER_URL") or celery_redis_url(self.env["VCRAWL_REDIS_URL"])
        return {"url": url, "host_url": url}

    def ready(self) -> bool:
        """True when the worker answers a control ping addressed to its node name.

        A connection the broker drops while the new worker connects (seen once on a loaded
        machine: "Connection closed by server") is a "not yet", not a failed start.
        """
        with Celery(broker=self.celeryconfig["url"], set_as_current=False) as app:
            try:
                return bool(app.control.ping(destination=[self.name], timeout=0.5, limit=1))
            except (redis.exceptions.ConnectionError, OSError, kombu.exceptions.OperationalError):
                return False

    def logs(self) -> str:
        """Everything the worker has written to its log file."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self, signal: str | int = "SIGKILL") -> None:
        """Send ``signal`` to the worker's PID and reap it (the threads pool has no children)."""
        if self.status == "running":
            os.kill(self.pid, _signal_number(signal))
            self.process.wait(30)  # type: ignore[union-attr]

    def reload(self) -> None:
        """Docker refreshes its view of a container here; a child process needs nothing."""

    def restart(self, timeout: int = 30) -> None:
        """Warm shutdown (SIGTERM), then the same worker again."""
        self.kill("SIGTERM")
        self.start()

    def teardown(self) -> None:
        """SIGKILL the worker we started (by PID) and reap it."""
        self.kill("SIGKILL")

    def version(self) -> str:
        """Celery's version, the same package the worker runs."""
        return celery.__version__

    def log_level(self) -> str:
        """The worker's ``-l`` level."""
        return self._loglevel

    def worker_name(self) -> str:
        """The name part of the worker's node name."""
        return self._worker_name

    def worker_queue(self) -> str:
        """The first queue the worker consumes (pytest-celery's nodes have one)."""
        return self._queues[0]


class VcrawlTestSetup(CeleryTestSetup):
    """A setup whose app speaks vcrawl's protocol: its queues, routes and JSON-only serializers.

    The app is a producer and control client of the setup's Redis; it never becomes the current
    app, so the session's in-process worker keeps resolving signatures through vcrawl's own app.
    """

    @classmethod
    def name(cls) -> str:
        """The setup app's main name."""
        return "vcrawl-test-setup"

    @classmethod
    def create_setup_app(cls, celery_setup_config: dict, celery_setup_app_name: str) -> Celery:
        """pytest-celery's app, but not the current app of this thread (Celery's default)."""
        current = celery.current_app._get_current_object()
        app = super().create_setup_app(celery_setup_config, celery_setup_app_name)
        current.set_current()
        return app

    @classmethod
    def update_app_config(cls, app: Celery) -> None:
        """vcrawl's Celery settings for the broker pytest-celery put in ``broker_url``."""
        app.conf.update(celery_settings(Settings(redis_url=app.conf.broker_url)))
