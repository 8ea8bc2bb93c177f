"""The CDXJ index of a WARC file: its line (`CdxEntry`), its ``<file>.cdxj`` file, and `lookup` in it.

Index lines are CDXJ: ``<key> <14-digit timestamp> {json}``. The key is the captured URL itself
(spaces and control characters %-escaped): neither warcio nor a dependency of vcrawl provides
SURT, so ``lookup`` takes the URL as it was written (the crawler writes canonical URLs).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from frontier.url_ids import url_id
from storage.registry import Storage

__all__ = ["REVISIT_MIME", "CdxEntry", "lookup"]  # TIMESTAMP and write_index are package-internal

REVISIT_MIME = "warc/revisit"  # the CDX mime of a revisit record, as pywb and cdxj-indexer write it
TIMESTAMP = re.compile(r"^\d{14}$")  # package-internal: capture.py also reads revisit dates with it
_BARE_DIGEST = re.compile(r"^[A-Z2-7]{32}$")
_KEY_UNSAFE = re.compile(r"[\x00-\x20\x7f]")


@dataclass(frozen=True)
class CdxEntry:
    """Where one capture (a ``response`` or ``revisit`` record) is: one line of a ``.cdxj`` index.

    ``timestamp`` is the 14-digit UTC fetch time; ``digest`` the bare base32 SHA-1 payload digest;
    ``mime`` the response's media type (``unk`` if none, ``warc/revisit`` for a revisit);
    ``offset`` / ``length`` the gzip member holding the record in the WARC file at storage
    location ``warc``.
    """

    url: str
    timestamp: str
    status: int
    digest: str
    mime: str
    warc: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        for name in ("url", "timestamp", "digest", "mime", "warc"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"CdxEntry.{name} must be a str, got {getattr(self, name)!r}")
        for name in ("status", "offset", "length"):
            if type(getattr(self, name)) is not int:
                raise ValueError(f"CdxEntry.{name} must be an int, got {getattr(self, name)!r}")
        if not TIMESTAMP.match(self.timestamp):
            raise ValueError(f"CdxEntry.timestamp must be 14 digits, got {self.timestamp!r}")
        if not _BARE_DIGEST.match(self.digest):
            raise ValueError(f"CdxEntry.digest must be a bare base32 SHA-1, got {self.digest!r}")
        if self.offset < 0 or self.length <= 0:
            raise ValueError(f"CdxEntry needs offset >= 0 and length > 0, got {self.offset}, {self.length}")

    @property
    def key(self) -> str:
        """Return the index key of this capture (its URL, %-escaping spaces and control characters)."""
        return _index_key(self.url)

    @property
    def is_revisit(self) -> bool:
        """Return True if the record is a revisit (its payload is in the record it refers to)."""
        return self.mime == REVISIT_MIME

    @property
    def url_id(self) -> str:
        """The URL's global id (``frontier.url_ids``), as the line and the WARC record carry it."""
        return url_id(self.url)

    def to_line(self) -> str:
        """Return the CDXJ line ``<key> <timestamp> {json}`` (no newline); the JSON holds ``url_id`` too."""
        fields = asdict(self)
        del fields["timestamp"]
        fields["url_id"] = self.url_id
        return f"{self.key} {self.timestamp} {json.dumps(fields, separators=(',', ':'))}"

    @classmethod
    def from_line(cls, line: str) -> CdxEntry:
        """Parse a line written by `to_line`.

        Raises:
            ValueError: the line is not a CdxEntry line.
        """
        try:
            _key, timestamp, data = line.rstrip("\r\n").split(" ", 2)
            fields = json.loads(data)
            fields.pop("url_id", None)  # derived from the URL (indexes written before it lack it)
            return cls(timestamp=timestamp, **fields)
        except (ValueError, TypeError) as e:
            raise ValueError(f"not a CDXJ line of vcrawl: {line[:200]!r}: {e}") from e


def write_index(store: Storage, warc_location: str, lines: Iterable[str]) -> None:
    """Store the index lines of the WARC file at `warc_location`, sorted, as ``<warc_location>.cdxj``.

    Package-internal: the writer and spool recovery ship indexes with it.
    """
    store.write_bytes(f"{warc_location}.cdxj", ("\n".join(sorted(lines)) + "\n").encode("utf-8"))


def lookup(store: Storage, index_location: str, url: str) -> list[CdxEntry]:
    """Return the captures of `url` listed in the ``.cdxj`` index at `index_location`, oldest first.

    Raises:
        MissingPage: there is no index there.
        ValueError: a line of the index is malformed.
    """
    lines = store.read_bytes(index_location).decode("utf-8").splitlines()
    keys = [line.split(" ", 1)[0] for line in lines]
    key = _index_key(url)
    found = []
    for i in range(bisect_left(keys, key), len(keys)):
        if keys[i] != key:
            break
        found.append(CdxEntry.from_line(lines[i]))
    return found


def _index_key(url: str) -> str:
    """Return the index key of `url`: the URL with spaces and control characters %-escaped.

    >>> _index_key("http://example.com/a b")
    'http://example.com/a%20b'
    """
    return _KEY_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", url)
