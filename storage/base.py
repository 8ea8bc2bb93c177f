"""The storage backend interface: what every scheme's backend (file, hdfs, ...) provides."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol, runtime_checkable

__all__ = ["Backend", "BackendFactory"]


@runtime_checkable
class Backend(Protocol):
    """One storage system under one root; every location is the full string `resolve` returned.

    Every method re-checks its location, so a backend is safe even when called directly;
    ``resolve(resolve(x)) == resolve(x)``.
    """

    def resolve(self, location: str) -> str:
        """Return the normalized form of `location`, checked to lie inside the backend's root.

        Raises:
            StorageRefused: the location is malformed or outside the root.
        """
        ...

    def relative(self, location: str) -> str:
        """Return where `location` lies under the root, as a ``/``-separated path (``pages/a.html``).

        The path is taken from the form `resolve` returns, so ``..`` and (locally) symlinked parent
        directories are already followed: it says where the file really is.

        Raises:
            StorageRefused: as `resolve`.
        """
        ...

    def open_write(self, location: str) -> AbstractContextManager[BinaryIO]:
        """Return a context manager yielding a binary file; readers see the data only after a clean exit.

        On an exception inside the block nothing is left behind (no partial file, no temp file).

        Raises:
            StorageRefused: the location is refused.
        """
        ...

    def write_bytes(self, location: str, data: bytes) -> int:
        """Store `data` atomically at `location` and return the number of bytes written.

        Raises:
            StorageRefused: the location is refused.
        """
        ...

    def read_bytes(self, location: str, offset: int = 0, length: int | None = None) -> bytes:
        """Return the content stored at `location` (or ``length`` bytes of it from ``offset``).

        Raises:
            MissingPage: nothing is stored there.
            StorageRefused: the location is refused.
            StorageFailed: a transient failure of the store (worth a retry).
        """
        ...

    def list_files(self, location: str) -> list[str]:
        """Return the files directly in the directory `location` (resolved, sorted; none if missing)."""
        ...

    def exists(self, location: str) -> bool:
        """Return True if something is stored at `location`.

        Raises:
            StorageRefused: the location is refused.
        """
        ...


# Builds a backend from the normalized data root: a filesystem path for "file", the URL otherwise.
BackendFactory = Callable[[str], Backend]
