"""The host ring: which ring node fetches a host, by consistent hashing over weighted virtual nodes.

A node of weight w puts w points ("virtual nodes") on a 64-bit circle; a host belongs to the
node of the first point clockwise from the host's own point. Its share of the hosts is about
its weight over the total (the spread falls as weights grow: 100 points give about +-10 % of a
share). When a node leaves, only its hosts move, each to the next point's node; when one
joins, it takes hosts only from others, about its weight's share. Every process computes the
same owners from the same members, so nothing about the ring itself is stored or sent.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Mapping

__all__ = ["HostRing", "ring_point"]


def ring_point(text: str) -> int:
    """A point on the 64-bit circle (BLAKE2b: stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


class HostRing:
    """Owners of hosts for one set of members (node name -> weight); immutable.

    >>> ring = HostRing({"a@box": 150, "b@box": 80})
    >>> ring.owner("127.0.1.5:8800") in {"a@box", "b@box"}
    True
    >>> HostRing({}).owner("example.com") is None
    True
    """

    def __init__(self, members: Mapping[str, int]) -> None:
        self.members = {name: int(weight) for name, weight in members.items() if int(weight) > 0}
        points = sorted((ring_point(f"{name}#{index}"), name) for name, weight in self.members.items()
                        for index in range(weight))  # fmt: skip
        self._points = [point for point, _ in points]
        self._names = [name for _, name in points]

    def owner(self, host: str) -> str | None:
        """The node that fetches ``host`` (None: no node on the ring)."""
        if not self._points:
            return None
        index = bisect.bisect_right(self._points, ring_point(host)) % len(self._points)
        return self._names[index]

    def owners(self, hosts: Iterable[str]) -> dict[str, str]:
        """Host -> owner for many hosts (empty when no node is on the ring)."""
        if not self._points:
            return {}
        return {host: self._names[bisect.bisect_right(self._points, ring_point(host)) % len(self._points)]
                for host in hosts}  # fmt: skip

    def without(self, names: Iterable[str]) -> HostRing:
        """The ring once ``names`` have left."""
        gone = set(names)
        return HostRing({name: weight for name, weight in self.members.items() if name not in gone})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostRing) and other.members == self.members

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.members.items())))

    def __repr__(self) -> str:
        return f"HostRing({self.members!r})"
