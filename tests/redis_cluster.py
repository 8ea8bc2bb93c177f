"""A Redis Cluster on loopback, for tests: N primaries with R replicas each, all child processes.

``RedisCluster`` starts one ``redis-server --cluster-enabled yes`` per node on 127.0.0.1, each in
``<directory>/<port>`` (its ``nodes.conf``, AOF and ``log``), and joins them with
``redis-cli --cluster create``. It kills a primary and waits for its replica's promotion, adds an
empty primary and rebalances slots onto it while clients keep working (MOVED/ASK), and reads
counters for benchmarks. Every process it started is stopped by PID on exit, also when the test
fails; it never signals anything else.

Every node also listens on its port + 10000, the cluster bus, so ports are picked with both free.
"""

from __future__ import annotations

import random
import re
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, cast

import redis
from redis.cluster import ClusterNode
from redis.cluster import RedisCluster as ClusterClient

from tests.waiting import wait_until

__all__ = ["RedisCluster"]

PORT_RANGE = (20000, 45000)
BUS_OFFSET = 10000  # Redis' default cluster bus port is the client port + 10000
SLOTS = 16384
# What the harness and redis-py send to look after the cluster, and what redis-cli's slot moves
# run, not what a test's code asks for (ASKING after an ASK redirect is the client's and counts).
HOUSEKEEPING_COMMANDS = (
    "client", "cluster", "command", "config", "hello", "info", "migrate", "ping", "readonly", "restore-asking",
)  # fmt: skip

_PORT_TRIES = 20
_POLL_S = 0.1
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_CLI_TIMEOUT_S = 60.0
# Flags of a CLUSTER NODES entry that is not (yet, or any more) a working member, as one node sees it.
_UNHEALTHY_FLAGS = frozenset({"fail", "fail?", "handshake", "noaddr"})
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

T = TypeVar("T")
# The healthy members as one node sees them: port -> (its primary's port, None for a primary; slots owned).
View = dict[int, tuple[int | None, int]]


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=1, decode_responses=True)


def _answer(port: int, *command: str) -> Any:
    """One command to the node on ``port``; None when it does not answer."""
    try:
        with _client(port) as client:
            return client.execute_command(*command)
    except (redis.RedisError, AttributeError):
        # AttributeError: redis-py read a HELLO reply that is no map, from whatever answered on the
        # port before this node did (seen once under xdist); like no answer, ask again.
        return None


def _wait(check: Callable[[], T], timeout_s: float, what: Callable[[], str]) -> T:
    """Call ``check`` until it returns something truthy; fail with ``what()`` after ``timeout_s``."""
    return cast(T, wait_until(check, timeout_s, lambda: f"Redis Cluster harness: {what()}", poll_s=_POLL_S))


