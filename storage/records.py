"""Records from analyzers as JSON Lines: one part file per worker process and job, rolled by size.

Lines are collected in a local spool file and a part is shipped into the store whole
(through ``Storage.open_write``, so it works the same on local disk and on HDFS), when it
passes ``max_part_bytes``, when it is older than ``max_part_age_s``, and when the worker
shuts down. A part file therefore only ever holds whole lines, from one writer.

With a ``spool_dir``, each line reaches the spool file (unbuffered) before ``append`` returns,
so before the analysis task is acknowledged: a worker killed with records not yet shipped
leaves its spool behind, locked no more, and `recover_spools` (run when a worker starts)
ships it under the part name it would have had. Shipping twice writes the same part again.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from storage.registry import Storage

__all__ = ["RecordWriter", "export_records", "read_records", "recover_spools", "write_records"]

_SPOOL_SUFFIX = ".jsonl"
_PREFIX_END = "@"  # spool name: quote(prefix) @ part name (quote leaves no "@")

logger = logging.getLogger(__name__)


class RecordWriter:
    """Appends records of one job; thread-safe; ships whole part files into the store."""

    def __init__(
        self,
        store: Storage,
        prefix: str,
        *,
        max_part_bytes: int = 64 * 1024 * 1024,
        max_part_age_s: float = 60.0,
        writer_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        spool_dir: str | None = None,
        on_open: Callable[[str], None] | None = None,
        on_ship: Callable[[str], None] | None = None,
        idle_s: float | None = None,
    ) -> None:
        """``on_open``/``on_ship`` are called with the writer id when a part gets its first line and
        when it is shipped (e.g. to tell readers a part is still to come). With ``idle_s``, a part
        also ships once no line came for that long (its job has gone quiet)."""
        self._store = store
        self._idle_s = idle_s
        self._last_at = 0.0
        self._on_open, self._on_ship = on_open, on_ship
        self._prefix = prefix.rstrip("/")
        self._max_bytes, self._max_age_s = max_part_bytes, max_part_age_s
        self._writer_id = writer_id or f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
        self._clock = clock
        self._spool_dir = spool_dir
        if spool_dir is not None:
            os.makedirs(spool_dir, exist_ok=True)
        self._lock = threading.Lock()
        self._spool: Any = None
        self._spool_path = ""
        self._opened_at = 0.0
        self._size = 0
        self._seq = 0
        self._timer: threading.Timer | None = None
        self.parts: list[str] = []

    def append(self, record: Mapping[str, Any]) -> None:
        """Add one record (one JSON line)."""
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if self._spool is None:
                if self._on_open is not None:
                    self._on_open(self._writer_id)
                self._spool = self._open_spool()
                self._opened_at, self._size = self._clock(), 0
                self._start_timer(min(self._max_age_s, self._idle_s or self._max_age_s))
            self._last_at = self._clock()
            self._spool.write(line)
            self._size += len(line)
            if self._size >= self._max_bytes or self._clock() - self._opened_at >= self._max_age_s:
                self._ship()

    def write(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Add an analysis batch's records (each in the spool before this returns); return how many."""
        for record in records:
            self.append(record)
        return len(records)

    @property
    def pending(self) -> bool:
        """True while a line is not shipped yet (read without the lock: a hint, never blocks)."""
        return self._spool is not None

    def flush(self) -> None:
        """Ship the current part now (nothing if it is empty)."""
        with self._lock:
            self._ship()

    def close(self) -> None:
        """Ship what is left; the writer may be used again afterwards."""
        self.flush()

    def _part_name(self) -> str:
        return f"{self._writer_id}-{self._seq + 1:05d}{_SPOOL_SUFFIX}"

    def _open_spool(self) -> Any:
        if self._spool_dir is None:
            return tempfile.TemporaryFile(prefix="vcrawl-records-")
        path = os.path.join(self._spool_dir, quote(self._prefix, safe="") + _PREFIX_END + self._part_name())
        spool = open(path + ".new", "w+b", buffering=0)  # closed in _ship
        # Held while this process lives: a spool that can be locked belongs to a dead writer.
        # Locked before it gets the name recovery looks for.
        fcntl.flock(spool.fileno(), fcntl.LOCK_EX)
        os.rename(path + ".new", path)
        self._spool_path = path
        return spool

    def _ship(self) -> None:
        """Copy the part into the store; if that fails, keep it (nothing is lost) and raise."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        spool = self._spool
        if spool is None:
            return
        if self._size == 0:
            self._spool = None
            spool.close()
            return
        location = f"{self._prefix}/{self._part_name()}"
        spool.seek(0)
        try:
            with self._store.open_write(location) as out:
                while chunk := spool.read(1024 * 1024):
                    out.write(chunk)
        finally:
            spool.seek(0, os.SEEK_END)  # on failure the spool stays whole, for the next try
        self._seq += 1
        self._spool = None
        if self._spool_dir is not None:
            os.unlink(self._spool_path)  # while still locked, so no recovery ships it again
        spool.close()
        self.parts.append(location)
        if self._on_ship is not None:
            self._on_ship(self._writer_id)

    def _start_timer(self, delay_s: float) -> None:
        self._timer = threading.Timer(max(0.0, delay_s), self._flush_when_old)
        self._timer.daemon = True
        self._timer.start()

    def _flush_when_old(self) -> None:
        # Runs on a timer, so a part of an idle worker still ships after max_part_age_s (or idle_s).
        try:
            with self._lock:
                if self._spool is None:
                    return
                now = self._clock()
                age_left = self._max_age_s - (now - self._opened_at)
                idle_left = self._idle_s - (now - self._last_at) if self._idle_s is not None else age_left
                if age_left > 0 and idle_left > 0:  # lines still coming: look again when one limit is due
                    self._start_timer(min(age_left, idle_left))
                    return
                self._ship()
        except Exception as exc:  # kept for the next try; the worker goes on
            logger.warning("records part of %s not shipped yet: %r", self._prefix, exc)


def recover_spools(store: Storage, spool_dir: str) -> list[str]:
    """Ship the spools that dead writers left in ``spool_dir``; return the parts written.

    A spool still locked belongs to a live writer and is left alone. A line cut short by the
    kill is dropped: its analysis was not acknowledged, so it runs again.
    """
    shipped: list[str] = []
    directory = Path(spool_dir)
    if not directory.is_dir():
        return shipped
    for path in directory.glob(f"*{_PREFIX_END}*{_SPOOL_SUFFIX}.new"):  # died before naming its spool: empty
        _remove_if_unlocked(path)
    for path in sorted(directory.glob(f"*{_PREFIX_END}*{_SPOOL_SUFFIX}")):
        quoted_prefix, _, part = path.name.partition(_PREFIX_END)
        try:
            spool = open(path, "r+b")  # closed below
        except FileNotFoundError:  # shipped by its writer meanwhile
            continue
        with spool:
            try:
                fcntl.flock(spool.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            if not os.path.exists(path):  # unlinked by its writer before we got the lock
                continue
            data = spool.read()
            whole = data[: data.rfind(b"\n") + 1]
            if whole:
                location = f"{unquote(quoted_prefix)}/{part}"
                with store.open_write(location) as out:
                    out.write(whole)
                shipped.append(location)
                logger.warning("shipped %d bytes of records a stopped worker left in %s", len(whole), path)
            os.unlink(path)
    return shipped


def _remove_if_unlocked(path: Path) -> None:
    try:
        with open(path, "rb") as spool:
            fcntl.flock(spool.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
    except (FileNotFoundError, BlockingIOError):
        pass


def read_records(store: Storage, prefix: str) -> Iterator[dict[str, Any]]:
    """Every record under ``prefix`` (all part files, in name order)."""
    for part in store.list_files(prefix):
        if not part.endswith(".jsonl"):
            continue
        for line in store.read_bytes(part).splitlines():
            if line.strip():
                yield json.loads(line)


_BASE_COLUMNS = ("url", "final_url", "fetched_at", "job", "analyzer", "ip")


def export_records(store: Storage, prefix: str, out: io.TextIOBase, fmt: str) -> int:
    """Write every record under ``prefix`` to ``out`` as ``jsonl`` or ``csv``; return how many.

    CSV has the record's base columns and one column per field (``fields`` analyzer) or per
    top-level key of the analyzer's data; lists and objects are JSON in their cell.

    Raises:
        ValueError: an unknown format.
    """
    return write_records(_once_each(read_records(store, prefix)), out, fmt)


def write_records(records: Iterable[Mapping[str, Any]], out: io.TextIOBase, fmt: str) -> int:
    """Write ``records`` to ``out`` as ``jsonl`` (streamed) or ``csv`` (see ``export_records``); return how many.

    Raises:
        ValueError: an unknown format.
    """
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"format must be jsonl or csv, got {fmt!r}")
    if fmt == "jsonl":
        count = 0
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
            count += 1
        return count
    rows = [_flat(record) for record in records]
    columns = list(_BASE_COLUMNS)
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return len(rows)


def _once_each(records: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Drop repeats of one analysis (same URL, fetch time, analyzer and, for an api page's many
    records, index).

    An analysis redelivered after its worker died writes its records again (records are
    at-least-once on disk); the export shows each once.
    """
    seen: set[tuple[Any, Any, Any, Any]] = set()
    for record in records:
        key = (record.get("url"), record.get("fetched_at"), record.get("analyzer"), record.get("index", 0))
        if None not in key:
            if key in seen:
                continue
            seen.add(key)
        yield record


def _flat(record: Mapping[str, Any]) -> dict[str, Any]:
    row = {key: record.get(key) for key in _BASE_COLUMNS}
    data = record.get("data") or {}
    values = data.get("fields", data) if isinstance(data, Mapping) else {"data": data}
    for key, value in values.items():
        if key in ("url",):
            continue
        row[key] = json.dumps(value, ensure_ascii=False) if isinstance(value, list | dict) else value
    return row
