"""The ``near-duplicates`` batch analyzer: clusters of stored pages with the same or nearly the same content.

Two tests, both documented in docs/analysis.md:

- **identical**: the SHA-256 of the stored body. Every page whose body is byte for byte another's
  is in that page's cluster (URL aliases: ``?id=``, sort orders, session parameters).
- **near**: a 64-bit SimHash (Charikar) of the page's visible text, over 5-word shingles. Pages
  whose fingerprints differ in at most ``MAX_DISTANCE`` bits are clustered too, found by banding:
  with the fingerprint cut in ``MAX_DISTANCE + 1`` bands, two fingerprints that close share one
  band exactly, so only pages sharing a band are compared.

Only HTML pages get a SimHash; other bodies (PDF, images) cluster by identity alone.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from analyzers.batch import CrawledUrl, MapContext
from analyzers.page import Page, is_html

__all__ = ["MAX_DISTANCE", "NearDuplicates", "simhash"]

MAX_DISTANCE = 3  # of 64 bits: the threshold Manku, Jain and Das Sarma used for web pages (WWW 2007)
SHINGLE_WORDS = 5
_BANDS = MAX_DISTANCE + 1
_BAND_BITS = 64 // _BANDS
_WORD = re.compile(r"\w+")
_INVISIBLE = ("script", "style", "noscript", "template")
_BITS_OF = [[bit for bit in range(8) if value >> bit & 1] for value in range(256)]  # set bits of a byte


class NearDuplicates:
    """Map: each stored page's SHA-256 and SimHash. Reduce: the clusters."""

    def map(self, urls: Sequence[CrawledUrl], context: MapContext) -> dict[str, Any]:
        """Fingerprint the chunk's stored pages."""
        pages = []
        for crawled in urls:
            if crawled.page is None:
                continue
            digest = hashlib.sha256(crawled.page.body).hexdigest()
            fingerprint = simhash(_words(crawled.page)) if is_html(crawled.content_type) else None
            pages.append([crawled.url, digest, None if fingerprint is None else f"{fingerprint:016x}"])
        return {"pages": pages}

    def reduce(self, partials: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """Cluster the pages: identical bodies, then SimHashes within ``MAX_DISTANCE`` bits."""
        by_digest: dict[str, list[str]] = defaultdict(list)
        fingerprints: dict[str, int] = {}  # one per distinct body
        for partial in partials:
            for url, digest, fingerprint in partial["pages"]:
                by_digest[digest].append(url)
                if fingerprint is not None:
                    fingerprints[digest] = int(fingerprint, 16)
        parent = {digest: digest for digest in by_digest}
        for first, second in _close_pairs(fingerprints):
            parent[_root(parent, first)] = _root(parent, second)
        groups: dict[str, list[str]] = defaultdict(list)
        for digest in by_digest:
            groups[_root(parent, digest)].append(digest)
        clusters = []
        for digests in groups.values():
            urls = sorted(url for digest in digests for url in by_digest[digest])
            if len(urls) > 1:
                clusters.append({"size": len(urls), "identical": len(digests) == 1, "urls": urls})
        clusters.sort(key=lambda cluster: (-cluster["size"], cluster["urls"][0]))
        return {
            "method": f"sha256 of the body; simhash64 of {SHINGLE_WORDS}-word shingles, <= {MAX_DISTANCE} bits apart",
            "pages": sum(len(urls) for urls in by_digest.values()),
            "clustered_pages": sum(cluster["size"] for cluster in clusters),
            "clusters": clusters,
        }


def simhash(words: Sequence[str]) -> int:
    """Charikar's SimHash of the ``SHINGLE_WORDS``-word shingles of ``words`` (64 bits).

    >>> a = simhash("the quick brown fox jumps over the lazy dog again and again".split())
    >>> a == simhash("the quick brown fox jumps over the lazy dog again and again".split())
    True
    >>> bin(a ^ simhash("a completely different text about nothing in particular at all".split())).count("1") > 10
    True
    """
    shingles = {" ".join(words[i : i + SHINGLE_WORDS]) for i in range(max(1, len(words) - SHINGLE_WORDS + 1))}
    digests = [hashlib.blake2b(shingle.encode(), digest_size=8).digest() for shingle in shingles]
    fingerprint = 0
    # Bit b of byte p is set in more than half the digests: counted per byte value (C-speed Counter),
    # not per bit and shingle, which is ten times slower on a 4,000-word page.
    for position in range(8):
        ones = [0] * 8
        for value, count in Counter(digest[position] for digest in digests).items():
            for bit in _BITS_OF[value]:
                ones[bit] += count
        for bit, count in enumerate(ones):
            if 2 * count > len(digests):
                fingerprint |= 1 << (8 * (7 - position) + bit)
    return fingerprint


def _words(page: Page) -> list[str]:
    tree = page.tree
    body = tree.find("body")
    root = body if body is not None else tree
    texts = [
        text
        for element in root.iter()
        if isinstance(element.tag, str) and element.tag not in _INVISIBLE
        for text in (element.text, element.tail)
        if text
    ]
    return _WORD.findall(" ".join(texts).lower())


def _close_pairs(fingerprints: dict[str, int]) -> Iterable[tuple[str, str]]:
    """Pairs of keys whose fingerprints differ in at most MAX_DISTANCE bits (banding: no all-pairs scan)."""
    seen: set[tuple[str, str]] = set()
    for band in range(_BANDS):
        shift = band * _BAND_BITS
        buckets: dict[int, list[str]] = defaultdict(list)
        for key, value in fingerprints.items():
            buckets[(value >> shift) & ((1 << _BAND_BITS) - 1)].append(key)
        for keys in buckets.values():
            for i, first in enumerate(keys):
                for second in keys[i + 1 :]:
                    pair = (first, second) if first < second else (second, first)
                    if pair in seen:
                        continue
                    seen.add(pair)
                    if bin(fingerprints[first] ^ fingerprints[second]).count("1") <= MAX_DISTANCE:
                        yield pair


def _root(parent: dict[str, str], key: str) -> str:
    while parent[key] != key:
        parent[key] = parent[parent[key]]
        key = parent[key]
    return key
