"""WARC/1.1 archives of fetched pages, gzip per record, with a CDXJ index next to every file.

A `WarcWriter` (one per worker process, shared by its threads) appends records to a local spool
file; when the file passes its size limit, or on `roll()` / `close()`, the finished file is
copied into the store with ``Storage.open_write`` (so local disk and HDFS alike, and readers
never see a partial file), its index ``<file>.cdxj`` is written next to it, and the spool is
deleted. Every record is its own gzip member, so `read_response` reads one capture back with a
single ranged read of ``length`` bytes at ``offset``, without scanning the file.

Index lines are CDXJ: ``<key> <14-digit timestamp> {json}``. The key is the captured URL itself
(spaces and control characters %-escaped): neither warcio nor a dependency of vcrawl provides
SURT, so ``lookup`` takes the URL as it was written (the crawler writes canonical URLs).

One module past ~500 lines on purpose: the writer, its spool, the per-batch stage, spool recovery,
the index and the reader share one record and index format (record framing, offsets, the CDXJ line:
``_write_capture``, ``CdxEntry``); split, each part would reach into the others' private spool.
"""

from __future__ import annotations

import fcntl
import io
import ipaddress
import json
import logging
import os
import re
import secrets
import socket
import tempfile
import threading
import zlib
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from http import HTTPStatus
from importlib.metadata import version
from io import BytesIO
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed
from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date, timestamp_to_iso_date
from warcio.warcwriter import WARCWriter

from storage.registry import Storage

__all__ = [
    "REVISIT_MIME",
    "SERVER_NOT_MODIFIED",
    "CdxEntry",
    "WarcStage",
    "WarcWriter",
    "lookup",
    "read_response",
    "recover_spools",
]

logger = logging.getLogger(__name__)

REVISIT_MIME = "warc/revisit"  # the CDX mime of a revisit record, as pywb and cdxj-indexer write it
# WARC/1.1 section 6.7: a revisit whose server answered 304 (the payload is that of the record referred to).
SERVER_NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
_CONFORMS_TO = "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"
_CHUNK = 1024 * 1024
_INDEX_PART = ".cdxj.part"  # a spool's index so far: '<file size after the capture> <CDXJ line>'
_TIMESTAMP = re.compile(r"^\d{14}$")
_WARC_DATE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")
_DIGEST = re.compile(r"^(?:sha1:)?([A-Z2-7]{32})$")
_BARE_DIGEST = re.compile(r"^[A-Z2-7]{32}$")
_WRITER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_KEY_UNSAFE = re.compile(r"[\x00-\x20\x7f]")
_LINE_BREAKS = re.compile(r"[\r\n]+")
# The crawler archives the decoded entity, so the wire's transfer framing no longer describes it.
_DECODED_AWAY = frozenset({"content-encoding", "transfer-encoding", "content-length"})


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
        if not _TIMESTAMP.match(self.timestamp):
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

    def to_line(self) -> str:
        """Return the CDXJ line ``<key> <timestamp> {json}`` (no newline)."""
        fields = asdict(self)
        del fields["timestamp"]
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
            return cls(timestamp=timestamp, **fields)
        except (ValueError, TypeError) as e:
            raise ValueError(f"not a CDXJ line of vcrawl: {line[:200]!r}: {e}") from e


_GZIP_LEVEL = 6

# Writes a capture's records into a spool; returns the indexed record and its (offset, length).
_RecordWrite = Callable[["_Spool"], tuple[Any, int, int]]


