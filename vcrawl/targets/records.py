"""Where a job's records go when not to JSON Lines parts: ``VCRAWL_RECORDS_URL``, a PostgreSQL URL.

``postgresql://user[:password]@host[:port]/database`` (``postgres://`` too). The password may be in
the URL, so the URL itself is never logged, echoed in an error or shown: ``redacted`` is.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["RECORDS_SCHEMES", "check_records_url", "redacted"]

RECORDS_SCHEMES = ("postgresql", "postgres")


def redacted(url: str) -> str:
    """``url`` with its password (if any) as ``***``.

    >>> redacted("postgresql://crawler:s3cret@db.example:5432/crawl")
    'postgresql://crawler:***@db.example:5432/crawl'
    >>> redacted("postgresql://crawler@db.example/crawl")
    'postgresql://crawler@db.example/crawl'
    """
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
    except ValueError:  # unreadable (a bad port): show the scheme only, never the rest
        return url.partition(":")[0] + "://***"


def check_records_url(url: str) -> None:
    """Check a records URL's shape (no connection is made).

    Raises:
        ValueError: not ``postgresql://``, no host, no database, or a bad port. The message never
            repeats the password.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"not a readable URL: {redacted(url)}") from None
    if parts.scheme not in RECORDS_SCHEMES:
        raise ValueError(f"must be a postgresql:// URL, got {redacted(url)}")
    if not parts.hostname:
        raise ValueError(f"names no host: {redacted(url)}")
    if not parts.path.strip("/"):
        raise ValueError(f"names no database (postgresql://user@host:port/DATABASE): {redacted(url)}")
    if port == 0:
        raise ValueError(f"port 0 is no port: {redacted(url)}")
