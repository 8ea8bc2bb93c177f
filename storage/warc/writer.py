"""Rolling ``.warc.gz`` files of one worker process (`WarcWriter`): naming, rolling, and shipping them.

A finished file is copied into the store with ``Storage.open_write``, then its ``.cdxj`` index
is written next to it, then its spool is deleted; a file that fails to ship stays queued.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from importlib.metadata import version
from types import TracebackType

from storage.registry import Storage
from storage.warc.capture import Captures, RecordWrite, write_capture
from storage.warc.index import CdxEntry, write_index
from storage.warc.spool import Spool
from storage.warc.stage import WarcStage

__all__ = ["WarcWriter"]

logger = logging.getLogger(__name__)

_CONFORMS_TO = "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"
_WRITER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class WarcWriter(Captures):
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
        self._spool: Spool | None = None
        self._queue: list[Spool] = []
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

    def _capture(self, url: str, timestamp: str, status: int, mime: str, write: RecordWrite) -> CdxEntry:
        self._ship_queue()
        with self._lock:
            spool = self._current()
            entry = write_capture(spool, spool.location, url, timestamp, status, mime, write)
            spool.note(entry)
            full = spool.size() >= self._max_file_bytes
            if full:
                logger.debug("WARC %s reached %d bytes; rolling", spool.location, spool.size())
                self._finish_current()
        if full:
            self._ship_queue()
        return entry

    def _current(self) -> Spool:
        if self._spool is None:
            if self._on_open is not None:
                self._on_open()
            self._seq += 1
            spool = Spool(self._location(self._seq), self._spool_dir)
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

    def _ship(self, spool: Spool) -> None:
        spool.copy_into(self._store)
        # Written after the WARC, so an index never names a file that is not there.
        write_index(self._store, spool.location, (entry.to_line() for entry in spool.entries))
        size = spool.size()
        spool.discard()
        with self._lock:
            self._shipped.append(spool.location)
        logger.info("shipped WARC %s: %d captures, %d bytes", spool.location, len(spool.entries), size)

    def _location(self, seq: int) -> str:
        return f"{self._prefix}/{self.writer_id}-{seq:05d}.warc.gz"


def _default_writer_id() -> str:
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", socket.gethostname()).strip(".-")[:63] or "host"
    started = datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")
    # The random part keeps two writers made in the same microsecond of one process apart too.
    return f"{host}-{os.getpid()}-{started}-{secrets.token_hex(2)}"
