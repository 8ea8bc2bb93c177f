"""WARC files on local disk before they ship: the spool file (`Spool`) and `recover_spools` after a kill."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from warcio.warcwriter import WARCWriter

from storage.registry import Storage
from storage.warc.index import CdxEntry, write_index

__all__ = ["recover_spools"]  # Spool is package-internal

logger = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
_INDEX_PART = ".cdxj.part"  # a spool's index so far: '<file size after the capture> <CDXJ line>'
_GZIP_LEVEL = 6


class Spool:
    """One WARC file being written to local disk, and the index entries of its captures (package-internal).

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

    def copy_into(self, store: Storage) -> None:
        """Copy the whole file into `store` at its location, unless an earlier try already did."""
        if self.copied:
            return
        self.file.flush()
        self.file.seek(0)
        with store.open_write(self.location) as out:
            while chunk := self.file.read(_CHUNK):
                out.write(chunk)
        self.copied = True

    def discard(self) -> None:
        """Close and delete the local file (and its index part)."""
        if self._index is not None:
            os.unlink(self.path + _INDEX_PART)
            self._index.close()
        os.unlink(self.path)  # before closing: still locked, so no recovery ships it
        self.file.close()


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
                write_index(store, location, lines)
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
