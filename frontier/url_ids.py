"""``url_id``: one global id per URL, so the outputs of different jobs join on it.

The id is the first 64 bits of SHA-256 over the URL's dedup key (``canonical_url`` with the default
tracking parameters dropped, then ``dedup_key``), written as 16 lowercase hex digits: the same page
reached by any spelling a crawl treats as one gets one id, in every job, on every machine. Hex, not
a JSON number, because a 64-bit integer loses digits in JavaScript (the dashboard, most JSON tools).
"""

from __future__ import annotations

import functools
import hashlib

from frontier.urls import canonical_url, dedup_key

__all__ = ["url_id"]


@functools.lru_cache(maxsize=65_536)
def url_id(url: str) -> str:
    """Return the global id of ``url``.

    A URL that does not parse (no host, a bad port) gets the id of its text as given, stripped:
    such a URL is only ever met in a trail or a failure, never fetched.

    >>> url_id("HTTP://Example.COM:80/%7euser?utm_source=x#top") == url_id("http://example.com/~user")
    True
    >>> len(url_id("http://example.com/"))
    16
    """
    try:
        key = dedup_key(canonical_url(url))
    except ValueError:
        key = url.strip()
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