class _Spool:
    """One WARC file being written to local disk, and the index entries of its captures.

    In a spool directory the file is named after its storage location and locked while its
    writer lives, and each capture's index line goes to ``<file>.cdxj.part`` with the file's
    size after the capture: `recover_spools` ships what a killed writer left, whole captures only.
    """

    def __init__(self, location: str, spool_dir: str | None) -> None:
        self._index: Any = None
        if spool_dir is None:
            fd, self.path = tempfile.mkstemp(prefix="vcrawl-warc-", suffix=".warc.gz", dir=spool_dir)
            self.file = os.fdopen(fd, "w+b")
        else:
            self.path = os.path.join(spool_dir, quote(location, safe=""))
            self.file = open(self.path + ".new", "w+b")  # closed in discard
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX)  # a spool that can be locked is a dead writer's
            self._index = open(self.path + _INDEX_PART, "wb", buffering=0)  # closed in discard
            os.rename(self.path + ".new", self.path)
        # Records are serialized plain and gzipped here, one member each: warcio's own gzip
        # uses level 9, which costs about three times level 6 for a few percent of size.
        self._plain = io.BytesIO()
        self.writer = WARCWriter(self._plain, gzip=False, warc_version="1.1")
        self.location = location
        self.entries: list[CdxEntry] = []
        self.copied = False  # the WARC is in the store; only its index is missing

    def write(self, record: Any) -> tuple[int, int]:
        """Append `record` as its own gzip member; return its (offset, length) in the file."""
        offset = self.file.tell()
        self._plain.seek(0)
        self._plain.truncate()
        self.writer.write_record(record)
        compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS + 16)
        self.file.write(compressor.compress(self._plain.getbuffer()) + compressor.flush())
        return offset, self.file.tell() - offset

    def size(self) -> int:
        """Return the bytes written so far."""
        return self.file.tell()

    def note(self, entry: CdxEntry) -> None:
        """Keep `entry`; in a spool directory, put the capture on disk before the fetch is acknowledged."""
        self.entries.append(entry)
        if self._index is not None:
            self.file.flush()
            self._index.write(f"{self.file.tell()} {entry.to_line()}\n".encode())

    def discard(self) -> None:
        """Close and delete the local file (and its index part)."""
        if self._index is not None:
            os.unlink(self.path + _INDEX_PART)
            self._index.close()
        os.unlink(self.path)  # before closing: still locked, so no recovery ships it
        self.file.close()


class _Captures:
    """What every capture sink offers (a writer's file, a fetch batch's stage): the two kinds of capture."""

    def _capture(self, url: str, timestamp: str, status: int, mime: str, write: _RecordWrite) -> CdxEntry:
        raise NotImplementedError

    def write_exchange(
        self,
        url: str,
        *,
        request_headers: Mapping[str, str],
        status: int,
        reason: str,
        response_headers: Mapping[str, str],
        body: bytes,
        fetched_at: datetime,
        ip: str | None = None,
    ) -> CdxEntry:
        """Archive one fetch as a ``response`` record then a ``request`` record (``WARC-Concurrent-To``).

        `body` is the decoded entity, as the crawler keeps it: ``Content-Encoding`` and
        ``Transfer-Encoding`` are dropped from the archived headers and ``Content-Length`` is
        set to ``len(body)``. The request record holds ``GET <path?query> HTTP/1.1`` and
        `request_headers` (plus ``Host`` if absent). The entry is readable once its file ships.

        Raises:
            ValueError: not an http(s) URL, a naive `fetched_at`, a bad status or IP address.
        """
        target, host = _request_target(url)
        warc_date, timestamp = _warc_date(fetched_at)
        warc_headers = {"WARC-Date": warc_date}
        if ip is not None:
            warc_headers["WARC-IP-Address"] = str(ipaddress.ip_address(ip))
        response_http = StatusAndHeaders(
            _status_line(status, reason),
            [*_header_pairs(response_headers), ("Content-Length", str(len(body)))],
            protocol="HTTP/1.1",
        )
        sent = _header_pairs(request_headers, drop=frozenset())
        if not any(name.lower() == "host" for name, _ in sent):
            sent.insert(0, ("Host", host))
        request_http = StatusAndHeaders(f"GET {target} HTTP/1.1", sent, is_http_request=True)

        def write(spool: _Spool) -> tuple[Any, int, int]:
            response = spool.writer.create_warc_record(
                url,
                "response",
                payload=BytesIO(body),
                length=len(body),
                http_headers=response_http,
                warc_headers_dict=warc_headers,
            )
            request = spool.writer.create_warc_record(
                url,
                "request",
                payload=BytesIO(),
                length=0,
                http_headers=request_http,
                warc_headers_dict={
                    **warc_headers,
                    "WARC-Concurrent-To": response.rec_headers.get_header("WARC-Record-ID"),
                },
            )
            offset, length = spool.write(response)
            spool.write(request)
            return response, offset, length

        return self._capture(url, timestamp, status, _mime(response_headers), write)

    def write_revisit(
        self,
        url: str,
        *,
        fetched_at: datetime,
        status: int,
        response_headers: Mapping[str, str],
        refers_to_uri: str,
        refers_to_date: datetime | str,
        digest: str,
        not_modified: bool = False,
    ) -> CdxEntry:
        """Archive a re-fetch whose payload is unchanged as a ``revisit`` record (identical-payload-digest,
        or server-not-modified with `not_modified`: the server answered 304).

        The record holds the HTTP status and headers only; the payload, and so its length and
        encoding headers, are those of the capture it refers to. `refers_to_date` is a datetime,
        a 14-digit CDX timestamp or a WARC date; `digest` is base32 SHA-1 (``CdxEntry.digest``,
        with or without ``sha1:``), that of the capture referred to.

        Raises:
            ValueError: a malformed date, digest, status or URL.
        """
        _request_target(url)
        warc_date, timestamp = _warc_date(fetched_at)
        bare = _bare_digest(digest)
        http = StatusAndHeaders(_status_line(status, ""), _header_pairs(response_headers), protocol="HTTP/1.1")
        refers_date = _refers_to_date(refers_to_date)

        def write(spool: _Spool) -> tuple[Any, int, int]:
            record = spool.writer.create_revisit_record(
                url,
                f"sha1:{bare}",
                refers_to_uri,
                refers_to_date=refers_date,
                http_headers=http,
                warc_headers_dict={"WARC-Date": warc_date},
            )
            if not_modified:
                record.rec_headers.replace_header("WARC-Profile", SERVER_NOT_MODIFIED)
            offset, length = spool.write(record)
            return record, offset, length

        return self._capture(url, timestamp, status, REVISIT_MIME, write)


