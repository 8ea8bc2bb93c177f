"""A fetch batch's captures held aside (`WarcStage`) until a `WarcWriter.commit` appends them, or never."""

from __future__ import annotations

import os

from storage.warc.capture import Captures, RecordWrite, write_capture
from storage.warc.index import CdxEntry
from storage.warc.spool import Spool

__all__ = ["WarcStage"]


class WarcStage(Captures):
    """Captures held in a local temporary file until a `WarcWriter.commit` appends them, or `discard`.

    For a fetch batch whose captures must count only if its release still holds the lease: a
    batch taken over by another worker (this one was stopped past the node timeout) must not be
    archived twice. Not thread-safe: one batch, one thread. Nothing of it survives the process:
    a batch that never released is fetched again.
    """

    def __init__(self) -> None:
        self._spool: Spool | None = None
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

    def _capture(self, url: str, timestamp: str, status: int, mime: str, write: RecordWrite) -> CdxEntry:
        if self._spool is None:
            self._spool = Spool("staged", None)
        start = self._spool.size()
        entry = write_capture(self._spool, "", url, timestamp, status, mime, write)
        self._captures.append((start, self._spool.size(), entry))
        return entry
