"""What moves through the frontier: queued entries, leased batches, and the requests and replies of its calls."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from frontier.dedup import BloomFilter
from frontier.history import UrlHistory

__all__ = ["Admission", "AdmitRequest", "Batch", "BatchRelease", "Candidate", "CycleStart", "Entry", "PumpResult"]


@dataclass(frozen=True)
class Entry:
    """A URL waiting in the frontier: canonical URL, depth, attempts so far, redirects left."""

    url: str
    depth: int = 0
    attempt: int = 0
    redirects_left: int = 5
    not_before_s: float = 0.0  # a retry waiting for its Retry-After (epoch seconds); 0: fetch when leased
    # A sitemap to read, not a page: its nesting level (1: named by the job or robots.txt, 2: listed
    # in a sitemap index, ...); 0: a page.
    sitemap: int = 0

    def encode(self) -> str:
        """Compact JSON; the frontier moves these strings around without parsing them."""
        data: dict[str, object] = {"u": self.url, "d": self.depth, "a": self.attempt, "r": self.redirects_left}
        if self.not_before_s:
            data["n"] = round(self.not_before_s, 3)
        if self.sitemap:
            data["s"] = self.sitemap
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Entry:
        """Inverse of ``encode``."""
        data = json.loads(text)
        not_before_s = float(data["n"]) if "n" in data else 0.0
        if not math.isfinite(not_before_s):
            raise ValueError(f"Entry.not_before_s must be finite, got {not_before_s!r}")
        return cls(data["u"], data["d"], data["a"], data["r"], not_before_s, int(data.get("s", 0)))


@dataclass(frozen=True)
class Candidate:
    """A canonical URL that passed the filters, with its frontier host key and its priority
    (read by priority jobs only: higher goes first)."""

    host: str
    entry: Entry
    priority: float = 0.0


@dataclass(frozen=True)
class Admission:
    """What an admission call did."""

    completed: bool
    repeated: bool
    admitted: int
    duplicates: int
    over_limit: int
    not_due: int = 0


@dataclass(frozen=True)
class Batch:
    """URLs of one host leased to one fetch task."""

    batch_id: str
    host: str
    entries: tuple[Entry, ...]
    cycle: int = 0  # a scheduled job's cycle; 0 for a one-off job
    paced: bool = False  # the host waits between requests (interval, Crawl-delay): late = slower
    hops: int = 0  # times a ring node passed it on to the host's owner (the ring changed on the way)
    due_in_s: float = 0.0  # from the pump's reply: its host is due this much later (not carried in messages)

    def to_dict(self) -> dict[str, object]:
        """The JSON form carried by a fetch message."""
        entries = [entry.encode() for entry in self.entries]
        data: dict[str, object] = {"id": self.batch_id, "host": self.host, "entries": entries}
        if self.cycle:
            data["cycle"] = self.cycle
        if self.paced:
            data["paced"] = True
        if self.hops:
            data["hops"] = self.hops
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Batch:
        """Inverse of ``to_dict``.

        Raises:
            ValueError: a malformed batch.
        """
        try:
            entries = tuple(Entry.decode(text) for text in data["entries"])  # type: ignore[union-attr]
            paced = data.get("paced", False)
            if not isinstance(paced, bool):
                raise ValueError(f"Batch.paced must be true or false, got {paced!r}")
            hops = int(data.get("hops", 0))  # type: ignore[call-overload]
            return cls(str(data["id"]), str(data["host"]), entries, int(data.get("cycle", 0)), paced, hops)  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise ValueError(f"malformed batch: {exc}") from None


@dataclass(frozen=True)
class PumpResult:
    """What one pump call dispatched, and in how many seconds the next host is due (None: none)."""

    batches: tuple[Batch, ...]
    next_due_s: float | None
    stopped: bool = False


@dataclass(frozen=True)
class CycleStart:
    """What ``JobLifecycle.new_cycle`` did: ``started``, ``resumed`` (same firing again) or ``skipped``
    (the previous cycle still runs), the cycle number, and how many known URLs were due."""

    status: str
    cycle: int
    due: int


@dataclass(frozen=True)
class BatchRelease:
    """What a finished fetch batch hands back to the frontier (``FrontierQueue.release``).

    The host is due again ``pause_ms`` after the batch started, never before now, and not
    before ``host_delay_ms`` from now. ``done``: URLs of the batch finished here (failed,
    blocked, unchanged...), ``host_done`` the same plus the pages handed on to analysis.
    ``requeue`` go back to the front of their depth, ``requeue_back`` behind everything the host
    has queued (retries waiting for a Retry-After). ``crawl_delay_s`` is what the batch's fetches
    found (None: no Crawl-delay); a batch that ``fetched`` nothing leaves what is known about the
    host as it is. ``history``: revisit records (scheduled jobs) written with the release;
    ``failures``: final failures (url, reason, at) for the job's recent failures. ``handed_on``:
    what the batch hands to its analysis (JSON, '' for nothing), kept until that analysis admits.
    ``throttle``: how the host's run of 429/503 answers goes on (``politeness.retry_after: auto``).
    """

    pause_ms: float
    done: int
    host_delay_ms: float = 0.0
    requeue: tuple[Entry, ...] = ()
    requeue_back: tuple[Entry, ...] = ()
    counters: Mapping[str, int] = field(default_factory=dict)
    crawl_delay_s: float | None = None
    history: Mapping[str, UrlHistory] = field(default_factory=dict)
    failures: tuple[Mapping[str, object], ...] = ()
    host_done: int = 0
    fetched: bool = True
    handed_on: str = ""
    throttle: str = ""  # the host's 429/503 streak: "=N" set (something else was answered), "+N" add, "" keep


@dataclass(frozen=True)
class AdmitRequest:
    """Candidates to dedup and queue, with what the same call applies (``FrontierQueue.admit``).

    ``done``: URLs the call finishes (after queueing their links). A ``token`` seen before makes
    the call a no-op (a retried task admits once). ``counters`` are added to the job's.
    ``history_mode`` is for scheduled jobs: 1 for seeds and due URLs, 2 for links found on pages
    (see ``frontier/lua/admit.lua``). A ``cycle`` other than the job's current one makes the call
    a no-op (reported as ``repeated``); ``history`` records are written in the same step.
    ``analysed``: the fetch batches this call finishes (batch id, its URLs done; their sum is
    ``done``), all of one partition; what their releases kept for a lost analysis is dropped in
    the same round trip.
    """

    candidates: Sequence[Candidate]
    bloom: BloomFilter
    max_pages: int
    per_host: int
    done: int = 0
    token: str = ""
    counters: Mapping[str, int] = field(default_factory=dict)
    history_mode: int = 0
    cycle: int = 0
    history: Mapping[str, UrlHistory] = field(default_factory=dict)
    analysed: tuple[tuple[str, int], ...] = ()