class WarcWriter(_Captures):
    """Writes captures of one worker process into rolling ``.warc.gz`` files; thread-safe.

    Files are ``{prefix}/{writer_id}-{seq:05d}.warc.gz`` (each with ``.cdxj`` next to it), so
    writers with distinct ids never share a file; the default id is ``{hostname}-{pid}-{start
    time in UTC, to the microsecond}-{4 random hex digits}``. A file is checked against
    ``max_file_bytes`` after each capture, so it may pass the limit by one capture.

    If copying a finished file into the store fails, the error propagates from the call that
    shipped it (a capture call that rolled the file has still recorded its capture), and the file
    stays in the spool directory, queued: every later write, `roll` and `close` ships the queue
    first (raising, before writing anything, while the store still fails).

    Make it in the worker process that uses it (after a fork), never before: a forked copy would
    share the spool file and the writer id.
    """

    def __init__(
        self,
        store: Storage,
        prefix: str,
        *,
        max_file_bytes: int = 1024**3,
        spool_dir: str | None = None,
        writer_id: str | None = None,
        software: str = "vcrawl",
        on_open: Callable[[], None] | None = None,
    ) -> None:
        """Check the arguments; no file is made before the first capture.

        ``on_open`` is called (under the writer's lock) when a file gets its first capture, before
        the capture is written: e.g. to note that this process holds output not shipped yet.

        Raises:
            ValueError: `max_file_bytes` is not positive, `prefix` is empty, or `writer_id` is not
                letters, digits and ``._-``.
            StorageRefused: the store refuses locations under `prefix`.
        """
        if max_file_bytes <= 0:
            raise ValueError(f"max_file_bytes must be positive, got {max_file_bytes}")
        self._prefix = prefix.rstrip("/")
        if not self._prefix:
            raise ValueError("the WARC prefix must not be empty")
        self.writer_id = _default_writer_id() if writer_id is None else writer_id
        if not _WRITER_ID.match(self.writer_id):
            raise ValueError(f"writer_id must be 1-128 of [A-Za-z0-9._-], got {self.writer_id!r}")
        store.resolve(self._location(1), self._location(1))  # refuse a bad prefix now, not at the first roll
        if spool_dir is not None:
            os.makedirs(spool_dir, exist_ok=True)
        self._store = store
        self._max_file_bytes = max_file_bytes
        self._spool_dir = spool_dir
        self._on_open = on_open
        self._info = {
            "software": f"{software} (warcio {version('warcio')})",
            "format": "WARC File Format 1.1",
            "conformsTo": _CONFORMS_TO,
            "hostname": socket.gethostname(),
        }
        self._lock = threading.Lock()  # guards the spool, the queue and the sequence number
        self._ship_lock = threading.Lock()  # one copy into the store at a time; writes go on meanwhile
        self._spool: _Spool | None = None
        self._queue: list[_Spool] = []
        self._seq = 0
        self._shipped: list[str] = []

    def __repr__(self) -> str:
        return f"WarcWriter({self._store!r}, {self._prefix!r}, writer_id={self.writer_id!r})"

    def __enter__(self) -> WarcWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def pending(self) -> bool:
        """True while a capture is not shipped yet (read without the lock: a hint, never blocks)."""
        return self._spool is not None or bool(self._queue)

    @property
    def shipped(self) -> list[str]:
        """Return the storage locations of the WARC files shipped so far, oldest first."""
        with self._lock:
            return list(self._shipped)

    def stage(self) -> WarcStage:
        """A stage for captures that may never count (a fetch batch's, until its release): see `commit`."""
        return WarcStage()

    def commit(self, stage: WarcStage) -> list[CdxEntry]:
        """Append the captures held in `stage` to the current file, in order; return their entries.

        Each capture is copied whole (its ``response`` and ``request`` members) and indexed at
        its place in the file; the stage is left empty (discarded).
        """
        self._ship_queue()
        entries, full = [], False
        try:
            with self._lock:
                for start, end, staged in stage.captures():
                    spool = self._current()
                    offset = spool.size()
                    spool.file.write(stage.read(start, end))
                    entry = replace(staged, warc=spool.location, offset=offset + staged.offset - start)
                    spool.note(entry)
                    entries.append(entry)
                    if spool.size() >= self._max_file_bytes:
                        logger.debug("WARC %s reached %d bytes; rolling", spool.location, spool.size())
                        self._finish_current()
                        full = True
        finally:
            stage.discard()
        if full:
            self._ship_queue()
        return entries

    def roll(self) -> None:
        """Finish the current file and ship it (if it holds a capture); the next capture starts a new file."""
        with self._lock:
            self._finish_current()
        self._ship_queue(wait=True)

    def close(self) -> None:
        """Ship the current file and any queued one; call it on worker shutdown (the writer stays usable)."""
        self.roll()

    def _capture(self, url: str, timestamp: str, status: int, mime: str, write: _RecordWrite) -> CdxEntry:
        self._ship_queue()
        with self._lock:
            spool = self._current()
            entry = _write_capture(spool, spool.location, url, timestamp, status, mime, write)
            spool.note(entry)
            full = spool.size() >= self._max_file_bytes
            if full:
                logger.debug("WARC %s reached %d bytes; rolling", spool.location, spool.size())
                self._finish_current()
        if full:
            self._ship_queue()
        return entry

    def _current(self) -> _Spool:
        if self._spool is None:
            if self._on_open is not None:
                self._on_open()
            self._seq += 1
            spool = _Spool(self._location(self._seq), self._spool_dir)
            spool.write(spool.writer.create_warcinfo_record(spool.location.rsplit("/", 1)[-1], self._info))
            self._spool = spool
        return self._spool

    def _finish_current(self) -> None:
        spool, self._spool = self._spool, None
        if spool is None:
            return
        if spool.entries:
            self._queue.append(spool)
        else:  # only a warcinfo record (every capture in it failed): not worth a file
            spool.discard()
            self._seq -= 1

    def _ship_queue(self, wait: bool = False) -> None:
        """Ship the queued files; with `wait`, also wait for a shipment another thread is making."""
        if not wait:
            with self._lock:
                if not self._queue:
                    return
        with self._ship_lock:
            while True:
                with self._lock:
                    if not self._queue:
                        return
                    spool = self._queue.pop(0)
                try:
                    self._ship(spool)
                except BaseException:
                    logger.warning("shipping WARC %s failed; kept in %s for the next try", spool.location, spool.path)
                    with self._lock:
                        self._queue.insert(0, spool)
                    raise

    def _ship(self, spool: _Spool) -> None:
        if not spool.copied:
            spool.file.flush()
            spool.file.seek(0)
            with self._store.open_write(spool.location) as out:
                while chunk := spool.file.read(_CHUNK):
                    out.write(chunk)
            spool.copied = True
        # Written after the WARC, so an index never names a file that is not there.
        lines = sorted(entry.to_line() for entry in spool.entries)
        self._store.write_bytes(f"{spool.location}.cdxj", ("\n".join(lines) + "\n").encode("utf-8"))
        size = spool.size()
        spool.discard()
        with self._lock:
            self._shipped.append(spool.location)
        logger.info("shipped WARC %s: %d captures, %d bytes", spool.location, len(lines), size)

    def _location(self, seq: int) -> str:
        return f"{self._prefix}/{self.writer_id}-{seq:05d}.warc.gz"


