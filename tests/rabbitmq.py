"""A private RabbitMQ node on loopback for tests: never the system service.

Debian's ``rabbitmq-server`` package (make setup / .ci/run install it) brings Erlang and the scripts in
``/usr/lib/rabbitmq/bin``. A node here gets its own name (``RABBITMQ_NODENAME``), AMQP and distribution
ports, data directory (``RABBITMQ_MNESIA_BASE``), logs, config file, an empty plug-in list, an Erlang
cookie in its own ``HOME``, and its own ``epmd`` (Erlang's port mapper) on a port of its own, started
here in the foreground so that it is stopped with the node, by PID. The data directory stays across
``restart()``: durable queues and persistent messages come back, as on a real broker.

Measured here: a node answers ``rabbitmqctl await_startup`` about 5 s after its start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.ports import free_port
from tests.services import Service

__all__ = ["RABBITMQ_BIN", "RABBITMQ_MISSING", "LocalRabbitMQ", "RabbitCluster"]

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
RABBITMQ_MISSING = (
    None
    if (RABBITMQ_BIN / "rabbitmq-server").exists() and shutil.which("epmd", path="/usr/lib/erlang/bin:/usr/bin")
    else "RabbitMQ is not installed (apt install rabbitmq-server; make setup does it)"
)
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0


def start_epmd(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Erlang's port mapper on ``port`` of loopback, in the foreground: its caller stops it by PID."""
    epmd = shutil.which("epmd", path="/usr/lib/erlang/bin:/usr/bin") or "epmd"
    return subprocess.Popen([epmd, "-port", str(port), "-address", "127.0.0.1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


class LocalRabbitMQ(Service):
    """One RabbitMQ node in ``directory``: ``start``, ``stop``, ``kill`` (SIGKILL), ``restart``; ``url``."""

    def __init__(self, directory: Path, name: str = "vcrawl-test", epmd_port: int | None = None,
                 home: Path | None = None, listen_also: Sequence[str] = ()) -> None:  # fmt: skip
        """``epmd_port`` and ``home`` (the Erlang cookie's): a cluster's nodes share both, and the cluster
        runs the epmd; a lone node starts its own. ``listen_also``: addresses besides loopback where the node
        serves AMQP on its port (a network namespace's link, tests/netns.py); ``guest`` may log in there too."""
        self.directory = directory
        self.listen_also = tuple(listen_also)
        self.node = f"{name}@localhost"
        self.port = free_port()
        self._dist_port = free_port()
        self._own_epmd = epmd_port is None
        self._epmd_port = free_port() if epmd_port is None else epmd_port
        self._home = directory if home is None else home
        self._server: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The AMQP URL of the node (the ``guest`` user may log in from loopback)."""
        return self.url_on("127.0.0.1")

    def url_on(self, address: str) -> str:
        """The AMQP URL of the node at ``address``: loopback or one of ``listen_also``."""
        return f"amqp://guest:guest@{address}:{self.port}//"

    def start(self) -> None:
        """Start the node (and its epmd) and wait until it serves AMQP.

        Raises:
            AssertionError: it did not start within a minute (its log's tail is in the message), or
                RabbitMQ is not installed (a test of the ``rabbitmq`` marker fails then, never skips).
        """
        assert RABBITMQ_MISSING is None, RABBITMQ_MISSING
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "enabled_plugins").write_text("[].\n")
        (self.directory / "rabbitmq.conf").write_text(self._config())
        env = self._env()
        if self._own_epmd and (self._epmd is None or self._epmd.poll() is not None):
            self._epmd = start_epmd(self._epmd_port, env)
        with open(self.directory / "server.out", "ab") as out:
            self._server = subprocess.Popen([str(RABBITMQ_BIN / "rabbitmq-server")], env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                break
            if self._ctl("await_startup", "--timeout", "2").returncode == 0:
                return
            time.sleep(0.3)
        raise AssertionError(f"RabbitMQ node {self.node} did not start: {self._tail()}")

    def stop(self) -> None:
        """Stop the node as an operator would (``rabbitmqctl stop``; SIGKILL if it hangs), then its epmd."""
        if self._server is not None and self._server.poll() is None:
            self._ctl("stop")
            try:
                self._server.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        self._server = None
        if self._epmd is not None and self._epmd.poll() is None:
            self._epmd.terminate()
            self._epmd.wait(10)
        self._epmd = None

    @property
    def running(self) -> bool:
        return self._server is not None and self._server.poll() is None

    def kill(self) -> None:
        """SIGKILL the node's process group (the Erlang VM and what it started), as a crash would."""
        if self._server is not None and self._server.poll() is None:
            os.killpg(self._server.pid, signal.SIGKILL)
            self._server.wait(10)

    def restart(self) -> None:
        """Stop and start again on the same ports and data."""
        self.stop()
        self.start()

    def ctl(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """``rabbitmqctl -n NODE ARGS``."""
        return self._ctl(*args)

    def _ctl(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, *args], env=self._env(),
                              capture_output=True, timeout=30)  # fmt: skip

    def _config(self) -> str:
        lines = [f"listeners.tcp.default = 127.0.0.1:{self.port}"]
        lines += [f"listeners.tcp.also{n} = {address}:{self.port}" for n, address in enumerate(self.listen_also)]
        if self.listen_also:  # guest logs in from loopback only by default
            lines.append("loopback_users = none")
        return "".join(line + "\n" for line in lines)

    def _env(self) -> dict[str, str]:
        base = self.directory
        return {
            **os.environ,
            "HOME": str(self._home),  # the Erlang cookie: the node's and rabbitmqctl's (a cluster's one)
            "ERL_EPMD_PORT": str(self._epmd_port),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self._dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),  # .conf is added
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(base / "pid"),
        }

    def _tail(self) -> str:
        logs = [self.directory / "server.out", *sorted((self.directory / "log").glob("*.log"))]
        return " | ".join(path.read_text(errors="replace")[-800:] for path in logs if path.exists())


class RabbitCluster(Service):
    """``size`` RabbitMQ nodes on loopback clustered together (``rabbitmqctl join_cluster``), sharing one
    epmd and one Erlang cookie; ``urls`` lists every node's AMQP URL, the first node first."""

    def __init__(self, directory: Path, size: int = 3) -> None:
        self.directory = directory
        self._epmd_port = free_port()
        self.nodes = [LocalRabbitMQ(directory / f"n{n}", f"vcrawl-n{n}", epmd_port=self._epmd_port,
                                    home=directory) for n in range(size)]  # fmt: skip
        self._epmd: subprocess.Popen[bytes] | None = None

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> None:
        """Start every node (and the shared epmd), then join them to the first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._epmd = start_epmd(self._epmd_port, {**os.environ, "HOME": str(self.directory)})
        for node in self.nodes:
            node.start()
        for node in self.nodes[1:]:
            for args in (("stop_app",), ("join_cluster", self.nodes[0].node), ("start_app",)):
                done = node.ctl(*args)
                assert done.returncode == 0, f"{node.node} {args[0]}: {done.stderr.decode(errors='replace')}"

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        if self._epmd is not None and self._epmd.poll() is None:
            self._epmd.terminate()
            self._epmd.wait(10)
        self._epmd = None

    def leader_of(self, queue: str) -> LocalRabbitMQ:
        """The node whose replica of the quorum queue ``queue`` leads now."""
        asked = next(node for node in self.nodes if node.running)
        listing = asked.ctl("list_queues", "name", "leader", "--formatter", "json")
        for entry in json.loads(listing.stdout or b"[]"):
            if entry.get("name") == queue:
                return next(node for node in self.nodes if node.node == entry.get("leader"))
        raise AssertionError(f"no quorum queue {queue!r}: {listing.stdout[-500:]!r}")
