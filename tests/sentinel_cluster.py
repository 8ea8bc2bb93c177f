"""Redis behind Sentinel on loopback, for tests: a primary, one replica and three Sentinels.

``SentinelCluster`` starts them as child processes (``redis-server`` and ``redis-server --sentinel``)
on free ports of 127.0.0.1, each in its own directory, with the settings of a small production
deployment shortened to test time: quorum 2, ``down-after-milliseconds`` 2000, ``failover-timeout``
10000. It kills the primary, waits for the promotion, brings the old primary back (Sentinel makes
it a replica) and forces a failover back. Every process it started is stopped by PID on exit,
also when the test fails.

With ``tls=`` (tests/tls_files.py) every process speaks TLS only: ``port 0`` and a ``tls-port``,
client certificates required (Redis' default), ``tls-replication yes`` so that the replica links
to the primary and the Sentinels reach the data nodes and each other over TLS.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, cast

import redis
from redis.sentinel import Sentinel

from tests.celery_setup import LocalWorkerProcess
from tests.tls_files import TlsFiles
from tests.waiting import wait_until

__all__ = ["SentinelCluster", "SentinelWorker", "start_sentinel_worker"]

QUORUM = 2
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 10000
_PORT_TRIES = 5
_POLL_S = 0.1

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _client(port: int, tls: TlsFiles | None = None) -> redis.Redis:
    options: dict[str, Any] = {"ssl": True, **tls.client_options()} if tls is not None else {}
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1, decode_responses=True,
                       **options)  # fmt: skip


def _answer(port: int, *command: str, tls: TlsFiles | None = None) -> Any:
    """One command to the server on ``port``; None when it does not answer."""
    try:
        with _client(port, tls) as client:
            return client.execute_command(*command)
    except redis.RedisError:
        return None


def _wait(check: Callable[[], T], timeout_s: float, what: Callable[[], str]) -> T:
    """Call ``check`` until it returns something truthy; fail with ``what()`` after ``timeout_s``."""
    return cast(T, wait_until(check, timeout_s, lambda: f"Sentinel harness: {what()}", poll_s=_POLL_S))


class _Server:
    """One ``redis-server`` child process (a data node or a Sentinel) in its own directory."""

    def __init__(self, directory: Path, port: int, args: list[str], tls: TlsFiles | None = None) -> None:
        self.directory = directory
        self.port = port
        self.args = args
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> bool:
        """Start the process; True once it answers PING, False if it exited (say, the port was taken)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "log", "ab") as log:
            # A session of its own: a Ctrl-C in the terminal reaches pytest only, whose teardown stops us.
            self.process = subprocess.Popen(
                ["redis-server", *self.args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.directory, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                return False
            if _answer(self.port, "PING", tls=self.tls):
                return True
            time.sleep(0.05)
        self.stop()
        return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL (the machine is gone: nothing flushed, no goodbye to clients) and reap."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
            self.process = None

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 5 s; reap."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(5)
            self.process = None

    def log_tail(self, lines: int = 5) -> str:
        log = self.directory / "log"
        return " | ".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


class SentinelCluster:
    """A Redis primary, one replica and three Sentinels on loopback; a context manager.

    ``url`` and ``master_name`` are what vcrawl is given (``VCRAWL_REDIS_URL`` and
    ``VCRAWL_REDIS_SENTINEL_MASTER``). The data nodes run with AOF on (``appendfsync everysec``),
    as a deployment would.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        master_name: str = "vcrawl-test",
        settle_timeout_s: float = 30.0,
        tls: TlsFiles | None = None,
    ) -> None:
        self._owns_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="vcrawl-sentinel-"))
        self.master_name = master_name
        self._settle_timeout_s = settle_timeout_s
        self._tls = tls
        self._nodes: dict[int, _Server] = {}  # data nodes by port
        self._sentinels: list[_Server] = []
        self._killed: _Server | None = None
        self._killed_at: float | None = None

    # ---- start and stop -------------------------------------------------------------------

    def start(self) -> SentinelCluster:
        """Start primary, replica and Sentinels; return once the replica is linked and every
        Sentinel sees the replica and the two other Sentinels.

        Raises:
            AssertionError: a process did not start, or the cluster did not settle in time.
        """
        try:
            primary = self._start_node("primary", [])
            self._start_node("replica", ["--replicaof", "127.0.0.1", str(primary.port)])
            for number in (1, 2, 3):
                self._start_sentinel(number, primary.port)
            _wait(self._settled, self._settle_timeout_s, self._describe)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, name: str, extra: list[str]) -> _Server:
        for _ in range(_PORT_TRIES):  # another process may take the free port before redis binds it
            port = _free_port()
            listen = ["--port", str(port)]
            if self._tls is not None:
                listen = ["--port", "0", "--tls-port", str(port), "--tls-replication", "yes", *self._tls.server_args()]
            args = [
                *listen, "--bind", "127.0.0.1", "--dir", str(self.directory / name), "--save", "",
                "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no", *extra,
            ]  # fmt: skip
            node = _Server(self.directory / name, port, args, self._tls)
            if node.start():
                self._nodes[port] = node
                return node
        raise AssertionError(f"Sentinel harness: redis-server {name} did not start: {node.log_tail()}")

    def _start_sentinel(self, number: int, primary_port: int) -> None:
        directory = self.directory / f"sentinel{number}"
        directory.mkdir(parents=True, exist_ok=True)
        for _ in range(_PORT_TRIES):
            port = _free_port()
            conf = directory / "sentinel.conf"  # Sentinel rewrites it: its state survives its restart
            listen = f"port {port}\n"
            if self._tls is not None:
                listen = (
                    f"port 0\ntls-port {port}\ntls-replication yes\ntls-cert-file {self._tls.cert}\n"
                    f"tls-key-file {self._tls.key}\ntls-ca-cert-file {self._tls.ca}\n"
                )
            conf.write_text(
                f"{listen}bind 127.0.0.1\ndaemonize no\ndir {directory}\n"
                "sentinel resolve-hostnames no\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {primary_port} {QUORUM}\n"
                f"sentinel down-after-milliseconds {self.master_name} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {self.master_name} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {self.master_name} 1\n"
            )
            sentinel = _Server(directory, port, [str(conf), "--sentinel"], self._tls)
            if sentinel.start():
                self._sentinels.append(sentinel)
                return
        raise AssertionError(f"Sentinel harness: Sentinel {number} did not start: {sentinel.log_tail()}")

    def stop(self) -> None:
        """Stop every process we started (Sentinels first, so none starts a failover meanwhile)."""
        for server in (*self._sentinels, *self._nodes.values()):
            server.stop()
        if self._owns_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SentinelCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- what clients are given -----------------------------------------------------------

    @property
    def sentinel_ports(self) -> list[int]:
        """The three Sentinels' ports."""
        return [sentinel.port for sentinel in self._sentinels]

    @property
    def url(self) -> str:
        """``VCRAWL_REDIS_URL`` for this cluster: every Sentinel, db 0."""
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports) + "/0"

    def master_client(self, **options: Any) -> redis.Redis:
        """A redis-py client that follows the primary through the Sentinels (for the test's own reads)."""
        tls: dict[str, Any] = {"ssl": True, **self._tls.client_options()} if self._tls is not None else {}
        sentinel = Sentinel([("127.0.0.1", port) for port in self.sentinel_ports], socket_timeout=1,
                            sentinel_kwargs={"socket_timeout": 1, **tls})  # fmt: skip
        options = {**tls, **options}
        options.setdefault("socket_timeout", 2)
        options.setdefault("socket_connect_timeout", 1)
        return sentinel.master_for(self.master_name, **options)

    # ---- state ------------------------------------------------------------------------------

    def _master_field(self, port: int, field: str) -> str | None:
        reply = _answer(port, "SENTINEL", "MASTER", self.master_name, tls=self._tls)
        if not reply:
            return None
        if isinstance(reply, list):  # RESP2 without redis-py's reply parser: a flat list
            reply = dict(zip(reply[::2], reply[1::2], strict=True))
        value = reply.get(field)
        return None if value is None else str(value)

    def _named_by(self, sentinel_port: int) -> int | None:
        reply = _answer(sentinel_port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name, tls=self._tls)
        return int(reply[1]) if reply else None

    def _role(self, port: int) -> str | None:
        reply = _answer(port, "ROLE", tls=self._tls)
        return reply[0] if reply else None

    def _link_up(self, port: int) -> bool:
        reply = _answer(port, "INFO", "replication", tls=self._tls)
        return bool(reply) and reply.get("master_link_status") == "up"

    def _settled(self) -> bool:
        replicas = [port for port, node in self._nodes.items() if node.running and self._role(port) == "slave"]
        return (
            bool(replicas)
            and all(self._link_up(port) for port in replicas)
            and all(
                self._master_field(port, "num-slaves") == str(len(replicas))
                and self._master_field(port, "num-other-sentinels") == "2"
                and self._master_field(port, "flags") == "master"
                for port in self.sentinel_ports
            )
        )

    def _describe(self) -> str:
        nodes = ", ".join(
            f"{port}: role {self._role(port)}, link {'up' if self._link_up(port) else 'down'}"
            if node.running else f"{port}: not running ({node.log_tail(2)})"
            for port, node in self._nodes.items()
        )  # fmt: skip
        sentinels = ", ".join(
            f"{port}: names {self._named_by(port)}, sees {self._master_field(port, 'num-slaves')} replica(s) and "
            f"{self._master_field(port, 'num-other-sentinels')} other Sentinel(s), flags "
            f"{self._master_field(port, 'flags')}"
            for port in self.sentinel_ports
        )
        return f"data nodes [{nodes}]; Sentinels [{sentinels}]"

    def primary_port(self) -> int:
        """The primary's port as the Sentinels name it (the majority of those that answer).

        Raises:
            AssertionError: no Sentinel answers.
        """
        named = Counter(port for port in map(self._named_by, self.sentinel_ports) if port is not None)
        if not named:
            raise AssertionError(f"Sentinel harness: no Sentinel names a primary: {self._describe()}")
        return named.most_common(1)[0][0]

    def pids(self) -> dict[int, int]:
        """The PIDs of the running data nodes, by port."""
        return {port: node.process.pid for port, node in self._nodes.items() if node.process is not None}

    # ---- faults -----------------------------------------------------------------------------

    def kill_primary(self) -> int:
        """SIGKILL the primary's process (its machine is gone); return its port."""
        port = self.primary_port()
        node = self._nodes[port]
        node.kill()
        self._killed, self._killed_at = node, time.monotonic()
        return port

    def wait_promotion(self, old_port: int, timeout_s: float = 30.0) -> tuple[int, float]:
        """Wait until every Sentinel names a master other than ``old_port`` and it says ROLE master.

        Returns the new primary's port and the seconds it took, counted from ``kill_primary`` when
        ``old_port`` is the killed primary, else from this call.

        Raises:
            AssertionError: no promotion within ``timeout_s``.
        """
        started = time.monotonic()
        if self._killed is not None and self._killed.port == old_port and self._killed_at is not None:
            started = self._killed_at

        def promoted() -> int | None:
            named = {self._named_by(port) for port in self.sentinel_ports}
            if len(named) != 1:
                return None
            [port] = named
            return port if port is not None and port != old_port and self._role(port) == "master" else None

        port = _wait(promoted, timeout_s, lambda: f"promotion away from port {old_port}: {self._describe()}")
        return port, time.monotonic() - started

    def restart_old_primary(self, timeout_s: float = 30.0) -> int:
        """Start the killed primary again (same port, its AOF); wait until Sentinel has made it a
        replica of the new primary and its link is up; return its port.

        Raises:
            AssertionError: nothing was killed, it did not start, or it was not made a replica in time.
        """
        if self._killed is None:
            raise AssertionError("Sentinel harness: restart_old_primary without kill_primary")
        node = self._killed
        if not node.start():
            raise AssertionError(f"Sentinel harness: the old primary did not start again: {node.log_tail()}")
        self._killed = None
        new_primary = self.primary_port()

        def replica_of_new_primary() -> bool:
            reply = _answer(node.port, "INFO", "replication", tls=self._tls)
            return (
                bool(reply)
                and reply.get("role") == "slave"
                and int(reply.get("master_port", 0)) == new_primary
                and reply.get("master_link_status") == "up"
            )

        _wait(replica_of_new_primary, timeout_s, lambda: f"old primary {node.port} as a replica: {self._describe()}")
        _wait(self._settled, timeout_s, self._describe)
        return node.port

    def failover(self, timeout_s: float = 30.0) -> int:
        """``SENTINEL FAILOVER``: promote a replica without waiting for agreement; return the port of
        the primary it replaces (pass it to ``wait_promotion``).

        A replica that has just linked may not be a candidate yet (``NOGOODSLAVE``, until the
        Sentinels have seen it healthy): the command is tried again until ``timeout_s``.

        Raises:
            AssertionError: no Sentinel accepted the failover in time.
        """
        old = self.primary_port()
        errors: list[str] = []

        def accepted() -> bool:
            try:
                with _client(self.sentinel_ports[0], self._tls) as client:
                    return bool(client.execute_command("SENTINEL", "FAILOVER", self.master_name))
            except redis.RedisError as error:
                errors.append(str(error))
                return False

        _wait(accepted, timeout_s, lambda: f"SENTINEL FAILOVER accepted ({errors[-1:]}): {self._describe()}")
        return old


class SentinelWorker(LocalWorkerProcess):
    """``celery -A tasks worker`` (tests/celery_setup.py) whose readiness is read from its log.

    The base class pings the node over a plain Celery app built from the Redis URL alone, which
    cannot reach a broker behind Sentinel (kombu needs the master name as a transport option).
    """

    def ready(self) -> bool:
        """True once the worker logged ``<node name> ready.`` (its consumer is started)."""
        if f"{self.name} ready." in self.logs():
            return True
        time.sleep(_POLL_S)  # the base class's start() calls this in a loop
        return False


def start_sentinel_worker(
    env: dict[str, str],
    name: str,
    log: Path,
    concurrency: int = 2,
    queues: str = "download,download.dynamic,analysis",
) -> subprocess.Popen[bytes]:
    """Start a worker as ``tests.cluster.start_worker`` does, for a cluster behind Sentinel."""
    worker = SentinelWorker(env, log, name, queues.split(","), concurrency, "INFO")
    return worker.start().process  # type: ignore[return-value]
