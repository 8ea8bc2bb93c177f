"""A fetch batch's WARC captures, archived only if the batch still holds its lease when it releases.

A worker stopped (SIGSTOP, a long GC pause, a partition) past the node timeout has its batches
taken over: their leases are handed back and their URLs fetched again by another worker. When
the stopped worker resumes, it finishes the batch it was in; its release finds the lease gone and
counts nothing, but captures written straight into the process's WARC writer would already be
archived, and the job's archive would hold those pages twice.

So a batch's captures go to a ``WarcStage`` (a local temporary file), and right before the
release the batch asks whether it still holds its lease (``FrontierQueue.holds_lease``): if so
they are appended to the process's WARC writer (``WarcWriter.commit``, a local copy), else dropped.

The window: a batch whose lease is taken over between that check and its release (a stop of more
than the node timeout falling in those few milliseconds: the commit is a local file append, the
release one Redis script) still has its captures archived, and the worker that took it over
archives them again. Committing after the release instead would close that window but open a
worse one: a worker killed between its release and its commit would lose the captures for good,
since a released batch is never fetched again. A page twice in the archive is the lesser harm.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from storage.warc import WarcStage, WarcWriter

__all__ = ["StagedWarc"]

logger = logging.getLogger(__name__)


class StagedWarc:
    """One fetch batch's captures, held until ``settle``; the stage is made on the first capture."""

    def __init__(self, writer: Callable[[], WarcWriter], label: str = "") -> None:
        """``writer`` gives the process's WARC writer of the job (made lazily, as the fetch step does)."""
        self._writer = writer
        self._label = label  # for logs: job and batch
        self._stage: WarcStage | None = None

    def stage(self) -> WarcStage:
        """Where the batch's captures go (its fetch context's WARC sink)."""
        if self._stage is None:
            self._stage = self._writer().stage()
        return self._stage

    def settle(self, holds_lease: bool) -> int:
        """Append the captures to the WARC writer if the batch still holds its lease, else drop them;
        return how many were appended."""
        stage, self._stage = self._stage, None
        if stage is None or not len(stage):
            if stage is not None:
                stage.discard()
            return 0
        if not holds_lease:
            logger.warning("%s: lease taken over; %d WARC captures dropped (archived by its new fetch)",
                           self._label, len(stage))  # fmt: skip
            stage.discard()
            return 0
        return len(self._writer().commit(stage))

    def discard(self) -> None:
        """Drop what is held (a batch that ended in an error: it is fetched again)."""
        stage, self._stage = self._stage, None
        if stage is not None:
            stage.discard()
