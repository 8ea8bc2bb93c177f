"""Seen-URL filter: a Bloom filter in Redis bitmaps, split over several keys (segments).

Debian's Redis has no Bloom module, so the filter is plain strings read and written with
``BITFIELD`` from one Lua script (``frontier/lua/bloom_check_and_add.lua``). Every URL
belongs to exactly one segment and all its k bits live there, so one check-and-add touches
one key: segments can sit on different Redis Cluster nodes (each key carries its own hash
tag ``{<name>:<i>}``) and no string comes near Redis's 512 MB limit.

Hashing happens in Python: ``blake2b`` (128 bits) gives two 64-bit words h1, h2. The
segment is ``h1 % segments``; the first offset is ``(h1 // segments) % segment_bits``
(quotient and remainder of a uniform word are independent) and the step is
``h2 % segment_bits``, forced odd; offset i is ``first + i * step`` (Kirsch-Mitzenmacher
double hashing). The offsets are computed in Python and sent as strings: Lua numbers are
doubles, so 64-bit arithmetic is not exact there, and measured on this machine Redis
spent 7.1 us/URL with ready offsets against 9.5 us/URL when Lua derived them from two
32-bit values. Redis CPU is what all workers share, so the client does the arithmetic.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import cast

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from frontier.scripts import lua_source
from frontier.urls import dedup_key
from vcrawl import redis_keys

__all__ = [
    "DEFAULT_SEGMENT_BITS",
    "MAX_BATCH",
    "MAX_SEGMENT_BITS",
    "BloomFilter",
    "RecentUrls",
    "bloom_bits",
    "bloom_hashes",
    "expected_fpr",
]

DEFAULT_SEGMENT_BITS = 2**27
"""128 Mbit = 16 MiB per segment key."""

MAX_SEGMENT_BITS = 2**32
"""BITFIELD offsets address one string of at most 512 MB = 2**32 bits."""

MAX_BATCH = 1000
"""Advised most URLs per batch: a script call blocks Redis ~10 us per URL at k=7, ~25 us at k=20."""

logger = logging.getLogger(__name__)


def bloom_bits(capacity: int, error_rate: float) -> int:
    """Return the bits m = -n ln p / (ln 2)^2 that hold ``capacity`` items at ``error_rate``.

    >>> bloom_bits(1_000_000, 0.01)
    9585059
    >>> bloom_bits(6_000, 0.000001)
    172532
    """
    _check_sizing(capacity, error_rate)
    return math.ceil(-capacity * math.log(error_rate) / math.log(2) ** 2)


def bloom_hashes(bits: int, capacity: int) -> int:
    """Return the best number of hash functions k = round(m / n ln 2), at least 1.

    >>> bloom_hashes(9585059, 1_000_000)
    7
    >>> bloom_hashes(100, 1_000_000)
    1
    """
    if bits < 1 or capacity < 1:
        raise ValueError(f"bits and capacity must be >= 1, got {bits} and {capacity}")
    return max(1, round(bits / capacity * math.log(2)))


def expected_fpr(bits: int, hashes: int, items: int) -> float:
    """Return the false-positive rate (1 - e^(-k n / m))^k after ``items`` distinct adds.

    >>> round(expected_fpr(9585059, 7, 1_000_000), 5)
    0.01004
    >>> expected_fpr(9585059, 7, 0)
    0.0
    """
    if bits < 1 or hashes < 1 or items < 0:
        raise ValueError(f"need bits >= 1, hashes >= 1, items >= 0; got {bits}, {hashes}, {items}")
    return (1.0 - math.exp(-hashes * items / bits)) ** hashes


class BloomFilter:
    """A Bloom filter of seen URLs in Redis; each check-and-add is atomic, so it is shared safely.

    It never forgets and never reports a seen URL as new; a new URL is reported as seen with
    about ``error_rate`` probability once ``capacity`` distinct URLs were added (more beyond).
    Batches are one network round trip: one script call per segment, all in one pipeline.
    Keep batches to about ``MAX_BATCH`` URLs, since each script call blocks Redis while it runs.
    """

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        capacity: int,
        error_rate: float = 0.01,
        segment_bits: int = DEFAULT_SEGMENT_BITS,
        segment_key: Callable[[int], str] | None = None,
    ) -> None:
        """Size the filter; no Redis call happens until it is used.

        Args:
            segment_key: Key of segment i. The default, ``vcrawl:bloom:{<name>:<i>}``, gives each
                segment its own hash tag so a big filter spreads over cluster nodes; pass keys that
                share a hash tag with others when one script must touch them together.

        Raises:
            ValueError: a size, rate or name out of range.
        """
        _check_sizing(capacity, error_rate)
        if not name or "{" in name or "}" in name:
            raise ValueError(f"filter name must be non-empty and without braces (hash tags), got {name!r}")
        if not 8 <= segment_bits <= MAX_SEGMENT_BITS or segment_bits % 8:
            raise ValueError(f"segment_bits must be a multiple of 8 in [8, 2**32], got {segment_bits}")
        wanted = bloom_bits(capacity, error_rate)
        self._segments = math.ceil(wanted / segment_bits)
        # Whole bytes per segment, so the step forced odd below is never 0 modulo the size.
        self._segment_bits = min(segment_bits, math.ceil(wanted / self._segments / 8) * 8)
        self._hashes = bloom_hashes(self.bits, capacity)
        self._redis = client
        key_of = segment_key if segment_key is not None else lambda index: redis_keys.bloom_segment(name, index)
        self._keys = tuple(key_of(i) for i in range(self._segments))
        self._script: Script = client.register_script(lua_source("bloom_check_and_add"))
        logger.debug(
            "bloom filter %s: %d items at %g -> %d bits in %d segment(s), %d hashes",
            name, capacity, error_rate, self.bits, self._segments, self._hashes,
        )  # fmt: skip

    @property
    def bits(self) -> int:
        """Total bits over all segments (m)."""
        return self._segments * self._segment_bits

    @property
    def hashes(self) -> int:
        """Bits set per URL (k)."""
        return self._hashes

    @property
    def segments(self) -> int:
        """Number of segment keys."""
        return self._segments

    @property
    def keys(self) -> tuple[str, ...]:
        """The Redis keys of the segments (for EXPIRE or inspection; they exist once written)."""
        return self._keys

    def seen_before(self, canonical_url: str) -> bool:
        """Add ``canonical_url`` and return True if it was (probably) added before."""
        return self.seen_before_many([canonical_url])[0]

    def seen_before_many(self, urls: Sequence[str]) -> list[bool]:
        """Add every URL in order; return, per URL, whether it was (probably) added before."""
        return self._run(urls, add=True)

    def has_seen_many(self, urls: Sequence[str]) -> list[bool]:
        """Return, per URL, whether it was (probably) added before, without adding anything."""
        return self._run(urls, add=False)

    def locate(self, canonical_url: str) -> tuple[int, list[str]]:
        """Return the segment index and the k bit offsets of a URL (of its ``dedup_key``), for inline dedup."""
        key = dedup_key(canonical_url)
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        h1 = int.from_bytes(digest[:8], "little")
        h2 = int.from_bytes(digest[8:], "little") | 1
        size = self._segment_bits
        segment, rest = h1 % self._segments, h1 // self._segments
        # size is a multiple of 8, so an odd h2 stays odd (and non-zero) modulo size.
        first, step = rest % size, h2 % size
        return segment, [str((first + i * step) % size) for i in range(self._hashes)]

    def memory_bytes(self) -> int:
        """Return the bytes of bitmap allocated so far (sum of STRLEN; Redis adds a few bytes per key)."""
        pipe = self._redis.pipeline(transaction=False)
        for key in self._keys:
            pipe.strlen(key)
        return sum(pipe.execute())

    def clear(self) -> None:
        """Forget every URL by deleting the segment keys (UNLINK: freed off the main thread)."""
        pipe = self._redis.pipeline(transaction=False)
        for key in self._keys:
            pipe.unlink(key)  # one key per command: segments may live in different cluster slots
        pipe.execute()
        logger.debug("bloom filter segments cleared: %s", self._keys[0])

    def _run(self, urls: Sequence[str], *, add: bool) -> list[bool]:
        by_segment: dict[int, tuple[list[int], list[str]]] = {}
        for index, url in enumerate(urls):
            segment, offsets = self.locate(url)
            indexes, args = by_segment.setdefault(segment, ([], [str(self._hashes), "1" if add else "0"]))
            indexes.append(index)
            args.extend(offsets)
        if not by_segment:
            return []
        segments = list(by_segment)
        replies = self._execute([(self._keys[s], by_segment[s][1]) for s in segments])
        found = [False] * len(urls)
        for segment, reply in zip(segments, replies, strict=True):
            for index, flag in zip(by_segment[segment][0], reply, strict=True):
                found[index] = flag == 1
        return found

    def _execute(self, calls: list[tuple[str, list[str]]]) -> list[list[int]]:
        # EVALSHA in a plain pipeline: redis-py's Script objects would add a SCRIPT EXISTS round
        # trip to every pipeline. A NOSCRIPT reply (server restarted, failed over, SCRIPT FLUSH)
        # means that call did not run, so loading the script and sending it again is safe.
        if isinstance(self._redis, RedisCluster):  # redis-py refuses a script in a cluster pipeline
            return [cast(list[int], self._script(keys=[key], args=args)) for key, args in calls]
        replies: list[object] = [None] * len(calls)
        pending = list(range(len(calls)))
        for attempt in range(2):
            pipe = self._redis.pipeline(transaction=False)
            for i in pending:
                key, args = calls[i]
                pipe.evalsha(self._script.sha, 1, key, *args)
            for i, reply in zip(pending, pipe.execute(raise_on_error=False), strict=True):
                replies[i] = reply
            pending = [i for i in pending if isinstance(replies[i], NoScriptError)]
            if not pending or attempt == 1:
                break
            logger.debug("bloom script missing on the server (NOSCRIPT): loading it again")
            self._script.sha = self._redis.script_load(self._script.script)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return cast(list[list[int]], replies)


def _check_sizing(capacity: int, error_rate: float) -> None:
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if not 0.0 < error_rate < 1.0:
        raise ValueError(f"error_rate must be in (0, 1), got {error_rate}")


class RecentUrls:
    """URLs this process knows the Bloom filter holds: a bounded, thread-safe set (oldest out first).

    Most links of a site are links seen before (navigation, the home page on every page): in
    the shared universe 97 % of a page's links. Dropping those here, before hashing and
    sending them, spares the admission script most of its arguments. Only URLs the filter
    certainly holds may be added, so a skip here never loses a URL.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._urls: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, url: object) -> bool:
        return url in self._urls

    def __len__(self) -> int:
        return len(self._urls)

    def add_all(self, urls: Iterable[str]) -> None:
        """Remember ``urls``, forgetting the oldest beyond the capacity."""
        with self._lock:
            for url in urls:
                self._urls[url] = None
            while len(self._urls) > self._capacity:
                self._urls.popitem(last=False)