@dataclass(frozen=True)
class _Entry:
    """One line of ``CLUSTER NODES``: a node as one member sees it."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: int

    @property
    def healthy(self) -> bool:
        return not self.flags & _UNHEALTHY_FLAGS

    @property
    def primary(self) -> bool:
        return "master" in self.flags


def _parse_nodes(text: str) -> list[_Entry]:
    """Parse ``CLUSTER NODES``: ``id ip:port@bus[,host] flags master ping pong epoch link slot...``."""
    entries = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        # A node that has met nobody yet lists itself as ":port@bus", without an address.
        port = int(fields[1].split("@")[0].rsplit(":", 1)[1] or 0)
        # "[slot->-id]" / "[slot-<-id]" are slots being migrated or imported; their owner is unchanged.
        ranges = [field.split("-") for field in fields[8:] if not field.startswith("[")]
        slots = sum(int(bounds[-1]) - int(bounds[0]) + 1 for bounds in ranges)
        master_id = None if fields[3] == "-" else fields[3]
        entries.append(_Entry(fields[0], port, frozenset(fields[2].split(",")), master_id, slots))
    return entries


def _show(view: View) -> str:
    """A view as "P:slots" for each primary and "R>P" for each replica R of P."""
    return ", ".join(
        f"{port}:{slots}" if primary is None else f"{port}>{primary}" for port, (primary, slots) in sorted(view.items())
    )


class _Node:
    """One cluster-enabled ``redis-server`` child process in its own directory."""

    def __init__(self, directory: Path, port: int, node_timeout_ms: int) -> None:
        self.port = port
        self.directory = directory / str(port)
        self.node_timeout_ms = node_timeout_ms
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> bool:
        """Start the process; True once it answers PING, False if it exited (say, a port was taken)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--daemonize", "no",
            "--cluster-enabled", "yes", "--cluster-config-file", str(self.directory / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--appendonly", "yes", "--save", "", "--dir", str(self.directory),
            # Redis 7 syncs a new replica diskless, after waiting 5 s for more replicas to share the
            # transfer: every replica here has its own primary, so the wait only slows the tests.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        with open(self.directory / "log", "ab") as log:
            # A session of its own: a Ctrl-C in the terminal reaches pytest only, whose teardown stops us.
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                return False
            if _answer(self.port, "PING"):
                return True
            time.sleep(0.05)
        self.terminate()
        self.reap(time.monotonic() + _STOP_TIMEOUT_S)
        return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL (the machine is gone: nothing flushed, no goodbye to the cluster bus) and reap."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self) -> None:
        """SIGTERM, Redis' clean shutdown; ``reap`` waits for it."""
        if self.running:
            assert self.process is not None
            self.process.terminate()

    def reap(self, deadline: float) -> None:
        """Wait for the process until ``deadline``, then SIGKILL it."""
        if self.process is None:
            return
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.process = None

    def log_tail(self, lines: int = 5) -> str:
        log = self.directory / "log"
        return " | ".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


class RedisCluster:
    """A Redis Cluster of ``primaries`` primaries with ``replicas_per_primary`` replicas each; a context manager.

    ``url`` is what vcrawl is given; ``client()`` is a redis-py cluster client for the test's own
    reads and writes. Waits are bounded by ``settle_timeout_s`` (formation, a new node) unless a
    method takes its own timeout.
    """

    def __init__(
        self,
        directory: Path,
        primaries: int = 3,
        replicas_per_primary: int = 1,
        node_timeout_ms: int = 3000,
        settle_timeout_s: float = 60.0,
    ) -> None:
        self.directory = Path(directory)
        self.primaries = primaries
        self.replicas_per_primary = replicas_per_primary
        self.node_timeout_ms = node_timeout_ms
        self.settle_timeout_s = settle_timeout_s
        self._nodes: dict[int, _Node] = {}  # every node that started, by port, in start order
        self._tried: set[int] = set()  # ports of every start attempt, never picked twice
        self._initial_primaries: list[int] = []
        self._killed_at: dict[int, float] = {}  # port -> monotonic time of kill_primary
        self._replicas_at_kill: dict[int, list[int]] = {}  # port -> its replicas when it was killed

    # ---- start and stop -------------------------------------------------------------------

    def start(self) -> RedisCluster:
        """Start the nodes and create the cluster; return once every node sees ``primaries``
        primaries and every replica's link to its primary is up.

        Raises:
            AssertionError: a node did not start, ``redis-cli --cluster create`` failed, or the
                cluster did not settle in time.
        """
        try:
            for _ in range(self.primaries * (1 + self.replicas_per_primary)):
                self._start_node()
            addresses = [f"127.0.0.1:{port}" for port in self._nodes]
            replicas = str(self.replicas_per_primary)
            create = ["--cluster", "create", *addresses, "--cluster-replicas", replicas, "--cluster-yes"]
            self._cli(create, _CLI_TIMEOUT_S)
            _wait(self._formed, self.settle_timeout_s, lambda: f"cluster formation: {self._describe()}")
            primaries = set(self.primary_ports())
            self._initial_primaries = [port for port in self._nodes if port in primaries]  # in start order
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self) -> _Node:
        for _ in range(_PORT_TRIES):  # another process may take a free port before redis binds it
            port = self._pick_port()
            self._tried.add(port)
            node = _Node(self.directory, port, self.node_timeout_ms)
            if node.start():
                self._nodes[port] = node
                return node
        raise AssertionError(f"Redis Cluster harness: redis-server did not start: {node.log_tail()}")

    def _pick_port(self) -> int:
        for _ in range(_PORT_TRIES * 10):
            port = random.randint(*PORT_RANGE)
            taken = {p for tried in self._tried for p in (tried, tried + BUS_OFFSET)}
            if not {port, port + BUS_OFFSET} & taken and _is_free(port) and _is_free(port + BUS_OFFSET):
                return port
        raise AssertionError(f"Redis Cluster harness: no free port pair (P, P+{BUS_OFFSET}) in {PORT_RANGE}")

    def stop(self) -> None:
        """SIGTERM every node still running, SIGKILL those not gone after ~5 s; reap them all."""
        for node in self._nodes.values():
            node.terminate()
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for node in self._nodes.values():
            node.reap(deadline)

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- what clients are given -----------------------------------------------------------

    @property
    def url(self) -> str:
        """``VCRAWL_REDIS_URL`` for this cluster: the primaries it was created with."""
        return "redis-cluster://" + ",".join(f"127.0.0.1:{port}" for port in self._initial_primaries)

    @property
    def ports(self) -> list[int]:
        """Every node started (running or killed), in start order."""
        return list(self._nodes)

    def client(self, **options: Any) -> ClusterClient:
        """A redis-py cluster client (bytes replies) started from the running nodes; the caller closes it."""
        startup = [ClusterNode("127.0.0.1", port) for port in self._live_ports()]
        options = {"decode_responses": False, "socket_timeout": 5, "socket_connect_timeout": 2, **options}
        return ClusterClient(startup_nodes=startup, **options)

    # ---- state ------------------------------------------------------------------------------

    def _live_ports(self) -> list[int]:
        return [port for port, node in self._nodes.items() if node.running]

    def _entries(self, port: int) -> list[_Entry] | None:
        reply = _answer(port, "CLUSTER", "NODES")
        return _parse_nodes(reply) if isinstance(reply, str) else None

    def _state_ok(self, port: int) -> bool:
        reply = _answer(port, "CLUSTER", "INFO")
        return isinstance(reply, str) and "cluster_state:ok" in reply.splitlines()

    def _link_up(self, port: int) -> bool:
        reply = _answer(port, "INFO", "replication")
        return bool(reply) and reply.get("master_link_status") == "up"

    def _view(self, port: int) -> View | None:
        """The healthy members as the node on ``port`` sees them: port -> (its primary's port or
        None for a primary, slots owned); None when the node does not answer."""
        entries = self._entries(port)
        if entries is None:
            return None
        ports_by_id = {entry.node_id: entry.port for entry in entries}
        return {
            entry.port: (None if entry.primary else ports_by_id.get(entry.master_id or ""), entry.slots)
            for entry in entries
            if entry.healthy
        }

    def _agreed(self) -> View | None:
        """The common view when every running node is in it, sees exactly the running nodes, agrees
        with the others on roles and slots, says ``cluster_state:ok``, and every replica's link is up."""
        live = self._live_ports()
        views = [self._view(port) for port in live]
        first = views[0] if views else None
        if first is None or set(first) != set(live) or any(view != first for view in views):
            return None
        if sum(slots for _, slots in first.values()) != SLOTS or not all(self._state_ok(port) for port in live):
            return None
        replicas = [port for port, (primary, _) in first.items() if primary is not None]
        return first if all(self._link_up(port) for port in replicas) else None

    def _formed(self) -> bool:
        view = self._agreed()
        return view is not None and sum(primary is None for primary, _ in view.values()) == self.primaries

    def _any_entries(self) -> list[_Entry]:
        for port in self._live_ports():
            if (entries := self._entries(port)) is not None:
                return entries
        raise AssertionError(f"Redis Cluster harness: no node answers CLUSTER NODES: {self._describe()}")

    def _describe(self) -> str:
        """Each node's state, what it sees and the tail of its log, for failure messages."""
        parts = []
        for port, node in self._nodes.items():
            if not node.running:
                parts.append(f"{port}: not running ({node.log_tail(2)})")
                continue
            view = self._view(port)
            seen = "no answer" if view is None else _show(view)
            state = "ok" if self._state_ok(port) else "not ok"
            link = "up" if self._link_up(port) else "down or none"
            parts.append(f"{port}: state {state}, replica link {link}, sees [{seen}], log: {node.log_tail(3)}")
        return "; ".join(parts)

    def primary_ports(self) -> list[int]:
        """The primaries as a running node sees them, without those it flags as failing.

        Raises:
            AssertionError: no node answers.
        """
        return [entry.port for entry in self._any_entries() if entry.primary and entry.healthy]

    def replica_of(self, port: int) -> int:
        """The port of a healthy replica of the primary on ``port``.

        Raises:
            AssertionError: no node answers, or that primary has no healthy replica.
        """
        entries = self._any_entries()
        ids = [entry.node_id for entry in entries if entry.port == port]
        replicas = [entry.port for entry in entries if entry.healthy and ids and entry.master_id == ids[0]]
        if not replicas:
            raise AssertionError(f"Redis Cluster harness: no replica of {port}: {self._describe()}")
        return replicas[0]

    def slot_owner_counts(self) -> dict[int, int]:
        """Slots owned by each healthy primary (0 for an empty one), by port."""
        return {entry.port: entry.slots for entry in self._any_entries() if entry.primary and entry.healthy}

    def keys_per_primary(self, pattern: str = "*") -> dict[int, int]:
        """Keys on each healthy primary (matching ``pattern``), by port."""
        counts = {}
        for port in self.primary_ports():
            with _client(port) as client:
                if pattern == "*":
                    counts[port] = int(client.dbsize())
                else:
                    counts[port] = sum(1 for _ in client.scan_iter(match=pattern, count=1000))
        return counts

    def commandstats_total(self, port: int, exclude: tuple[str, ...] = HOUSEKEEPING_COMMANDS) -> int:
        """Commands the node on ``port`` has run (INFO commandstats), without ``exclude`` (and their subcommands)."""
        with _client(port) as client:
            stats = client.info("commandstats")
        # Keys look like "cmdstat_get" and, for subcommands, "cmdstat_cluster|nodes".
        return sum(
            int(counters["calls"])
            for name, counters in stats.items()
            if name.removeprefix("cmdstat_").split("|")[0] not in exclude
        )

    def cpu_seconds(self, port: int) -> float:
        """CPU time (user + system) the node on ``port`` has used (INFO cpu)."""
        with _client(port) as client:
            cpu = client.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    # ---- faults and changes -------------------------------------------------------------------

    def kill_primary(self, port: int) -> None:
        """SIGKILL the node on ``port`` (a primary: its machine is gone); its replicas are noted first.

        Raises:
            AssertionError: the node on ``port`` is not ours, not running, or not a primary.
        """
        if port not in self._live_ports() or port not in self.primary_ports():
            raise AssertionError(f"Redis Cluster harness: {port} is not a running primary: {self._describe()}")
        entries = self._any_entries()
        [node_id] = [entry.node_id for entry in entries if entry.port == port]
        self._replicas_at_kill[port] = [entry.port for entry in entries if entry.master_id == node_id]
        self._nodes[port].kill()
        self._killed_at[port] = time.monotonic()

    def wait_promotion(self, old_port: int, timeout_s: float = 30.0) -> tuple[int, float]:
        """Wait until a former replica of ``old_port`` is a primary with slots in every running
        node's view, ``old_port`` is a healthy primary in none, and every running node says
        ``cluster_state:ok``.

        Returns the new primary's port and the seconds it took, counted from ``kill_primary`` when
        ``old_port`` was killed by it, else from this call.

        Raises:
            AssertionError: no promotion within ``timeout_s``.
        """
        started = self._killed_at.get(old_port, time.monotonic())
        candidates = self._replicas_at_kill.get(old_port) or [self.replica_of(old_port)]

        def is_primary_with_slots(port: int, view: View) -> bool:
            return port in view and view[port][0] is None and view[port][1] > 0

        def promoted() -> int | None:
            live = self._live_ports()
            views = [view for view in map(self._view, live) if view is not None]
            if len(views) < len(live) or any(old_port in view and view[old_port][0] is None for view in views):
                return None
            new = [port for port in candidates if all(is_primary_with_slots(port, view) for view in views)]
            return new[0] if new and all(self._state_ok(port) for port in live) else None

        port = _wait(promoted, timeout_s, lambda: f"promotion of a replica of {old_port}: {self._describe()}")
        return port, time.monotonic() - started

    def add_primary(self) -> int:
        """Start an empty cluster-enabled node, ``redis-cli --cluster add-node`` it as a primary
        without slots; return its port once every running node knows it and agrees on the cluster.

        Raises:
            AssertionError: it did not start, add-node failed, or the cluster did not agree in time.
        """
        # redis-cli refuses to add a node while the members disagree (say, just after a failover).
        _wait(self._agreed, self.settle_timeout_s, lambda: f"agreement before add-node: {self._describe()}")
        node = self._start_node()
        existing = next(port for port in self.primary_ports() if self._nodes[port].running)
        self._cli(["--cluster", "add-node", f"127.0.0.1:{node.port}", f"127.0.0.1:{existing}"], _CLI_TIMEOUT_S)
        _wait(self._agreed, self.settle_timeout_s, lambda: f"new node {node.port} known: {self._describe()}")
        return node.port

    def slot_of(self, key: str) -> tuple[int, int]:
        """The slot of ``key`` and the port of the primary that serves it."""
        slot = int(_answer(self.primary_ports()[0], "CLUSTER", "KEYSLOT", key))
        return slot, self.slot_owner(slot)

    def slot_owner(self, slot: int) -> int:
        """The port of the primary that serves ``slot``."""
        for start, end, owner, *_ in _answer(self.primary_ports()[0], "CLUSTER", "SLOTS") or []:
            if int(start) <= slot <= int(end):
                return int(owner[1])
        raise AssertionError(f"Redis Cluster harness: nobody serves slot {slot}: {self._describe()}")

    def move_slot(self, slot: int, to_port: int, keys_per_step: int = 20, step_pause_s: float = 0.05) -> int:
        """Move one slot, with its keys, to the primary on ``to_port``, the way ``redis-cli --cluster
        reshard`` does: IMPORTING on the target, MIGRATING on the source, MIGRATE a few keys at a
        time (clients meet ASK and TRYAGAIN meanwhile), then the slot's new owner told to every
        primary (MOVED from then on). Returns how many keys moved.

        Raises:
            AssertionError: a step failed, or the cluster did not agree afterwards.
        """
        from_port = self.slot_owner(slot)
        ids = {entry.port: entry.node_id for entry in self._any_entries()}
        with _client(from_port) as source, _client(to_port) as target:
            target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from_port])
            source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to_port])
            moved = 0
            for _ in range(100_000):  # bounded: a slot of a test holds thousands of keys at most
                keys = source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, keys_per_step)
                if not keys:
                    break
                source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(step_pause_s)  # a live migration: the crawl goes on between the steps
            for port in self.primary_ports():
                _answer(port, "CLUSTER", "SETSLOT", str(slot), "NODE", ids[to_port])
        _wait(self._agreed, self.settle_timeout_s, lambda: f"agreement after moving slot {slot}: {self._describe()}")
        return moved

    def rebalance(self, timeout_s: float = 120.0) -> float:
        """``redis-cli --cluster rebalance --cluster-use-empty-masters``: move slots, with their
        keys, until the primaries own about as many each; return the seconds it took once every
        running node agrees on the new owners.

        Raises:
            AssertionError: redis-cli failed or the cluster did not agree within ``timeout_s``.
        """
        started = time.monotonic()
        # redis-cli refuses to move slots while the members disagree (say, just after add-node).
        _wait(self._agreed, timeout_s, lambda: f"agreement before rebalance: {self._describe()}")
        existing = next(port for port in self.primary_ports() if self._nodes[port].running)

        def left() -> float:
            return max(1.0, timeout_s - (time.monotonic() - started))

        self._cli(["--cluster", "rebalance", f"127.0.0.1:{existing}", "--cluster-use-empty-masters"], left())
        _wait(self._agreed, left(), lambda: f"slot owners agreed after rebalance: {self._describe()}")
        return time.monotonic() - started

    def _cli(self, args: list[str], timeout_s: float) -> str:
        """Run ``redis-cli`` (killed after ``timeout_s``), logging its output to ``redis-cli.log``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(
                ["redis-cli", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as error:
            output = error.stdout.decode(errors="replace") if isinstance(error.stdout, bytes) else error.stdout or ""
            output = _ANSI.sub("", output)
            self._note(args, f"(timed out after {timeout_s}s)\n{output}")
            tail = " | ".join(output.splitlines()[-5:])
            raise AssertionError(
                f"Redis Cluster harness: redis-cli {' '.join(args[:2])} not done in {timeout_s}s ({tail}): "
                f"{self._describe()}"
            ) from None
        output = _ANSI.sub("", done.stdout + done.stderr)  # redis-cli colours its output even into a pipe
        self._note(args, output)
        if done.returncode != 0:
            tail = " | ".join(output.splitlines()[-5:])
            raise AssertionError(
                f"Redis Cluster harness: redis-cli {' '.join(args[:2])} failed ({done.returncode}: {tail}): "
                f"{self._describe()}"
            )
        return output

    def _note(self, args: list[str], output: str) -> None:
        with open(self.directory / "redis-cli.log", "a") as log:
            log.write(f"$ redis-cli {' '.join(args)}\n{output}\n")
