"""A WebHDFS *protocol-level test server*: a stand-in for a Hadoop cluster in tests, not HDFS.

No Hadoop distribution can be installed on these machines, so storage tests talk to this server
instead. It speaks the WebHDFS REST protocol as HdfsCLI 2.7 uses it (docs: /work/shared/NOTES.md,
"HDFS"): a "NameNode" and a "DataNode" on two loopback ports, the NameNode answering CREATE,
APPEND and OPEN with a ``307`` to the DataNode, which takes (possibly chunked) bodies and serves
bytes. Files live in memory. Errors use Hadoop's ``RemoteException`` JSON envelope and status
codes (404 not found; 403 exists, denied, not empty; 400 bad argument; 401 no user).

Operations: GETHOMEDIRECTORY, CREATE, APPEND, OPEN (offset, length), GETFILESTATUS, LISTSTATUS,
MKDIRS, RENAME, DELETE. Not modelled: permissions (only `deny`), blocks, replication, leases,
quotas, snapshots, HA, Kerberos (``user.name`` must be present, nothing more).

Faults for tests: `fail_next` (the next NameNode requests answer an error), `deny` (access
denied under a path), `fail_datanode_writes` (a DataNode write keeps half the body, then fails,
like a full disk). `requests` logs what arrived (role, method, op, path, chunking, body size).
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

__all__ = ["LoggedRequest", "WebHdfsTestServer"]

_PREFIX = "/webhdfs/v1"
_BLOCK_SIZE = 128 * 1024 * 1024
# Hadoop's WebHDFS ExceptionHandler: exception -> (Java class, HTTP status).
_EXCEPTIONS: dict[str, tuple[str, int]] = {
    "FileNotFoundException": ("java.io.FileNotFoundException", 404),
    "FileAlreadyExistsException": ("org.apache.hadoop.fs.FileAlreadyExistsException", 403),
    "ParentNotDirectoryException": ("org.apache.hadoop.fs.ParentNotDirectoryException", 403),
    "PathIsNotEmptyDirectoryException": ("org.apache.hadoop.fs.PathIsNotEmptyDirectoryException", 403),
    "AccessControlException": ("org.apache.hadoop.security.AccessControlException", 403),
    "EOFException": ("java.io.EOFException", 403),
    "IOException": ("java.io.IOException", 403),
    "RetriableException": ("org.apache.hadoop.ipc.RetriableException", 403),
    "StandbyException": ("org.apache.hadoop.ipc.StandbyException", 403),
    "SafeModeException": ("org.apache.hadoop.hdfs.server.namenode.SafeModeException", 403),
    "IllegalArgumentException": ("java.lang.IllegalArgumentException", 400),
    "UnsupportedOperationException": ("java.lang.UnsupportedOperationException", 400),
    "SecurityException": ("java.lang.SecurityException", 401),
}
_NAMENODE_OPS = {
    "GET": {"GETHOMEDIRECTORY", "GETFILESTATUS", "LISTSTATUS", "OPEN"},
    "PUT": {"CREATE", "MKDIRS", "RENAME"},
    "POST": {"APPEND"},
    "DELETE": {"DELETE"},
}
_DATANODE_OPS = {"GET": {"OPEN"}, "PUT": {"CREATE"}, "POST": {"APPEND"}}


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it."""

    role: str  # "namenode" or "datanode"
    method: str
    op: str
    path: str
    params: dict[str, str]
    chunked: bool  # the body came with Transfer-Encoding: chunked
    chunks: int  # body pieces on the wire (chunks, or 1 for a Content-Length body)
    body_bytes: int
    status: int


class _Remote(Exception):
    """An error answered in the RemoteException envelope."""

    def __init__(self, exception: str, message: str, status: int | None = None) -> None:
        super().__init__(exception, message, status)
        self.exception, self.message = exception, message
        self.status = _EXCEPTIONS.get(exception, ("", 500))[1] if status is None else status

    def envelope(self) -> dict[str, Any]:
        java = _EXCEPTIONS.get(self.exception, (f"org.apache.hadoop.{self.exception}", 0))[0]
        return {"RemoteException": {"exception": self.exception, "javaClassName": java, "message": self.message}}


@dataclass
class _Entry:
    owner: str
    file_id: int
    modified_ms: int
    data: bytes | None = None  # None: a directory


@dataclass
class _Fault:
    status: int
    exception: str
    message: str


@dataclass
class _State:
    entries: dict[str, _Entry] = field(default_factory=dict)
    log: list[LoggedRequest] = field(default_factory=list)
    fail_namenode: list[_Fault] = field(default_factory=list)
    fail_datanode_writes: list[_Fault] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    next_id: int = 16386  # Hadoop's first inode id after the root


