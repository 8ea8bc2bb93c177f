"""The membership at work: workers beat, watchers hand a dead member's work over, and the listing.

Every worker is a member: it runs a ``RingKeeper`` thread next to its frontier pump that beats
(``NodeRegistry.beat``) every ``beat_s`` and, with each beat, says which broker messages it holds
(``Holdings.report``). A ring node beats with its weight and owns hosts; a plain worker beats with
weight 0 and owns none. Every worker also watches: a member silent for longer than the node
timeout (plus a grace that lets every process's view of the ring catch up) is claimed down by
exactly one watcher, which

1. takes back every leased batch of every running job whose host the dead node owned, and every
   batch whose fetch message the dead member held, so the URLs go out again now, not when the
   leases run out (``FrontierQueue.hand_over``: no attempt counted, each host waits its interval
   or Crawl-delay from now);
2. puts the messages the dead member held unacknowledged back on their queues (a fetch finds its
   lease gone and fetches nothing; an analysis or an admission runs again, which is harmless);
3. moves the messages left on a dead ring node's own queue to the shared download queue, where any
   worker passes each on to its host's owner now (``pass_on_to``); their leases are gone, so the
   owner finds them stale (``start_lease``) or, if the dead node had fetched and released the
   batch but died before its analysis was sent, sends that analysis;
4. counts it (``vcrawl nodes``) and sends one alert.

Between deaths, the sweep (``NodeWatcher.sweep``) puts back every unacknowledged message no live
member holds: an acknowledgement lost in a Redis restart, a delivery on a connection that dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from cluster.holdings import HeldMessage, Holdings, held_fetch_batches
from cluster.members import Membership, NodeInfo, NodeRegistration, NodeRegistry, RingView
from cluster.node_stats import NodeStatsWriter
from cluster.ring import HostRing
from engine.runtime_cache import RuntimeCache
from frontier import Batch, Frontier
from telemetry.alerts import Alert
from vcrawl.errors import VcrawlError

__all__ = [
    "MAX_HOPS",
    "NODE_QUEUE_PREFIX",
    "HandoverReport",
    "HeldWork",
    "NodeWatcher",
    "RingKeeper",
    "node_queue",
    "nodes_listing",
    "pass_on_to",
    "registration_for",
]

logger = logging.getLogger(__name__)

# After a node's timeout, how long before its work is handed over: every process reads the ring
# again within a second (RingView), so by then no pump still sends batches to the dead node.
HANDOVER_GRACE_MS = 2000
_WATCH_EVERY_S = 1.0


NODE_QUEUE_PREFIX = "download.node."
# A batch is passed on at most this often: views of the ring may differ for a second while a
# node joins or leaves; after that the holder fetches it rather than bounce it about.
MAX_HOPS = 2


def node_queue(name: str) -> str:
    """The download queue a ring node consumes besides the shared ones."""
    return NODE_QUEUE_PREFIX + name


def pass_on_to(batch: Batch, arrived_on: str | None, owner_queue: str | None) -> str | None:
    """The queue to pass a fetch batch on to (its host's owner now), or None to fetch it here.

    >>> b = Batch("1", "h:80", ())
    >>> pass_on_to(b, "download.node.a@x", "download.node.b@x"), pass_on_to(b, "download", None)
    ('download.node.b@x', None)
    >>> pass_on_to(b, "download.node.b@x", "download.node.b@x"), pass_on_to(replace(b, hops=2), "download", "q")
    (None, None)
    """
    if owner_queue is None or owner_queue == arrived_on or batch.hops >= MAX_HOPS:
        return None
    return owner_queue


@dataclass(frozen=True)
class HandoverReport:
    """What one dead member's handover did."""

    node: str
    batches: int
    urls: int
    messages_moved: int
    jobs: int
    messages_restored: int = 0


@dataclass(frozen=True)
class HeldWork:
    """What a dead member held: its unacknowledged messages and the fetch batches among them."""

    messages: tuple[HeldMessage, ...] = ()

    @property
    def fetch_batches(self) -> dict[str, list[str]]:
        return held_fetch_batches(self.messages)


class NodeWatcher:
    """Finds silent ring nodes and hands their work over (one watcher per death)."""

    def __init__(
        self,
        frontier: Frontier,
        registry: NodeRegistry,
        runtimes: RuntimeCache,
        drain_queue: Callable[[str], int],
        alert: Callable[[str, Alert], Any] | None = None,
        holdings: Holdings | None = None,
    ) -> None:
        self._frontier = frontier
        self._registry = registry
        self._runtimes = runtimes
        self._drain_queue = drain_queue  # a node's queue -> messages moved to the shared one
        self._alert = alert
        self._holdings = holdings  # None: nobody says what they hold (a dead member's messages wait)

    def check(self, membership: Membership | None = None) -> list[HandoverReport]:
        """Hand over the work of every node silent past its timeout and the grace."""
        membership = membership or self._registry.membership()
        for node in membership.nodes:
            if node.down_at_ms is not None and not node.alive and node.weight > 0:
                moved = self._drain_queue(node.queue)  # its unacknowledged messages, come back
                if moved:
                    logger.info("ring node %s is down: %d of its messages moved to the shared queue", node.name, moved)
        silent = membership.silent()
        deadline = membership.now_ms - membership.timeout_ms - HANDOVER_GRACE_MS
        due = [node for node in silent if (node.last_beat_ms or 0) < deadline]
        if not due:
            return []
        # The ring they were on: the alive nodes and every node going down now.
        before = HostRing({node.name: node.weight for node in membership.nodes if node.alive or node in silent})
        reports = []
        for node in due:
            if self._registry.claim_down(node):
                reports.append(self._hand_over(node, before, membership))
        return reports

    def sweep(self, membership: Membership) -> int:
        """Put back every unacknowledged message no live member holds; return how many went back.

        The leases of the fetch batches among them are handed back first: a worker that took one
        just before it froze (its last word did not list it yet) finds its lease gone if it thaws.
        """
        if self._holdings is None:
            return 0
        lost = HeldWork(tuple(self._holdings.orphans(membership)))
        if not lost.messages:
            return 0
        urls = self.hand_back(lost.fetch_batches)
        restored = self._holdings.restore([message.tag for message in lost.messages])
        if restored:
            queues = sorted({message.queue for message in lost.messages if message.queue})
            logger.warning("%d unacknowledged message(s) no live worker holds put back on %s (%d URLs of "
                           "their fetch batches handed back)", restored, ", ".join(queues) or "their queues",
                           urls)  # fmt: skip
        return restored

    def hand_back(self, batches: Mapping[str, list[str]]) -> int:
        """Hand back the leases of ``batches`` (job -> batch ids) that are still leased; return the URLs."""
        urls = 0
        for job_id, batch_ids in batches.items():
            leased = self._frontier.queue.leased_hosts(job_id)
            mine = sorted(batch_id for batch_id in batch_ids if batch_id in leased)
            if mine:
                urls += self._frontier.queue.hand_over(job_id, mine, self._interval_ms(job_id))
        return urls

    def _hand_over(self, node: NodeInfo, before: HostRing, membership: Membership) -> HandoverReport:
        held = HeldWork(tuple(self._holdings.held_by(node.name))) if self._holdings is not None else HeldWork()
        held_batches = held.fetch_batches
        batches = urls = jobs = 0
        for job_id in self._frontier.jobs.running_jobs():
            leased = self._frontier.queue.leased_hosts(job_id)
            owners = before.owners(set(leased.values()))
            mine = {batch_id for batch_id, host in leased.items() if owners.get(host) == node.name}
            # A batch whose fetch the dead member held: a member that only froze must find its lease gone.
            mine |= {batch_id for batch_id in held_batches.get(job_id, ()) if batch_id in leased}
            if not mine:
                continue
            urls += self._frontier.queue.hand_over(job_id, sorted(mine), self._interval_ms(job_id))
            batches += len(mine)
            jobs += 1
        # After the hand-over: a fetch message put back finds its lease gone and fetches nothing.
        restored = self._holdings.restore([message.tag for message in held.messages]) if self._holdings else 0
        moved = self._drain_queue(node.queue) if node.weight > 0 else 0
        left = node.last_beat_ms == 0
        report = HandoverReport(node.name, batches, urls, moved, jobs, restored)
        if left and node.weight == 0:
            # A plain worker that stopped cleanly: nothing to report, nothing to keep.
            self._registry.forget(node.name)
            if self._holdings is not None:
                self._holdings.forget(node.name)
            return report
        self._registry.note_down(node.name, {"batches": batches, "urls": urls, "moved": moved, "restored": restored})
        silent_s = (membership.now_ms - (node.last_beat_ms or 0)) / 1000 if node.last_beat_ms else None
        kind = "ring node" if node.weight > 0 else "worker"
        silent = "?" if silent_s is None else f"{silent_s:.0f}"
        logger.warning("%s %s is down (silent %s s): %d batches (%d URLs) of %d jobs handed over, %d held "
                       "message(s) put back, %d moved from %s to the shared queue", kind, node.name, silent,
                       batches, urls, jobs, restored, moved, node.queue)  # fmt: skip
        if self._alert is not None:
            gone = (
                ("left the ring." if node.weight > 0 else "left.")
                if left
                else f"sent no heartbeat for {silent_s or 0:.0f} s."
            )
            what = (f"Its hosts moved to the other nodes: {batches} batches ({urls} URLs) handed over"
                    if node.weight > 0 else f"{batches} batches ({urls} URLs) handed over")  # fmt: skip
            self._alert(
                f"node:{node.name}:down",
                Alert(
                    subject=f"{kind} {node.name} {'left' if left else 'down'}",
                    text=f"{kind.capitalize()} {node.name} (weight {node.weight}) "
                    + f"{gone} {what}, {restored} message(s) it held put back on their queues.",
                    details={
                        "node": node.name,
                        "weight": node.weight,
                        "batches": batches,
                        "urls": urls,
                        "messages_moved": moved,
                        "messages_restored": restored,
                        "alive_nodes": len(before.members) - (1 if node.weight > 0 else 0),
                    },
                ),
            )
        return report

    def _interval_ms(self, job_id: str) -> float:
        try:
            runtime = self._runtimes.get(job_id, self._frontier.jobs.cycle(job_id))
            return runtime.spec.politeness.min_interval_s * 1000
        except VcrawlError:
            return 0.0  # the host still waits its Crawl-delay, if it has one


class RingKeeper:
    """A worker's membership thread: beat and say what it holds, watch for dead members, sweep."""

    def __init__(
        self,
        registry: NodeRegistry,
        watcher: NodeWatcher,
        registration: NodeRegistration | None,
        beat_s: float,
        view: RingView | None = None,
        counters: Callable[[], Mapping[str, int]] | None = None,
        holdings: Holdings | None = None,
        stats: NodeStatsWriter | None = None,
    ) -> None:
        self._holdings = holdings
        self._stats = stats  # this process's fetch counters, written with each beat (``cluster.node_stats``)
        self._registry = registry
        self._counters = counters  # this process's connection and DNS counters, sent with each beat
        self._watcher = watcher
        self._registration = registration  # None: this process watches but is no member (no worker name)
        self._beat_s = beat_s
        self._view = view
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pages = (time.monotonic(), -1)
        self._rate = 0.0

    def start(self) -> RingKeeper:
        if self._registration is not None:
            try:  # on the ring before the first batch is routed
                beat_ms = self._registry.beat(self._registration)
                if self._stats is not None:
                    self._stats.join(self._registration.name, beat_ms)
                if self._view is not None:
                    self._view.invalidate()
            except Exception:
                logger.exception("ring: first heartbeat of %s failed", self._registration.name)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="vcrawl-ring", daemon=True)
        self._thread.start()
        return self

    def stop(self, leave: bool = True, timeout_s: float = 5.0) -> None:
        """Stop; the member leaves (a ring node's hosts and batches move at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if leave and self._registration is not None:
            try:
                self._flush_stats(int(time.time() * 1000))
                self._registry.beat(self._registration, leaving=True)
                self._watcher.check()
            except Exception:
                logger.exception("ring: %s could not leave the ring cleanly", self._registration.name)

    def hand_back(self, batches: Mapping[str, list[str]]) -> int:
        """Hand back the leases of ``batches`` (job -> batch ids) still leased (``NodeWatcher.hand_back``)."""
        return self._watcher.hand_back(batches)

    def beat_once(self) -> None:
        if self._registration is None:
            return
        name = self._registration.name
        now = time.monotonic()
        pages = self._registry.pages(name)
        then, before = self._pages
        if before >= 0 and now > then:
            # Smoothed over ~10 s, so the listing shows a rate, not one beat's burst.
            alpha = min(1.0, (now - then) / 10.0)
            self._rate += alpha * ((pages - before) / (now - then) - self._rate)
        self._pages = (now, pages)
        counters = dict(self._counters()) if self._counters is not None else {}
        registration = replace(self._registration, pages_per_s=round(self._rate, 2), **counters)
        beat_ms = self._registry.beat(registration)
        if self._holdings is not None:
            # Taken after the beat: whatever it was given before then, it lists now if it still holds it.
            self._holdings.report(name, beat_ms)
        self._flush_stats(beat_ms)

    def _flush_stats(self, at_ms: int) -> None:
        """Write this process's fetch counters for its node (counted in the minute of ``at_ms``)."""
        if self._stats is not None and self._registration is not None:
            self._stats.flush(self._registration.name, at_ms)

    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_beat:
                    self.beat_once()
                    next_beat = time.monotonic() + self._beat_s
                membership = self._registry.membership()
                self._watcher.check(membership)
                self._watcher.sweep(membership)
            except Exception:  # Redis restarting: beat again when it is back
                logger.warning("ring: heartbeat, watch or sweep failed", exc_info=True)
            self._stop.wait(min(_WATCH_EVERY_S, self._beat_s))


