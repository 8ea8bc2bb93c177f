"""Reading one capture back from a stored WARC file (`read_response`): one ranged read, digest checked."""

from __future__ import annotations

from io import BytesIO

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed

from storage.registry import Storage
from storage.warc.index import CdxEntry

__all__ = ["read_response"]


def read_response(store: Storage, entry: CdxEntry) -> tuple[int, dict[str, str], bytes]:
    """Return (status, headers, body) of the capture `entry` names, reading only its own bytes.

    The payload digest is verified; a revisit's body is ``b""`` (look up its ``refers_to``
    capture for the payload). Repeated header names are joined with ``", "``.

    Raises:
        MissingPage: the WARC file is not in the store.
        ValueError: the bytes there are not a valid capture of ``entry.url`` (a stale index).
    """
    data = store.read_bytes(entry.warc, entry.offset, entry.length)
    where = f"{entry.warc} at {entry.offset}+{entry.length}"
    if len(data) != entry.length:
        raise ValueError(f"{where}: the file ends after {len(data)} bytes")
    try:
        record = next(iter(ArchiveIterator(BytesIO(data), check_digests="raise")), None)
        if record is None or record.rec_type not in ("response", "revisit"):
            raise ValueError(f"{where}: no response or revisit record")
        if record.rec_headers.get_header("WARC-Target-URI") != entry.url:
            raise ValueError(f"{where}: the record is not a capture of {entry.url}")
        body = record.content_stream().read()  # reading to the end checks the payload digest
    except ArchiveLoadFailed as e:
        raise ValueError(f"{where}: not a valid WARC record: {e}") from e
    headers: dict[str, str] = {}
    for name, value in record.http_headers.headers:
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return int(record.http_headers.get_statuscode()), headers, body