class WebHdfsTestServer:
    """A WebHDFS NameNode + DataNode pair on 127.0.0.1 over an in-memory file system (a test stand-in)."""

    __test__ = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = _State()
        self._state.entries["/"] = _Entry("hdfs", 16385, _now_ms())
        self._namenode = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("namenode"))
        self._datanode = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("datanode"))
        self._threads = []
        for server in (self._namenode, self._datanode):
            server.daemon_threads = True
            # A short poll interval: shutdown() waits for it, and every test starts and stops a server.
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
            self._threads.append(thread)

    def __enter__(self) -> WebHdfsTestServer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in (self._namenode, self._datanode):
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(5)

    @property
    def namenode(self) -> str:
        """The NameNode's ``127.0.0.1:PORT`` (its WebHDFS HTTP port)."""
        return f"127.0.0.1:{self._namenode.server_address[1]}"

    @property
    def datanode(self) -> str:
        """The DataNode's ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self._datanode.server_address[1]}"

    @property
    def url(self) -> str:
        """The NameNode URL an HdfsCLI client takes: ``http://127.0.0.1:PORT``."""
        return f"http://{self.namenode}"

    @property
    def requests(self) -> list[LoggedRequest]:
        """Every request received so far, in order of completion."""
        with self._lock:
            return list(self._state.log)

    def fail_next(
        self, n: int, status: int = 503, exception: str = "RetriableException", message: str = "try again later"
    ) -> None:
        """Make the next `n` NameNode requests answer `status` with `exception`."""
        with self._lock:
            self._state.fail_namenode.extend(_Fault(status, exception, message) for _ in range(n))

    def deny(self, path: str) -> None:
        """Answer 403 AccessControlException for any NameNode request on `path` or below it."""
        with self._lock:
            self._state.denied.append(path.rstrip("/") or "/")

    def fail_datanode_writes(
        self, n: int, status: int = 500, exception: str = "IOException", message: str = "No space left on device"
    ) -> None:
        """Make the next `n` DataNode writes store half their body, then answer `status` (a full disk)."""
        with self._lock:
            self._state.fail_datanode_writes.extend(_Fault(status, exception, message) for _ in range(n))

    def listdir(self, path: str) -> list[str]:
        """Return the sorted names in directory `path` (empty if it does not exist)."""
        with self._lock:
            return [posixpath.basename(child) for child in self._children(path.rstrip("/") or "/")]

    def walk(self, path: str) -> list[str]:
        """Return the sorted paths of every file below directory `path`."""
        prefix = path.rstrip("/") + "/"
        with self._lock:
            return sorted(p for p, e in self._state.entries.items() if p.startswith(prefix) and e.data is not None)

    def read(self, path: str) -> bytes | None:
        """Return the content of file `path`, or None if there is no such file."""
        with self._lock:
            entry = self._state.entries.get(path)
            return None if entry is None else entry.data

    # --- request handling -------------------------------------------------------------------

    def _handler(self, role: str) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10
            disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

            def do_GET(self) -> None:
                server._serve(self, role)

            def do_PUT(self) -> None:
                server._serve(self, role)

            def do_POST(self) -> None:
                server._serve(self, role)

            def do_DELETE(self) -> None:
                server._serve(self, role)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def _serve(self, handler: BaseHTTPRequestHandler, role: str) -> None:
        try:
            body, chunked, chunks = _read_body(handler)
        except (ValueError, OSError):  # a malformed chunk or a client gone mid-body
            handler.close_connection = True
            return
        url = urlsplit(handler.path)
        params = {key.lower(): value for key, value in parse_qsl(url.query, keep_blank_values=True)}
        op = params.get("op", "").upper()
        path = (unquote(url.path[len(_PREFIX) :]) or "/") if url.path.startswith(_PREFIX) else url.path
        try:
            status, headers, payload = self._answer(role, handler.command, url.path, op, path, params, body)
        except _Remote as e:
            status, headers, payload = e.status, {"Content-Type": "application/json"}, json.dumps(e.envelope()).encode()
        with self._lock:
            self._state.log.append(
                LoggedRequest(role, handler.command, op, path, params, chunked, chunks, len(body), status)
            )
        try:
            handler.send_response(status)
            for name, value in {**headers, "Content-Length": str(len(payload))}.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True

    def _answer(
        self, role: str, method: str, url_path: str, op: str, path: str, params: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if role == "namenode":
            with self._lock:
                fault = self._state.fail_namenode.pop(0) if self._state.fail_namenode else None
            if fault is not None:
                raise _Remote(fault.exception, fault.message, fault.status)
        if not url_path.startswith(_PREFIX):
            raise _Remote("IllegalArgumentException", f"not a WebHDFS URL: {url_path}")
        ops = _NAMENODE_OPS if role == "namenode" else _DATANODE_OPS
        if op not in ops.get(method, set()):
            raise _Remote("IllegalArgumentException", f'Invalid value for webhdfs parameter "op": {method} op={op}')
        user = params.get("user.name")
        if not user:
            raise _Remote(
                "SecurityException",
                "Failed to obtain user group information: java.io.IOException: Security enabled but user not "
                "authenticated by filter",
            )
        _check_path(path)
        if role == "datanode":
            return self._datanode_op(method, op, path, params, body, user)
        self._check_access(path, user, params)
        if op in ("CREATE", "APPEND", "OPEN"):
            query = {k: v for k, v in params.items() if k != "op"}
            query = {"op": op, "namenoderpcaddress": "127.0.0.1:8020", **query}
            location = f"http://{self.datanode}{_PREFIX}{quote(path)}?{urlencode(query)}"
            return 307, {"Location": location, "Content-Type": "application/octet-stream"}, b""
        with self._lock:
            result = self._namenode_op(op, path, params, user)
        return 200, {"Content-Type": "application/json"}, json.dumps(result).encode()

    def _check_access(self, path: str, user: str, params: dict[str, str]) -> None:
        with self._lock:
            denied = list(self._state.denied)
        for checked in (path, params.get("destination")):
            if checked and any(checked == d or checked.startswith(d.rstrip("/") + "/") for d in denied):
                raise _Remote(
                    "AccessControlException",
                    f'Permission denied: user={user}, access=WRITE, inode="{checked}":hdfs:supergroup:drwx------',
                )

    def _namenode_op(self, op: str, path: str, params: dict[str, str], user: str) -> dict[str, Any]:
        entries = self._state.entries
        if op == "GETHOMEDIRECTORY":
            return {"Path": f"/user/{user}"}
        if op == "GETFILESTATUS":
            if path not in entries:
                raise _Remote("FileNotFoundException", f"File does not exist: {path}")
            return {"FileStatus": self._status(path, "")}
        if op == "LISTSTATUS":
            if path not in entries:
                raise _Remote("FileNotFoundException", f"File {path} does not exist.")
            if entries[path].data is not None:
                statuses = [self._status(path, "")]
            else:
                statuses = [self._status(child, posixpath.basename(child)) for child in self._children(path)]
            return {"FileStatuses": {"FileStatus": statuses}}
        if op == "MKDIRS":
            self._mkdirs(path, user)
            return {"boolean": True}
        if op == "RENAME":
            destination = params.get("destination", "")
            if not destination.startswith("/"):
                raise _Remote(
                    "IllegalArgumentException", f'Invalid value for webhdfs parameter "destination": {destination!r}'
                )
            _check_path(destination)
            return {"boolean": self._rename(path, destination)}
        return {"boolean": self._delete(path, _boolean(params, "recursive"))}

    def _datanode_op(
        self, method: str, op: str, path: str, params: dict[str, str], body: bytes, user: str
    ) -> tuple[int, dict[str, str], bytes]:
        if "namenoderpcaddress" not in params:
            raise _Remote("IllegalArgumentException", "namenoderpcaddress is not specified.")
        if op == "OPEN":
            offset, length = _integer(params, "offset", 0), _integer(params, "length", None)
            with self._lock:
                entry = self._state.entries.get(path)
            if entry is None:
                raise _Remote("FileNotFoundException", f"File {path} not found.")
            if entry.data is None:
                raise _Remote("FileNotFoundException", f"Path is not a file: {path}")
            if offset > len(entry.data):
                raise _Remote("EOFException", "Cannot seek after EOF")
            end = len(entry.data) if length is None else offset + length
            return 200, {"Content-Type": "application/octet-stream"}, entry.data[offset:end]
        with self._lock:
            fault = self._state.fail_datanode_writes.pop(0) if self._state.fail_datanode_writes else None
            if op == "CREATE":
                stored = body if fault is None else body[: len(body) // 2]
                self._create(path, stored, _boolean(params, "overwrite"), user)
            else:
                self._append(path, body if fault is None else body[: len(body) // 2])
        if fault is not None:
            raise _Remote(fault.exception, fault.message, fault.status)
        if op == "CREATE":
            return 201, {"Location": f"hdfs://127.0.0.1:8020{quote(path)}"}, b""
        return 200, {}, b""

    # --- the file system (called with the lock held) ----------------------------------------

    def _status(self, path: str, suffix: str) -> dict[str, Any]:
        entry = self._state.entries[path]
        is_file = entry.data is not None
        return {
            "accessTime": entry.modified_ms if is_file else 0,
            "blockSize": _BLOCK_SIZE if is_file else 0,
            "childrenNum": 0 if is_file else len(self._children(path)),
            "fileId": entry.file_id,
            "group": "supergroup",
            "length": len(entry.data) if entry.data is not None else 0,
            "modificationTime": entry.modified_ms,
            "owner": entry.owner,
            "pathSuffix": suffix,
            "permission": "644" if is_file else "755",
            "replication": 3 if is_file else 0,
            "storagePolicy": 0,
            "type": "FILE" if is_file else "DIRECTORY",
        }

    def _children(self, path: str) -> list[str]:
        return sorted(p for p in self._state.entries if p != "/" and _parent(p) == path)

    def _new_entry(self, path: str, user: str, data: bytes | None) -> None:
        self._state.next_id += 1
        self._state.entries[path] = _Entry(user, self._state.next_id, _now_ms(), data)
        self._touch(_parent(path))

    def _touch(self, path: str) -> None:
        if path in self._state.entries:
            self._state.entries[path].modified_ms = _now_ms()

    def _mkdirs(self, path: str, user: str) -> None:
        current = ""
        components = [part for part in path.split("/") if part]
        for index, part in enumerate(components):
            current += "/" + part
            entry = self._state.entries.get(current)
            if entry is None:
                self._new_entry(current, user, None)
            elif entry.data is not None:
                if index == len(components) - 1:
                    raise _Remote("FileAlreadyExistsException", f"Path is not a directory: {current}")
                raise _Remote("ParentNotDirectoryException", f"{current} (is not a directory)")

    def _create(self, path: str, data: bytes, overwrite: bool, user: str) -> None:
        entry = self._state.entries.get(path)
        if entry is not None and entry.data is None:
            raise _Remote("FileAlreadyExistsException", f"{path} already exists as a directory")
        if entry is not None and not overwrite:
            raise _Remote("FileAlreadyExistsException", f"{path} for client 127.0.0.1 already exists")
        parent = _parent(path)
        parent_entry = self._state.entries.get(parent)
        if parent_entry is not None and parent_entry.data is not None:
            raise _Remote("ParentNotDirectoryException", f"{parent} (is not a directory)")
        self._mkdirs(parent, user)
        self._new_entry(path, user, data)

    def _append(self, path: str, data: bytes) -> None:
        entry = self._state.entries.get(path)
        if entry is None:
            raise _Remote("FileNotFoundException", f"File {path} not found.")
        if entry.data is None:
            raise _Remote("FileNotFoundException", f"Path is not a file: {path}")
        entry.data += data
        entry.modified_ms = _now_ms()

    def _rename(self, source: str, destination: str) -> bool:
        entries = self._state.entries
        if source == "/" or source not in entries:
            return False
        target = entries.get(destination)
        if target is not None and target.data is None:  # into an existing directory, as Hadoop does
            destination = posixpath.join(destination, posixpath.basename(source))
        parent = entries.get(_parent(destination))
        if destination in entries or parent is None or parent.data is not None:
            return False
        if destination == source or destination.startswith(source + "/"):
            return False
        moved = [p for p in entries if p == source or p.startswith(source + "/")]
        for old in moved:
            entries[destination + old[len(source) :]] = entries.pop(old)
        self._touch(_parent(source))
        self._touch(_parent(destination))
        return True

    def _delete(self, path: str, recursive: bool) -> bool:
        entries = self._state.entries
        if path == "/" or path not in entries:
            return False
        below = [p for p in entries if p.startswith(path + "/")]
        if below and not recursive:
            raise _Remote("PathIsNotEmptyDirectoryException", f"`{path} is non empty': Directory is not empty")
        for p in [path, *below]:
            del entries[p]
        self._touch(_parent(path))
        return True


def _read_body(handler: BaseHTTPRequestHandler) -> tuple[bytes, bool, int]:
    """Return (body, chunked?, pieces): a chunked body is reassembled, piece by piece."""
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        pieces: list[bytes] = []
        while True:
            size = int(handler.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            pieces.append(handler.rfile.read(size))
            handler.rfile.readline(8)  # the CRLF after each chunk
        while handler.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return b"".join(pieces), True, len(pieces)
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length), False, 1 if length else 0


def _check_path(path: str) -> None:
    parts = path.split("/")
    if not path.startswith("/") or any(part in (".", "..") or ":" in part for part in parts):
        raise _Remote("IllegalArgumentException", f"Invalid path name {path}")


def _boolean(params: dict[str, str], name: str) -> bool:
    value = params.get(name, "false").lower()  # HdfsCLI sends True/False
    if value not in ("true", "false"):
        raise _Remote("IllegalArgumentException", f'Invalid value for webhdfs parameter "{name}": {value!r}')
    return value == "true"


def _integer(params: dict[str, str], name: str, default: int | None) -> Any:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise _Remote("IllegalArgumentException", f'Invalid value for webhdfs parameter "{name}": {raw!r}')
    return value


def _parent(path: str) -> str:
    return posixpath.dirname(path.rstrip("/")) or "/"


def _now_ms() -> int:
    return int(time.time() * 1000)
