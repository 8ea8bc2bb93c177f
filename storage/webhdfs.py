"""HDFS storage over WebHDFS (HdfsCLI's client): locations are ``hdfs://namenode:port/abs/path``.

The port is the NameNode's WebHDFS **HTTP** port (``dfs.namenode.http-address``: 9870 on Hadoop 3,
50070 on Hadoop 2), not the RPC port of ``fs.defaultFS`` (8020 or 9000); the client talks plain
HTTP to it and follows its ``307`` redirects to the DataNodes. Host names are compared as written
(``localhost:9870`` and ``127.0.0.1:9870`` are different NameNodes) and are never resolved here.

One module past ~500 lines on purpose: one client of one wire protocol (WebHDFS): the backend,
its path confinement, its retries and the mapping of WebHDFS errors to vcrawl's errors are one room
(the only place ``hdfs`` is imported), and each part is read only with the others.
"""

from __future__ import annotations

import functools
import io
import logging
import posixpath
import secrets
import threading
import time
import unicodedata
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar
from urllib.parse import SplitResult, urlsplit

import hdfs
import requests
import urllib3

from vcrawl.errors import ConfigError, MissingPage, StorageFailed, StorageRefused, VcrawlError
from vcrawl.policies import RetryPolicy

if TYPE_CHECKING:
    from vcrawl.settings import Settings