class WarcStage(_Captures):
    """Captures held in a local temporary file until a `WarcWriter.commit` appends them, or `discard`.

    For a fetch batch whose captures must count only if its release still holds the lease: a
    batch taken over by another worker (this one was stopped past the node timeout) must not be
    archived twice. Not thread-safe: one batch, one thread. Nothing of it survives the process:
    a batch that never released is fetched again.
    """

    def __init__(self) -> None:
        self._spool: _Spool | None = None
        self._captures: list[tuple[int, int, CdxEntry]] = []  # (start, end) of each capture's members

    def __len__(self) -> int:
        return len(self._captures)

    def captures(self) -> list[tuple[int, int, CdxEntry]]:
        """Each capture's (start, end) in the stage and its entry (``offset`` in the stage's file)."""
        return list(self._captures)

    def read(self, start: int, end: int) -> bytes:
        """The stage's bytes from `start` to `end`."""
        assert self._spool is not None
        self._spool.file.flush()
        self._spool.file.seek(start)
        data = self._spool.file.read(end - start)
        self._spool.file.seek(0, os.SEEK_END)
        return data

    def discard(self) -> None:
        """Drop every capture held (and the temporary file)."""
        spool, self._spool = self._spool, None
        self._captures = []
        if spool is not None:
            spool.discard()

    def _capture(self, url: str, timestamp: str, status: int, mime: str, write: _RecordWrite) -> CdxEntry:
        if self._spool is None:
            self._spool = _Spool("staged", None)
        start = self._spool.size()
        entry = _write_capture(self._spool, "", url, timestamp, status, mime, write)
        self._captures.append((start, self._spool.size(), entry))
        return entry


