"""The storage router: one configured data root, its backend chosen by URL scheme."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, BinaryIO, TypeVar
from urllib.parse import unquote, urlsplit

from storage.base import Backend, BackendFactory
from storage.local import LocalBackend
from vcrawl.errors import ConfigError, StorageRefused

_T = TypeVar("_T")

if TYPE_CHECKING:
    from vcrawl.settings import Settings

__all__ = ["BACKENDS", "Storage"]

logger = logging.getLogger(__name__)

# Scheme -> factory called with the normalized data root (a filesystem path for "file", the URL
# otherwise). Backends that need settings are added by ``Storage.from_settings`` ("hdfs").
BACKENDS: dict[str, BackendFactory] = {"file": LocalBackend}

# Only "scheme://" counts as a URL, so a relative file name like "notes:1.html" stays a path.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class Storage:
    """Routes storage locations to the backend of the configured data root (``VCRAWL_DATA``).

    Accepted locations: a path relative to the data root; an absolute path or ``file://`` URL
    inside it (local roots only); a URL of the data root's own scheme, which that backend confines.
    Everything else is refused. Backends are built on first use, so ``__init__`` does no I/O.
    """

    def __init__(self, data: str, backends: Mapping[str, BackendFactory] | None = None) -> None:
        """Normalize the data root: a path (made absolute), a ``file://`` URL, or a backend URL.

        Raises:
            ConfigError: `data` is empty, the filesystem root, or has a scheme with no backend.
        """
        self._factories = dict(BACKENDS if backends is None else backends)
        self._scheme, self._root = _normalize_root(data, self._factories)
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> Storage:
        """Build the router for ``settings.data`` (``VCRAWL_DATA``), with local and HDFS backends."""
        from storage.webhdfs import webhdfs_factory  # the hdfs client is only loaded here

        return cls(settings.data, backends={**BACKENDS, "hdfs": webhdfs_factory(settings)})

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """Check what the data root of ``settings`` needs (a remote root: its user, NameNodes), sending nothing.

        Called before a job starts and when a worker starts, so that a broken configuration stops
        the run at once instead of failing every fetch batch later.

        Raises:
            ConfigError: naming the variable (e.g. ``VCRAWL_HDFS_USER`` for an ``hdfs://`` root).
        """
        store = cls.from_settings(settings)
        if store._scheme != "file":  # a remote backend checks its settings when built, before any request
            store._root_backend()  # (a local one would make its directory: nothing to check there)

    def __repr__(self) -> str:
        return f"Storage({self._root!r})"

    def describe(self) -> str:
        """Return the data root: an absolute path for local storage, the URL otherwise."""
        return self._root

    def resolve(self, location: str | None, default: str) -> str:
        """Return the normalized location for `location`, or for `default` (relative to the root) if None.

        The result is what the other methods (and other workers) take back.

        Raises:
            StorageRefused: the location is outside the data root or names an unknown scheme.
        """
        return self._route(default if location is None else location)[1]

    def relative(self, location: str) -> str:
        """Return where `location` lies under the data root, ``/``-separated, after `resolve`'s checks.

        The same for every spelling of one file: ``pages/a.html``, ``DATA/pages/a.html``,
        ``file://DATA/pages/a.html`` or ``hdfs://nn:9870/DATA/pages/a.html`` all give ``pages/a.html``;
        ``..`` and (locally) symlinked parent directories are followed first.

        Raises:
            StorageRefused: the location is outside the data root or names an unknown scheme.
        """
        backend, resolved = self._route(location)
        return backend.relative(resolved)

    def open_write(self, location: str) -> AbstractContextManager[BinaryIO]:
        """Return a context manager yielding a binary file that appears at `location` on a clean exit.

        Raises:
            StorageRefused: the location is refused.
        """
        backend, resolved = self._route(location)
        return backend.open_write(resolved)

    def write_bytes(self, location: str, data: bytes) -> int:
        """Store `data` atomically at `location` and return the number of bytes written.

        Raises:
            StorageRefused: the location is refused.
        """
        return self._checked_by_backend(location, lambda backend, candidate: backend.write_bytes(candidate, data))

    def read_bytes(self, location: str, offset: int = 0, length: int | None = None) -> bytes:
        """Return the content stored at `location` (or ``length`` bytes of it from ``offset``).

        Raises:
            MissingPage: nothing is stored there.
            StorageRefused: the location is refused.
            StorageFailed: a transient failure of the store.
        """
        return self._checked_by_backend(location, lambda backend, where: backend.read_bytes(where, offset, length))

    def exists(self, location: str) -> bool:
        """Return True if something is stored at `location`.

        Raises:
            StorageRefused: the location is refused.
        """
        return self._checked_by_backend(location, lambda backend, candidate: backend.exists(candidate))

    def list_files(self, location: str) -> list[str]:
        """Return the files directly in the directory `location`, sorted (none if it is missing).

        Raises:
            StorageRefused: the location is refused.
        """
        # A directory is not a file location: the backend checks it itself.
        return self._root_backend().list_files(self._candidate(location))

    def list_dirs(self, location: str) -> list[str]:
        """Return the names of the directories directly in the directory `location`, sorted.

        Raises:
            StorageRefused: the location is refused.
            ConfigError: the data root's backend cannot list directories (a plug-in backend).
        """
        backend = self._root_backend()
        lister = getattr(backend, "list_dirs", None)
        if lister is None:
            raise ConfigError(f"the storage backend of {self._root} cannot list directories")
        return list(lister(self._candidate(location)))

    def _checked_by_backend(self, location: str, call: Callable[[Backend, str], _T]) -> _T:
        """``call(backend, candidate)``: a backend checks every location it is given (``storage.base``),
        so the location is not resolved here first too (a local resolve is five system calls, and
        every page is written once and read once)."""
        try:
            return call(self._root_backend(), self._candidate(location))
        except StorageRefused as e:
            if e.location == location:
                raise
            raise StorageRefused(location, e.problem) from e  # what the caller gave, as ``_route`` says

    def _route(self, location: str) -> tuple[Backend, str]:
        candidate = self._candidate(location)
        backend = self._root_backend()
        try:
            return backend, backend.resolve(candidate)
        except StorageRefused as e:
            if e.location == location:
                raise
            # Name what the caller gave (e.g. "../x"), not the joined path the backend saw.
            raise StorageRefused(location, e.problem) from e

    def _candidate(self, location: str) -> str:
        """Return `location` spelled as the root backend's location, still unchecked."""
        if "\x00" in location:
            raise _refuse(location, "contains a NUL byte")
        if not location.strip():
            raise _refuse(location, "is empty")
        match = _SCHEME.match(location)
        if match is None:
            if os.path.isabs(location):
                return self._local(location, location)
            if self._scheme == "file":
                return os.path.join(self._root, location)
            return self._root.rstrip("/") + "/" + location
        scheme = match.group(1).lower()
        if scheme == "file":
            try:
                return self._local(location, _file_url_path(location))
            except ValueError as e:
                raise _refuse(location, str(e)) from e
        if scheme not in self._factories:
            known = ", ".join(sorted(self._factories))
            raise _refuse(location, f"no storage backend for scheme {scheme!r}; known: {known}")
        if scheme != self._scheme:
            raise _refuse(location, f"is outside the data root {self._root}")
        return location

    def _local(self, location: str, path: str) -> str:
        if self._scheme != "file":
            raise _refuse(location, f"is a local path but the data root is {self._root}")
        return path

    def _root_backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = self._factories[self._scheme](self._root)
                logger.debug("storage backend %r for data root %s", self._backend, self._root)
            return self._backend


def _normalize_root(data: str, factories: Mapping[str, BackendFactory]) -> tuple[str, str]:
    """Return (scheme, root) for the data root: ("file", absolute path) or (scheme, URL)."""
    known = ", ".join(sorted(factories))
    if not data.strip() or "\x00" in data:
        raise ConfigError(f"VCRAWL_DATA must be a non-empty path or URL without NUL bytes, got {data!r}")
    match = _SCHEME.match(data)
    scheme = "file" if match is None else match.group(1).lower()
    if scheme not in factories:
        raise ConfigError(f"VCRAWL_DATA={data!r}: no storage backend for scheme {scheme!r}; known: {known}")
    if match is not None and scheme != "file":
        return scheme, scheme + data[match.end(1) :]
    path = data
    if match is not None:
        try:
            path = _file_url_path(data)
        except ValueError as e:
            raise ConfigError(f"VCRAWL_DATA={data!r}: {e}") from e
    root = os.path.abspath(path)
    if "\x00" in root or root == os.path.abspath(os.sep):
        raise ConfigError(f"VCRAWL_DATA={data!r} must name a directory below the filesystem root")
    return "file", root


def _file_url_path(url: str) -> str:
    """Return the absolute path a ``file://`` URL names.

    Raises:
        ValueError: it names another host, has a query or fragment, or has no absolute path.
    """
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"file URL names host {parts.netloc!r}; only file:///path is local")
    if parts.query or parts.fragment:
        raise ValueError("file URL has a query or fragment")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ValueError("file URL has no absolute path")
    return path


def _refuse(location: str, problem: str) -> StorageRefused:
    logger.debug("refuse storage location %r: %s", location, problem)
    return StorageRefused(location, problem)