__all__ = ["WebHdfsBackend", "webhdfs_factory"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_NAME_MAX = 255  # bytes per path component (dfs.namenode.fs-limits.max-component-length)
_TEMP_STEM_MAX = 200  # bytes of the final name kept in the temp name, so the temp name fits _NAME_MAX too
_CHUNK_BYTES = 64 * 1024  # small writes are gathered into chunks of this size before they go on the wire
_PROBLEM_CHARS = 300  # of a server's error text kept in a failure reason
# RemoteException names that mean "ask again later": HA failover, NameNode start-up, overload.
_RETRIABLE = frozenset(
    {"RetriableException", "StandbyException", "SafeModeException", "ObserverRetryOnActiveException"}
)
_DENIED = frozenset({"AccessControlException", "SecurityException"})
# Everything HdfsCLI and requests raise for a failed call; KeyError is a 2xx answer missing a field.
_FOREIGN: tuple[type[Exception], ...] = (
    hdfs.HdfsError,
    requests.RequestException,
    urllib3.exceptions.HTTPError,
    KeyError,
)


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
        self._root_namenode, self._root_path = _parse_root(root)
        self.root = f"hdfs://{self._root_namenode}{self._root_path}"
        self.allowed_namenodes: frozenset[str] = frozenset(map(_parse_allowed, allowed_namenodes)) or frozenset(
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
                _kerberos_client_class()  # fail at start-up, not at the first write
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
        except _StreamBroken as e:
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
            except _StreamBroken as e:
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
                if e.exception == "FileNotFoundException" and "not a file" in _text(e.message):
                    raise _refuse(location, "is a directory, not a file") from e
                raise

        return self._retrying(location, "read", read)

    def exists(self, location: str) -> bool:
        """Return True if a file is stored at `location`.

        Raises:
            StorageRefused: the location is refused, is a directory, or HDFS denies access.
            StorageFailed: HDFS still failed after the retries.
        """
        target = self._target(location)
        status = self._retrying(location, "status", lambda: _file_status(target.client, target.path))
        if status is not None and status.get("type") == "DIRECTORY":
            raise _refuse(location, "is a directory, not a file")
        return status is not None

    def list_files(self, location: str) -> list[str]:
        """Return the files directly in the directory `location`, as hdfs:// URLs, sorted.

        A missing directory has no files; hidden names (temporary writes) are left out.

        Raises:
            StorageRefused: the location is refused or HDFS denies access.
            StorageFailed: HDFS still failed after the retries.
        """
        namenode, path = self._check(location.rstrip("/"))
        client = self._client(namenode)

        def listing() -> list[tuple[str, dict[str, Any]]]:
            try:
                return client.list(path, status=True)
            except hdfs.HdfsError as e:
                if e.exception == "FileNotFoundException":
                    return []
                raise

        entries = self._retrying(location, "list", listing)
        return sorted(
            f"hdfs://{namenode}{posixpath.join(path, name)}"
            for name, status in entries
            if status.get("type") == "FILE" and not name.startswith(".")
        )

    def _check(self, location: str) -> tuple[str, str]:
        if "\x00" in location:
            raise _refuse(location, "contains a NUL byte")
        if (bad := _control_character(location)) is not None:
            raise _refuse(location, f"contains the control character U+{ord(bad):04X}")
        try:
            location.encode("utf-8")
        except UnicodeEncodeError:
            raise _refuse(location, "contains characters that cannot be a file name") from None
        parts = urlsplit(location)
        if parts.scheme.lower() != "hdfs":
            raise _refuse(location, "is not an hdfs:// URL")
        if "?" in location or "#" in location:
            raise _refuse(location, "has a query or fragment; hdfs:// locations are plain paths")
        if "@" in parts.netloc:
            raise _refuse(location, "names a user (user@host); the HDFS user comes from VCRAWL_HDFS_USER")
        try:
            namenode = _namenode(parts)
        except ValueError as e:
            raise _refuse(location, str(e)) from None
        if namenode not in self.allowed_namenodes:
            allowed = ", ".join(sorted(self.allowed_namenodes))
            raise _refuse(location, f"NameNode {namenode} is not allowed; allowed: {allowed}")
        raw = parts.path
        if problem := _path_problem(raw):
            raise _refuse(location, problem)
        path = posixpath.normpath("/" + raw.lstrip("/"))
        if path == self._root_path:
            raise _refuse(location, "is the storage root itself, not a file in it")
        if not path.startswith(self._root_path + "/"):
            raise _refuse(location, f"escapes the storage root {self.root}")
        if any(len(part.encode("utf-8")) > _NAME_MAX for part in path.split("/")):
            raise _refuse(location, f"has a path component longer than {_NAME_MAX} bytes")
        return namenode, path

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
        return hdfs.InsecureClient(url, user=self.user, root="/", timeout=self.timeout_s, session=_session())

    def _kerberos_client(self, url: str) -> hdfs.Client:
        client_class = _kerberos_client_class()
        return client_class(url, root="/", proxy=self.user, timeout=self.timeout_s, session=_session())

    def _make_parent(self, target: _Target) -> None:
        parent = posixpath.dirname(target.path)
        self._retrying(target.location, "mkdirs", lambda: target.client.makedirs(parent))

    @contextmanager
    def _upload(self, target: _Target) -> Iterator[BinaryIO]:
        """Stream the block's writes to the temp file; on any failure the temp file is deleted.

        A transient failure of the upload itself is raised as _StreamBroken (the caller decides
        whether it can replay the body); an exception from the block propagates unchanged.
        """
        # The NameNode part of CREATE happens here and is retried; the DataNode PUT streams in a
        # thread of HdfsCLI's AsyncWriter that reads the chunks this block writes.
        writer = self._retrying(target.location, "create", lambda: target.client.write(target.temp, overwrite=True))
        stream = io.BufferedWriter(_ChunkSink(writer), buffer_size=_CHUNK_BYTES)
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
            if isinstance(e, _FOREIGN):
                failure = _classify(e)
                if failure.kind == "transient":
                    raise _StreamBroken(failure.problem) from e
                raise failure.error(target.location) from e
            raise
        stream.close()

    def _publish(self, target: _Target) -> None:
        """Rename the temp file onto the final name, deleting an older file there first."""

        def rename() -> None:
            if _file_status(target.client, target.temp) is None:
                # A retry after a RENAME whose reply was lost: the temp file is gone, so the
                # rename happened. Deleting the target now would lose the new file too.
                if _file_status(target.client, target.path) is not None:
                    return
                raise _refuse(target.location, "the temporary file vanished before the rename")
            status = _file_status(target.client, target.path)
            if status is not None:
                if status.get("type") == "DIRECTORY":
                    raise _refuse(target.location, "is a directory, not a file")
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
            except _FOREIGN as e:
                failure = _classify(e)
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


@dataclass(frozen=True)
class _Failure:
    kind: str  # "transient", "refused" or "missing"
    problem: str

    def error(self, location: str) -> VcrawlError:
        if self.kind == "missing":
            return MissingPage(location)
        if self.kind == "refused":
            return _refuse(location, self.problem)
        return StorageFailed(location, self.problem)


class _StreamBroken(Exception):
    """A transient failure while the body was on the wire; never leaves this module."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class _ChunkSink(io.RawIOBase):
    """The raw end of an upload: hands each chunk to HdfsCLI's writer thread and counts the bytes."""

    def __init__(self, writer: Any) -> None:
        super().__init__()
        self._writer = writer
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("write to a closed HDFS upload")
        chunk = bytes(data)  # a copy: BufferedWriter reuses the memory it passes in
        self._writer.write(chunk)
        self._position += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        # AsyncWriter.tell() always says 0; WARC offsets need the real position.
        return self._position


def _classify(error: Exception) -> _Failure:
    """Sort a foreign exception into transient, refused (permanent) or missing."""
    if isinstance(error, requests.HTTPError) and error.response is not None:
        kind = "transient" if error.response.status_code >= 500 else "refused"
        return _Failure(kind, _http_problem(error.response))
    if isinstance(error, requests.RequestException | urllib3.exceptions.HTTPError):
        # Connection refused or reset, timeouts, a body cut short: the next attempt may work.
        return _Failure("transient", f"{type(error).__name__}: {_text(str(error))}")
    if isinstance(error, KeyError):
        return _Failure("transient", f"malformed WebHDFS answer (no {error})")
    name = getattr(error, "exception", None)
    message = _text(getattr(error, "message", str(error)))
    if name in _RETRIABLE:
        return _Failure("transient", f"{name}: {message}")
    if name == "FileNotFoundException":
        return _Failure("missing", message)
    if name in _DENIED:
        return _Failure("refused", f"{name}: {message}")
    if name is None and message.startswith("Unable to rename"):
        # RENAME answered false: another writer published first, or the temp file vanished.
        return _Failure("transient", f"RENAME refused: {message}")
    if name is None and message.startswith("Authentication failure"):
        return _Failure("refused", "authentication failed (HTTP 401): check VCRAWL_HDFS_USER or the Kerberos ticket")
    return _Failure("refused", f"{name or 'HdfsError'}: {message}")


def _raise_for_server_error(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    """Raise requests.HTTPError for a 5xx answer (a requests response hook).

    HdfsCLI turns every non-2xx answer into an HdfsError without the status code; a 5xx from a
    NameNode or DataNode (overloaded, restarting, disk full) must stay recognisable as transient.
    """
    if response.status_code >= 500:
        _ = response.content  # read the body so the connection goes back to the pool
        raise requests.HTTPError(f"HTTP {response.status_code}", response=response)


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # NameNode and DataNode traffic never goes through HTTP(S)_PROXY
    session.hooks["response"].append(_raise_for_server_error)
    return session


def _kerberos_client_class() -> Any:
    try:
        from hdfs.ext.kerberos import KerberosClient  # imports requests_kerberos
    except ImportError as e:
        raise ConfigError(
            "VCRAWL_HDFS_KERBEROS=true needs the requests-kerberos package (pip install 'hdfs[kerberos]')"
        ) from e
    return KerberosClient


def _file_status(client: hdfs.Client, path: str) -> dict[str, Any] | None:
    # Not status(strict=False): that turns every error answer (access denied, safe mode) into "absent".
    try:
        return client.status(path)
    except hdfs.HdfsError as e:
        if e.exception == "FileNotFoundException":
            return None
        raise


def _http_problem(response: requests.Response) -> str:
    where = urlsplit(response.url).netloc
    try:
        remote = response.json()["RemoteException"]
        detail = f"{remote['exception']}: {_text(remote['message'])}"
    except (ValueError, KeyError, TypeError):
        detail = _text(response.content) or response.reason
    return f"HTTP {response.status_code} from {where}: {detail}"


def _parse_root(root: str) -> tuple[str, str]:
    """Return (namenode, normalized absolute path) of the data root URL."""
    parts = urlsplit(root)
    if parts.scheme.lower() != "hdfs" or "@" in parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"VCRAWL_DATA={root!r} must be hdfs://host:port/dir (no user, query or fragment)")
    try:
        namenode = _namenode(parts)
    except ValueError as e:
        raise ConfigError(f"VCRAWL_DATA={root!r}: {e}") from None
    if _control_character(root) is not None:
        raise ConfigError(f"VCRAWL_DATA={root!r} contains control characters")
    path = posixpath.normpath("/" + parts.path.lstrip("/"))
    if path == "/":
        raise ConfigError(f"VCRAWL_DATA={root!r} must name a directory below the HDFS root /")
    if problem := _path_problem(parts.path.rstrip("/")):
        raise ConfigError(f"VCRAWL_DATA={root!r}: the root path {problem}")
    return namenode, path


def _parse_allowed(entry: str) -> str:
    parts = urlsplit("//" + entry.strip())
    try:
        if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError("extra parts")
        return _namenode(parts)
    except ValueError:
        raise ConfigError(f"VCRAWL_HDFS_NAMENODES entry {entry!r} is not host:port (the WebHDFS HTTP port)") from None


def _namenode(parts: SplitResult) -> str:
    """Return ``host:port`` (``[v6]:port``) of a split URL.

    Raises:
        ValueError: no host, no port, or a bad port.
    """
    host = parts.hostname
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"has a bad port in {parts.netloc!r}") from None
    if not host:
        raise ValueError("names no NameNode host")
    if port is None:
        raise ValueError(f"names no port for {host}; give the NameNode's WebHDFS HTTP port (9870 on Hadoop 3)")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _path_problem(raw: str) -> str | None:
    """Return why the raw URL path cannot name a file, or None."""
    if not raw.startswith("/"):
        return "has no absolute path"
    if "%" in raw:
        return "contains '%'; percent-encoded hdfs:// paths are not supported"
    if ":" in raw:
        return "contains ':', which HDFS does not allow in names"
    if raw.endswith("/"):
        return "ends in '/' (a directory, not a file)"
    if (name := raw.rsplit("/", 1)[1]) in (".", ".."):
        return f"ends in {name!r} (a directory, not a file)"
    return None


def _control_character(text: str) -> str | None:
    return next((char for char in text if unicodedata.category(char) == "Cc"), None)


def _text(message: object) -> str:
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
    return text.strip()[:_PROBLEM_CHARS]


def _refuse(location: str, problem: str) -> StorageRefused:
    logger.debug("refuse storage location %r: %s", location, problem)
    return StorageRefused(location, problem)
