"""HDFS storage over WebHDFS (HdfsCLI's client): locations are ``hdfs://namenode:port/abs/path``.

The port is the NameNode's WebHDFS **HTTP** port (``dfs.namenode.http-address``: 9870 on Hadoop 3,
50070 on Hadoop 2), not the RPC port of ``fs.defaultFS`` (8020 or 9000); the client talks plain
HTTP to it and follows its ``307`` redirects to the DataNodes. Host names are compared as written
(``localhost:9870`` and ``127.0.0.1:9870`` are different NameNodes) and are never resolved here.
"""

from __future__ import annotations

import functools
import io
import logging
import posixpath
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import hdfs

from storage.webhdfs.client import ChunkSink, file_status, kerberos_client_class, session
from storage.webhdfs.failures import FOREIGN, StreamBroken, classify, refuse, text
from storage.webhdfs.locations import confine, parse_allowed, parse_root
from vcrawl.errors import ConfigError, StorageFailed, VcrawlError
from vcrawl.policies import RetryPolicy

if TYPE_CHECKING:
    from vcrawl.settings import Settings

__all__ = ["WebHdfsBackend", "webhdfs_factory"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_TEMP_STEM_MAX = 200  # bytes of the final name kept in the temp name, so the temp name fits the 255-byte limit too
_CHUNK_BYTES = 64 * 1024  # small writes are gathered into chunks of this size before they go on the wire


class WebHdfsBackend:
    """Files under one ``hdfs://`` root, reached over WebHDFS; one HdfsCLI client per NameNode.

    A write streams (HTTP chunked) to a hidden temp file next to the target, ``.<name>.<16 hex>.tmp``,
    then renames it onto the final name, so readers never see a partial file. HDFS ``RENAME``
    never replaces a file, so an existing file is deleted just before the rename: in that short
    window a reader finds no file (MissingPage), never a partial one, and if the NameNode fails
    right between the two calls the old version is gone while the new one is discarded.

    Transient failures (connection errors, timeouts, HTTP 5xx, ``RetriableException``,
    ``StandbyException``, ``SafeModeException``) are retried ``retries`` times with exponential
    backoff, then raised as StorageFailed. A body streamed from the caller cannot be replayed, so
    a DataNode failure mid-stream in `open_write` is StorageFailed at once; `write_bytes` holds
    the bytes and retries the whole upload. WebHDFS requests ignore ``HTTP(S)_PROXY``.
    """

    def __init__(
        self,
        root: str,
        *,
        user: str | None,
        allowed_namenodes: Collection[str],
        kerberos: bool = False,
        retries: int = 3,
        backoff_s: float = 0.2,
        timeout_s: float = 30.0,
        client_factory: Callable[[str], hdfs.Client] | None = None,
    ) -> None:
        """Check the configuration; no request is sent until the first storage call.

        Args:
            root: the data root URL, ``hdfs://namenode:webhdfs-port/abs/dir``.
            user: the HDFS user (``user.name``); with Kerberos the ticket's principal is the
                user and `user`, if set, is sent as ``doas`` (needs proxy-user rights).
            allowed_namenodes: ``host:port`` NameNodes a location may name; empty means only
                the root's own NameNode.
            client_factory: builds the client for a NameNode URL ``http://host:port`` instead of
                InsecureClient/KerberosClient (it must use an absolute ``root``, e.g. ``"/"``).

        Raises:
            ConfigError: the root, the allow list or the user is unusable, or Kerberos is on
                without requests-kerberos installed.
        """
        if user is None and not kerberos:
            raise ConfigError("VCRAWL_HDFS_USER must be set for hdfs:// storage")
        if retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError(
                f"need retries >= 0, backoff_s >= 0, timeout_s > 0; got {retries}, {backoff_s}, {timeout_s}"
            )
        self._root_namenode, self._root_path = parse_root(root)
        self.root = f"hdfs://{self._root_namenode}{self._root_path}"
        self.allowed_namenodes: frozenset[str] = frozenset(map(parse_allowed, allowed_namenodes)) or frozenset(
            {self._root_namenode}
        )
        if self._root_namenode not in self.allowed_namenodes:
            raise ConfigError(
                f"VCRAWL_DATA={root!r} names NameNode {self._root_namenode}, which is not in "
                f"VCRAWL_HDFS_NAMENODES ({', '.join(sorted(self.allowed_namenodes))})"
            )
        self.user, self.kerberos, self.timeout_s = user, kerberos, timeout_s
        self._policy = RetryPolicy(retries=retries, backoff_s=backoff_s, backoff_max_s=max(backoff_s, 10.0))
        if client_factory is None:
            client_factory = self._kerberos_client if kerberos else self._insecure_client
            if kerberos:
                kerberos_client_class()  # fail at start-up, not at the first write
        self._client_factory = client_factory
        self._clients: dict[str, hdfs.Client] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        allowed = ", ".join(sorted(self.allowed_namenodes))
        return f"WebHdfsBackend({self.root!r}, user={self.user!r}, kerberos={self.kerberos}, namenodes=[{allowed}])"

    def resolve(self, location: str) -> str:
        """Return `location` as ``hdfs://host:port/normalized/path``, checked to lie inside the root.

        Paths are taken literally: no percent-decoding (``%`` is refused), ``.`` and ``..``
        segments are folded (``posixpath.normpath``) before the root check.

        Raises:
            StorageRefused: not an ``hdfs://`` URL; a NameNode not allowed or without a port; a
                query, fragment or ``user@``; control characters, ``%`` or ``:``; a trailing
                ``/``; the root itself; a path outside the root; a component over 255 bytes.
        """
        namenode, path = self._check(location)
        return f"hdfs://{namenode}{path}"

    def relative(self, location: str) -> str:
        """Return the normalized path of `location` relative to the root path (whichever NameNode it names).

        Raises:
            StorageRefused: as `resolve`.
        """
        path = self._check(location)[1]
        return path[len(self._root_path) + 1 :]

    @contextmanager
    def open_write(self, location: str) -> Iterator[BinaryIO]:
        """Yield a binary file streamed to HDFS; it appears at `location` only when the block exits cleanly.

        Raises:
            StorageRefused: the location is refused, is a directory, or HDFS denies access.
            StorageFailed: HDFS failed for now (also: the DataNode failed mid-stream).
        """
        target = self._target(location)
        self._make_parent(target)
        try:
            with self._upload(target) as stream:
                yield stream
        except StreamBroken as e:
            raise StorageFailed(location, f"upload failed mid-stream: {e.problem}") from e.__cause__
        self._publish(target)

    def write_bytes(self, location: str, data: bytes) -> int:
        """Store `data` atomically at `location` and return the number of bytes written.

        Raises:
            StorageRefused: the location is refused, is a directory, or HDFS denies access.
            StorageFailed: HDFS still failed after the retries.
        """
        target = self._target(location)
        self._make_parent(target)
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._upload(target) as stream:
                    stream.write(data)
                break
            except StreamBroken as e:
                self._wait_or_give_up(location, "upload", e.problem, attempt, e.__cause__)
        self._publish(target)
        return len(data)

    def read_bytes(self, location: str, offset: int = 0, length: int | None = None) -> bytes:
        """Return the file at `location`, or ``length`` bytes of it from ``offset`` (``b""`` past the end).

        Raises:
            MissingPage: no file is there.
            StorageRefused: the location is refused, is a directory, or HDFS denies access.
            StorageFailed: HDFS still failed after the retries.
        """
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"offset and length must not be negative, got {offset}, {length}")
        target = self._target(location)

        def read() -> bytes:
            try:
                with target.client.read(target.path, offset=offset, length=length) as reader:
                    return reader.read()
            except hdfs.HdfsError as e:
                if e.exception == "EOFException":  # the DataNode cannot seek past the end
                    return b""
                if e.exception == "FileNotFoundException" and "not a file" in text(e.message):
                    raise refuse(location, "is a directory, not a file") from e
                raise

        return self._retrying(location, "read", read)

    def exists(self, location: str) -> bool:
        """Return True if a file is stored at `location`.

        Raises:
            StorageRefused: the location is refused, is a directory, or HDFS denies access.
            StorageFailed: HDFS still failed after the retries.
        """
        target = self._target(location)
        status = self._retrying(location, "status", lambda: file_status(target.client, target.path))
        if status is not None and status.get("type") == "DIRECTORY":
            raise refuse(location, "is a directory, not a file")
        return status is not None

    def list_files(self, location: str) -> list[str]:
        """Return the files directly in the directory `location`, as hdfs:// URLs, sorted.

        A missing directory has no files; hidden names (temporary writes) are left out.

        Raises:
            StorageRefused: the location is refused or HDFS denies access.
            StorageFailed: HDFS still failed after the retries.
        """
        namenode, path, entries = self._listing(location)
        return sorted(
            f"hdfs://{namenode}{posixpath.join(path, name)}"
            for name, status in entries
            if status.get("type") == "FILE" and not name.startswith(".")
        )

    def list_dirs(self, location: str) -> list[str]:
        """Return the names of the directories directly in the directory `location`, sorted (none if missing).

        Raises:
            StorageRefused: the location is refused or HDFS denies access.
            StorageFailed: HDFS still failed after the retries.
        """
        _, _, entries = self._listing(location)
        return sorted(
            name for name, status in entries if status.get("type") == "DIRECTORY" and not name.startswith(".")
        )

    def _listing(self, location: str) -> tuple[str, str, list[tuple[str, dict[str, Any]]]]:
        """(NameNode, path, LISTSTATUS entries) of the directory `location`; a missing one has none."""
        namenode, path = self._check(location.rstrip("/"))
        client = self._client(namenode)

        def listing() -> list[tuple[str, dict[str, Any]]]:
            try:
                return client.list(path, status=True)
            except hdfs.HdfsError as e:
                if e.exception == "FileNotFoundException":
                    return []
                raise

        return namenode, path, self._retrying(location, "list", listing)

    def _check(self, location: str) -> tuple[str, str]:
        return confine(location, self.root, self._root_path, self.allowed_namenodes)

    def _target(self, location: str) -> _Target:
        namenode, path = self._check(location)
        parent, name = posixpath.split(path)
        stem = name.encode("utf-8")[:_TEMP_STEM_MAX].decode("utf-8", "ignore")
        temp = posixpath.join(parent, f".{stem}.{secrets.token_hex(8)}.tmp")
        return _Target(location, namenode, path, temp, self._client(namenode))

    def _client(self, namenode: str) -> hdfs.Client:
        with self._lock:
            client = self._clients.get(namenode)
            if client is None:
                client = self._client_factory(f"http://{namenode}")
                self._clients[namenode] = client
                logger.debug("WebHDFS client %r for NameNode %s", client, namenode)
            return client

    def _insecure_client(self, url: str) -> hdfs.Client:
        # root="/": with a relative root HdfsCLI first asks the NameNode for GETHOMEDIRECTORY.
        return hdfs.InsecureClient(url, user=self.user, root="/", timeout=self.timeout_s, session=session())

    def _kerberos_client(self, url: str) -> hdfs.Client:
        client_class = kerberos_client_class()
        return client_class(url, root="/", proxy=self.user, timeout=self.timeout_s, session=session())

    def _make_parent(self, target: _Target) -> None:
        parent = posixpath.dirname(target.path)
        self._retrying(target.location, "mkdirs", lambda: target.client.makedirs(parent))

    @contextmanager
    def _upload(self, target: _Target) -> Iterator[BinaryIO]:
        """Stream the block's writes to the temp file; on any failure the temp file is deleted.

        A transient failure of the upload itself is raised as StreamBroken (the caller decides
        whether it can replay the body); an exception from the block propagates unchanged.
        """
        # The NameNode part of CREATE happens here and is retried; the DataNode PUT streams in a
        # thread of HdfsCLI's AsyncWriter that reads the chunks this block writes.
        writer = self._retrying(target.location, "create", lambda: target.client.write(target.temp, overwrite=True))
        stream = io.BufferedWriter(ChunkSink(writer), buffer_size=_CHUNK_BYTES)
        block_error: BaseException | None = None
        try:
            with writer:
                try:
                    yield stream
                    if not stream.closed:
                        stream.flush()
                except BaseException as e:
                    block_error = e
                    raise
        except BaseException as e:
            self._discard(target)
            if block_error is not None:
                if e is not block_error:
                    logger.debug("upload of %s also failed after the caller's error: %s", target.temp, e)
                raise block_error  # noqa: B904 - the caller's error is the one to report, unchanged
            if isinstance(e, FOREIGN):
                failure = classify(e)
                if failure.kind == "transient":
                    raise StreamBroken(failure.problem) from e
                raise failure.error(target.location) from e
            raise
        stream.close()

    def _publish(self, target: _Target) -> None:
        """Rename the temp file onto the final name, deleting an older file there first."""

        def rename() -> None:
            if file_status(target.client, target.temp) is None:
                # A retry after a RENAME whose reply was lost: the temp file is gone, so the
                # rename happened. Deleting the target now would lose the new file too.
                if file_status(target.client, target.path) is not None:
                    return
                raise refuse(target.location, "the temporary file vanished before the rename")
            status = file_status(target.client, target.path)
            if status is not None:
                if status.get("type") == "DIRECTORY":
                    raise refuse(target.location, "is a directory, not a file")
                target.client.delete(target.path)  # RENAME never overwrites; see the class docstring
            target.client.rename(target.temp, target.path)

        try:
            self._retrying(target.location, "rename", rename)
        except VcrawlError:
            self._discard(target)
            raise
        logger.debug("stored %s", target.location)

    def _discard(self, target: _Target) -> None:
        try:
            self._retrying(target.location, "delete temp", lambda: target.client.delete(target.temp))
        except VcrawlError as e:
            # The write already failed and says why; a leftover hidden .tmp file holds no visible data.
            logger.warning("could not delete temp file %s on %s: %s", target.temp, target.namenode, e)

    def _retrying(self, location: str, action: str, call: Callable[[], _T]) -> _T:
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except FOREIGN as e:
                failure = classify(e)
                if failure.kind != "transient":
                    raise failure.error(location) from e
                self._wait_or_give_up(location, action, failure.problem, attempt, e)

    def _wait_or_give_up(
        self, location: str, action: str, problem: str, attempt: int, cause: BaseException | None
    ) -> None:
        delay = self._policy.delay_for(attempt)
        if delay is None:
            logger.info("%s of %s failed %d times, giving up: %s", action, location, attempt, problem)
            raise StorageFailed(location, f"{action}: {problem} (gave up after {attempt} attempts)") from cause
        logger.info("%s of %s failed (attempt %d), retrying in %.2fs: %s", action, location, attempt, delay, problem)
        time.sleep(delay)


def webhdfs_factory(settings: Settings) -> Callable[[str], WebHdfsBackend]:
    """Return the storage router's ``hdfs`` factory, configured from `settings` (user, NameNodes, Kerberos)."""
    return functools.partial(
        WebHdfsBackend,
        user=settings.hdfs_user,
        allowed_namenodes=settings.hdfs_namenodes,
        kerberos=settings.hdfs_kerberos,
    )


@dataclass(frozen=True)
class _Target:
    """One write or read: the caller's location, where it lives, and the temp name a write uses."""

    location: str
    namenode: str
    path: str
    temp: str
    client: hdfs.Client
