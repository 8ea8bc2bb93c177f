"""Who holds which broker message, in plain data: the sweep's rule and what a dead member held.

The Redis and kombu side is ``tasks.broker.holdings.BrokerHoldings``; ``cluster.membership`` uses it through
the ``Holdings`` protocol below.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from cluster.members import Membership
from engine.fetch_batch import BUNDLE_SEPARATOR, FETCH_ID_PREFIX

__all__ = [
    "GRACE_S",
    "SKEW_S",
    "HeldMessage",
    "Holder",
    "Holdings",
    "claims_said_since",
    "held_fetch_batches",
    "orphans",
]

GRACE_S = 5.0  # a message younger than this is never swept: its worker may not have said it holds it yet
SKEW_S = 2.0  # clocks of machines differ (kombu stamps deliveries with the worker's clock)


@dataclass(frozen=True)
class Holder:
    """What one member said it holds, and when (ms, Redis clock)."""

    name: str
    at_ms: int
    tags: frozenset[str]
    pid: int = 0
    machine: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {"at": self.at_ms, "pid": self.pid, "machine": self.machine, "tags": sorted(self.tags)},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, name: str, raw: str | bytes) -> Holder:
        data = json.loads(raw)
        return cls(name, int(data.get("at", 0)), frozenset(data.get("tags", ())), int(data.get("pid", 0)),
                   str(data.get("machine", "")))  # fmt: skip


@dataclass(frozen=True)
class HeldMessage:
    """One unacknowledged message: its delivery tag, task id and queue (routing key); ``refills``: the batches
    its run leased for itself besides those its task id names (a fetch bundle's, ``tasks.broker.bundle_ledger``)."""

    tag: str
    task_id: str
    queue: str
    refills: tuple[str, ...] = ()


def orphans(
    delivered: Mapping[str, float],
    holders: Mapping[str, Holder],
    membership: Membership,
    grace_s: float = GRACE_S,
    skew_s: float = SKEW_S,
) -> list[str]:
    """The unacknowledged messages (tag -> delivery time, epoch seconds) nobody holds: to put back.

    A message is an orphan when it is older than ``grace_s``, every live member wrote its holdings
    after it was delivered (less ``skew_s``), and no member that is not declared down claims it (a
    silent member's messages wait for its declaration, which hands them over at once).

    >>> from cluster.members import NodeInfo, NodeRegistration
    >>> alive = NodeInfo(NodeRegistration("a", 0, "q"), True, 100_000)
    >>> m = Membership(100_000, 30_000, (alive,))
    >>> held = {"a": Holder("a", 99_000, frozenset({"t1"}))}
    >>> orphans({"t1": 80.0, "t2": 80.0, "t3": 98.0}, held, m)
    ['t2']
    """
    now_s = membership.now_ms / 1000
    cutoff = now_s - grace_s
    for node in membership.nodes:
        if node.alive:
            holder = holders.get(node.name)
            if holder is None:
                return []  # a live member that never said what it holds: it may hold anything
            cutoff = min(cutoff, holder.at_ms / 1000 - skew_s)
    claimed: set[str] = set()
    for name, holder in holders.items():
        node = membership.node(name)
        if node is None or node.down_at_ms is None:
            claimed |= holder.tags
    return sorted(tag for tag, at in delivered.items() if at < cutoff and tag not in claimed)


def claims_said_since(
    holders: Mapping[str, Holder], membership: Membership, words_before: Mapping[str, int]
) -> frozenset[str] | None:
    """What the members hold, once every live member has said it again since ``words_before``
    (member -> the time of its word then); None while one has not.

    A word from before (a Redis failover keeps the replica's copy) may lack a message its member
    took a moment before, and still runs. Clock-free: a word is new when its time is not the one
    noted then. Members declared down claim nothing; their messages were handed over.

    >>> from cluster.members import NodeInfo, NodeRegistration
    >>> alive = NodeInfo(NodeRegistration("a", 0, "q"), True, 100_000)
    >>> m = Membership(100_000, 30_000, (alive,))
    >>> claims_said_since({"a": Holder("a", 99_000, frozenset({"t1"}))}, m, {"a": 99_000}) is None
    True
    >>> sorted(claims_said_since({"a": Holder("a", 99_500, frozenset({"t1"}))}, m, {"a": 99_000}))
    ['t1']
    """
    for node in membership.nodes:
        if node.alive:
            holder = holders.get(node.name)
            if holder is None or words_before.get(node.name) == holder.at_ms:
                return None
    return frozenset(
        tag
        for name, holder in holders.items()
        if (node := membership.node(name)) is None or node.down_at_ms is None
        for tag in holder.tags
    )


def held_fetch_batches(messages: Iterable[HeldMessage]) -> dict[str, list[str]]:
    """Job id -> batch ids of the fetch messages among ``messages`` (their task ids name them; a
    bundle's names all its batches), and the batches their runs leased for themselves (``refills``).

    >>> held_fetch_batches([HeldMessage("t", "vcrawl-fetch:j1:7.ab", "download"), HeldMessage("u", "x", "analysis"),
    ...                     HeldMessage("v", "vcrawl-fetch:j1:8.cd+9.ef", "download", ("10.gh",))])
    {'j1': ['7.ab', '8.cd', '9.ef', '10.gh']}
    """
    batches: dict[str, list[str]] = {}
    for message in messages:
        if message.task_id.startswith(FETCH_ID_PREFIX):
            job_id, _, batch_id = message.task_id[len(FETCH_ID_PREFIX) :].rpartition(":")
            if job_id and batch_id:
                batches.setdefault(job_id, []).extend([*batch_id.split(BUNDLE_SEPARATOR), *message.refills])
    return batches


class Holdings(Protocol):
    """What the membership thread needs of the broker's holdings (``tasks.broker.holdings.BrokerHoldings``)."""

    def report(self, name: str, at_ms: int) -> None: ...

    def held_by(self, name: str) -> list[HeldMessage]: ...

    def restore(self, tags: Collection[str]) -> int: ...

    def orphans(self, membership: Membership) -> list[HeldMessage]: ...

    def forget(self, name: str) -> None: ...
