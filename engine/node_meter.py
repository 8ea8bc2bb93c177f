"""What this process's fetches did on the wire, for its node's statistics (``vcrawl nodes``).

Every request the fetch step sends (a page, robots.txt; every page type) adds to the process's
``NodeMeter``: one request (and one per redirect it followed), the bytes of the body it brought,
the seconds it took and its host. Each URL's outcome adds a success (a page stored) or a failure (a
final failure or a retry: the URL's request brought no page). Nothing goes to Redis here: the
worker's membership thread takes the tally with each heartbeat (``cluster.node_stats``), so a page
costs no Redis round trip of its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from engine.outcomes import Failed, FetchOutcome, Retry, Stored
from frontier import host_key

__all__ = ["NodeMeter", "NodeTally"]

_MOST_HOSTS_KEPT = 10_000  # between two takes (a heartbeat apart): the HyperLogLog counts them, no more


@dataclass(frozen=True)
class NodeTally:
    """What the process's fetches added up to since the last take."""

    requests: int = 0
    successes: int = 0
    failures: int = 0
    bytes: int = 0
    busy_s: float = 0.0
    hosts: frozenset[str] = field(default_factory=frozenset)

    @property
    def empty(self) -> bool:
        """True when nothing was fetched (nothing to write)."""
        return not (self.requests or self.successes or self.failures)


class NodeMeter:
    """This process's fetch counters since the last ``take``; shared by its threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "successes": 0, "failures": 0, "bytes": 0}
        self._busy_s = 0.0
        self._hosts: set[str] = set()

    def request(self, url: str, body_bytes: int, seconds: float, redirects: int = 0) -> None:
        """Count one request to ``url`` (and the ``redirects`` it followed): its body and its time."""
        try:
            host = host_key(url)
        except ValueError:  # a URL the fetcher took has a host; a plug-in's odd one is counted without
            host = ""
        with self._lock:
            self._counts["requests"] += 1 + max(0, redirects)
            self._counts["bytes"] += max(0, body_bytes)
            self._busy_s += max(0.0, seconds)
            if host and len(self._hosts) < _MOST_HOSTS_KEPT:
                self._hosts.add(host)

    def outcome(self, outcome: FetchOutcome) -> None:
        """Count a URL's outcome: a stored page is a success; a final failure or a retry, a failure."""
        if isinstance(outcome, Stored):
            kind = "successes"
        elif isinstance(outcome, Failed | Retry):
            kind = "failures"
        else:  # a redirect, robots.txt read or blocking, unchanged, a sitemap: neither
            return
        with self._lock:
            self._counts[kind] += 1

    def take(self) -> NodeTally:
        """The tally since the last take, and start a new one."""
        with self._lock:
            tally = NodeTally(busy_s=self._busy_s, hosts=frozenset(self._hosts), **self._counts)
            self._counts = dict.fromkeys(self._counts, 0)
            self._busy_s = 0.0
            self._hosts = set()
        return tally

    def put_back(self, tally: NodeTally) -> None:
        """Add a tally that could not be written (Redis away) to the next one."""
        with self._lock:
            for name in self._counts:
                self._counts[name] += getattr(tally, name)
            self._busy_s += tally.busy_s
            self._hosts |= set(list(tally.hosts)[: max(0, _MOST_HOSTS_KEPT - len(self._hosts))])