def _write_capture(
    spool: _Spool, location: str, url: str, timestamp: str, status: int, mime: str, write: _RecordWrite
) -> CdxEntry:
    """Write one capture at the end of ``spool``; return its index line (``location``: the file it names)."""
    mark = spool.size()
    try:
        record, offset, length = write(spool)
    except BaseException:
        # Cut the half-written member off, so the file stays a valid WARC.
        spool.file.seek(mark)
        spool.file.truncate()
        raise
    return CdxEntry(
        url=url,
        timestamp=timestamp,
        status=status,
        digest=_bare_digest(record.rec_headers.get_header("WARC-Payload-Digest")),
        mime=mime,
        warc=location,
        offset=offset,
        length=length,
    )


def recover_spools(store: Storage, spool_dir: str) -> list[str]:
    """Ship the WARC files that killed writers left in `spool_dir`, with their indexes; return them.

    Only whole captures are kept: the file is cut after the last capture its index part names.
    Each file goes to the location its writer would have shipped it to, so doing this twice
    writes the same file again.
    """
    shipped: list[str] = []
    directory = Path(spool_dir)
    if not directory.is_dir():
        return shipped
    for path in sorted(directory.glob("*.warc.gz")):
        try:
            spool = open(path, "rb")  # closed by the with below
        except FileNotFoundError:
            continue
        with spool:
            try:
                fcntl.flock(spool.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its writer is alive
            if not path.exists():
                continue
            location = unquote(path.name)
            index_part = Path(str(path) + _INDEX_PART)
            end, lines = _whole_captures(index_part, os.fstat(spool.fileno()).st_size)
            if lines:
                with store.open_write(location) as out:
                    left = end
                    while left and (chunk := spool.read(min(_CHUNK, left))):
                        out.write(chunk)
                        left -= len(chunk)
                store.write_bytes(f"{location}.cdxj", ("\n".join(sorted(lines)) + "\n").encode("utf-8"))
                shipped.append(location)
                logger.warning("shipped WARC %s (%d captures) a stopped worker left in %s", location, len(lines), path)
            index_part.unlink(missing_ok=True)
            path.unlink()
    return shipped


def _whole_captures(index_part: Path, size: int) -> tuple[int, list[str]]:
    """(bytes of whole captures, their index lines) from an index part; a cut last line is dropped."""
    end, lines = 0, []
    try:
        data = index_part.read_bytes()
    except FileNotFoundError:
        return 0, []
    for raw in data.split(b"\n")[:-1]:  # the part after the last newline is cut short
        offset_text, _, line = raw.decode("utf-8", "replace").partition(" ")
        if not offset_text.isdigit() or int(offset_text) > size:
            break
        end = int(offset_text)
        lines.append(line)
    return end, lines


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


def _default_writer_id() -> str:
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", socket.gethostname()).strip(".-")[:63] or "host"
    started = datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")
    # The random part keeps two writers made in the same microsecond of one process apart too.
    return f"{host}-{os.getpid()}-{started}-{secrets.token_hex(2)}"


def _request_target(url: str) -> tuple[str, str]:
    """Return the request line target (path?query) and the Host header value of `url`."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise ValueError(f"WARC captures need an http(s) URL, got {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return target, parts.netloc.rsplit("@", 1)[-1]


def _warc_date(when: datetime) -> tuple[str, str]:
    """Return the WARC-Date and the 14-digit timestamp of `when`, both to the second, in UTC.

    Whole seconds, so a revisit's ``WARC-Refers-To-Date`` made from a CDX timestamp equals the
    ``WARC-Date`` of the record it refers to (WARC/1.1 makes fractions optional).
    """
    if when.tzinfo is None:
        raise ValueError(f"fetched_at must be timezone-aware, got {when!r}")
    utc = when.astimezone(UTC).replace(tzinfo=None, microsecond=0)
    return datetime_to_iso_date(utc), utc.strftime("%Y%m%d%H%M%S")


def _refers_to_date(value: datetime | str) -> str:
    if isinstance(value, datetime):
        return _warc_date(value)[0]
    if _TIMESTAMP.match(value):
        return timestamp_to_iso_date(value)
    if _WARC_DATE.match(value):
        return value
    raise ValueError(f"refers_to_date must be a datetime, 14 digits or a WARC date, got {value!r}")


def _bare_digest(digest: str) -> str:
    """Return the base32 of a SHA-1 digest given with or without its ``sha1:`` label."""
    match = _DIGEST.match(digest)
    if match is None:
        raise ValueError(f"digest must be a base32 SHA-1 (optionally 'sha1:'-prefixed), got {digest!r}")
    return match.group(1)


def _status_line(status: int, reason: str) -> str:
    if not 100 <= status <= 999:
        raise ValueError(f"HTTP status must be 100-999, got {status}")
    if not reason:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            return str(status)
    return f"{status} {_LINE_BREAKS.sub(' ', reason)}"


def _header_pairs(headers: Mapping[str, str], drop: frozenset[str] = _DECODED_AWAY) -> list[tuple[str, str]]:
    # A line break inside a header from the web would split the archived header block.
    return [
        (_LINE_BREAKS.sub(" ", name), _LINE_BREAKS.sub(" ", value))
        for name, value in headers.items()
        if name.lower() not in drop
    ]


def _mime(headers: Mapping[str, str]) -> str:
    for name, value in headers.items():
        if name.lower() == "content-type":
            return value.split(";", 1)[0].strip().lower() or "unk"
    return "unk"