def registration_for(name: str, weight: int) -> NodeRegistration:
    """This process's registration as ring node ``name``."""
    return NodeRegistration(name, weight, node_queue(name), socket.gethostname(), os.getpid(), time.time())


def nodes_listing(
    membership: Membership,
    frontier: Frontier,
    with_hosts: bool = True,
    held: Mapping[str, int] | None = None,
    taken_over: Mapping[str, Mapping[str, Any]] | None = None,
    stats: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """What ``vcrawl nodes --json`` and the API show: every member, and the hosts each ring node owns now.

    Hosts are those of the running jobs; their owners come from the same ring the pumps route by.
    ``held``: member -> broker messages it holds unacknowledged; ``taken_over``: a down member ->
    what was handed over when it was declared down; ``stats``: member -> its fetch statistics
    (``cluster.node_stats``).
    """
    hosts: set[str] = set()
    for job_id in frontier.jobs.running_jobs():
        hosts |= frontier.queue.known_hosts(job_id)
    owners = membership.ring.owners(hosts)
    owned: dict[str, list[str]] = {}
    for host, owner in owners.items():
        owned.setdefault(owner, []).append(host)
    total_weight = sum(node.weight for node in membership.nodes if node.alive)
    rows = []
    for node in membership.nodes:
        mine = sorted(owned.get(node.name, ()))
        last = node.last_beat_ms or None
        row: dict[str, Any] = {
            "name": node.name,
            "weight": node.weight,
            "alive": node.alive,
            "state": "up" if node.alive else ("left" if node.last_beat_ms == 0 else "down"),
            "share": round(node.weight / total_weight, 4) if node.alive and total_weight else 0.0,
            "hosts_owned": len(mine),
            "pages": node.pages,
            "pages_per_s": node.registration.pages_per_s if node.alive else 0.0,
            "last_heartbeat": None if last is None else last / 1000,
            "heartbeat_age_s": None if last is None else round((membership.now_ms - last) / 1000, 1),
            "down_at": None if node.down_at_ms is None else node.down_at_ms / 1000,
            "connections_opened": node.registration.connections_opened,
            "dns_lookups": node.registration.dns_lookups,
            "dns_hits": node.registration.dns_hits,
            "queue": node.queue,
            "machine": node.registration.machine,
            "pid": node.registration.pid,
            "role": "ring" if node.weight > 0 else "worker",
            "held_messages": int((held or {}).get(node.name, 0)),
            "taken_over": dict((taken_over or {}).get(node.name, {})) if node.down_at_ms is not None else None,
            "concurrency": node.registration.concurrency,
            "stats": dict((stats or {}).get(node.name, {})) or None,
        }
        if with_hosts:
            row["hosts"] = mine
        rows.append(row)
    return {
        "nodes": rows,
        "alive": sum(1 for node in membership.nodes if node.alive),
        "down": sum(1 for node in membership.nodes if not node.alive and node.last_beat_ms != 0),
        "hosts": len(hosts),
        "unowned_hosts": len(hosts) - len(owners),
        "node_timeout_s": membership.timeout_ms / 1000,
        "at": membership.now_ms / 1000,
    }
