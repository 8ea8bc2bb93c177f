"""One storage suite, run against the local backend and the WebHDFS backend (with the WebHDFS test server).

No Hadoop can run here: ``hdfs://`` tests talk to tests/webhdfs_server.py, a protocol-level
stand-in for a NameNode and a DataNode. The HDFS-only tests at the end cover what only a remote
store has: NameNode allow lists, retries, server errors and failures mid-upload.
"""

from __future__ import annotations

import os
import posixpath
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import hdfs
import pytest
import requests

from storage import LocalBackend, Storage, WebHdfsBackend, webhdfs_factory
from tests.webhdfs_server import LoggedRequest, WebHdfsTestServer
from vcrawl.errors import ConfigError, MissingPage, StorageFailed, StorageRefused
from vcrawl.settings import Settings

USER = "vcrawl"
FAST = {"retries": 3, "backoff_s": 0.01}


@pytest.fixture
def webhdfs() -> Iterator[WebHdfsTestServer]:
    """A fresh WebHDFS test server (NameNode + DataNode) per test."""
    with WebHdfsTestServer() as server:
        yield server


@pytest.fixture(params=["local", "hdfs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """The same Storage router over a local directory, then over ``hdfs://<test server>/crawl``."""
    if request.param == "local":
        return Storage(str(tmp_path / "data"), backends=backends([]))
    server: WebHdfsTestServer = request.getfixturevalue("webhdfs")
    return Storage(f"hdfs://{server.namenode}/crawl", backends=backends([server.namenode]))


def backends(allowed: list[str], **options: Any) -> dict[str, Callable[[str], Any]]:
    """The router's factories: local files, and WebHDFS as user "vcrawl" with `allowed` NameNodes."""
    return {"file": LocalBackend, "hdfs": partial(WebHdfsBackend, user=USER, allowed_namenodes=allowed, **options)}


def hdfs_store(server: WebHdfsTestServer, **options: Any) -> Storage:
    """A Storage on the test server with fast retries (for the HDFS-only tests)."""
    return Storage(f"hdfs://{server.namenode}/crawl", backends=backends([server.namenode], **{**FAST, **options}))


def is_hdfs(store: Storage) -> bool:
    """True for the store on the WebHDFS test server."""
    return store.describe().startswith("hdfs://")


def listing(store: Storage, directory: str) -> list[str]:
    """Names in `directory` (relative to the data root), read from the storage system itself."""
    root = store.describe()
    if not is_hdfs(store):
        path = Path(root, directory)
        return sorted(os.listdir(path)) if path.is_dir() else []
    parts = urlsplit(root)
    client = hdfs.InsecureClient(f"http://{parts.netloc}", user=USER, root="/")
    path = posixpath.join(parts.path, directory)
    return sorted(client.list(path)) if client.status(path, strict=False) else []


def dn_writes(server: WebHdfsTestServer) -> list[LoggedRequest]:
    """The upload requests the DataNode received."""
    return [r for r in server.requests if r.role == "datanode" and r.op in ("CREATE", "APPEND")]


# --- the same behaviour from both backends ---------------------------------------------------------


def test_round_trip(store: Storage) -> None:
    assert store.write_bytes("pages/example.com/a.html", b"<html>hi</html>") == 15
    assert store.read_bytes("pages/example.com/a.html") == b"<html>hi</html>"
    assert store.exists("pages/example.com/a.html")


def test_list_files_sees_only_the_files_of_a_directory(store: Storage) -> None:
    for name in ("b.jsonl", "a.jsonl", "sub/c.jsonl"):
        store.write_bytes(f"records/{name}", b"{}\n")

    listed = store.list_files("records")

    assert [item.rsplit("/", 1)[1] for item in listed] == ["a.jsonl", "b.jsonl"]
    assert store.read_bytes(listed[0]) == b"{}\n"
    assert store.list_files("no-such-dir") == []


def test_list_dirs_sees_only_the_directories_of_a_directory(store: Storage) -> None:
    for name in ("jobs/b/fetch-log/p.jsonl", "jobs/a/records/r.jsonl", "jobs/top.json", "jobs/.hidden/x"):
        store.write_bytes(name, b"{}\n")

    assert store.list_dirs("jobs") == ["a", "b"]  # names, sorted; files and hidden directories left out
    assert store.list_dirs("jobs/b") == ["fetch-log"]
    assert store.list_dirs("no-such-dir") == []


def test_resolve_is_idempotent(store: Storage) -> None:
    once = store.resolve("pages/./example.com//a.html", "unused")
    assert once.endswith("/pages/example.com/a.html")
    assert store.resolve(once, "unused") == once


def test_names_with_spaces_plus_and_unicode_round_trip(store: Storage) -> None:
    store.write_bytes("pages/über straße+1=2.html", b"quoted")
    assert store.read_bytes("pages/über straße+1=2.html") == b"quoted"
    assert listing(store, "pages") == ["über straße+1=2.html"]


@pytest.mark.parametrize(
    ("offset", "length", "expected"),
    [(0, None, b"0123456789"), (2, 3, b"234"), (7, None, b"789"), (4, 0, b""), (8, 50, b"89"), (10, None, b"")],
)
def test_ranged_read(store: Storage, offset: int, length: int | None, expected: bytes) -> None:
    store.write_bytes("warc/part-0.warc.gz", b"0123456789")
    assert store.read_bytes("warc/part-0.warc.gz", offset, length) == expected


def test_reading_past_the_end_is_empty(store: Storage) -> None:
    store.write_bytes("short.txt", b"abc")
    assert store.read_bytes("short.txt", offset=50) == b""


def test_overwrite_replaces_content(store: Storage) -> None:
    store.write_bytes("results/links/x.json", b'{"old": "and longer"}')
    store.write_bytes("results/links/x.json", b'{"new": 1}')
    assert store.read_bytes("results/links/x.json") == b'{"new": 1}'
    assert listing(store, "results/links") == ["x.json"]


def test_parents_are_created(store: Storage) -> None:
    store.write_bytes("a/b/c/d/e.txt", b"deep")
    assert store.read_bytes("a/b/c/d/e.txt") == b"deep"
    assert listing(store, "a/b/c/d") == ["e.txt"]


def test_open_write_streams_a_large_body(store: Storage, request: pytest.FixtureRequest) -> None:
    piece = bytes(range(256)) * 256  # 64 KiB
    pieces = 80  # 5 MiB
    with store.open_write("big/body.bin") as stream:
        for n in range(pieces):
            stream.write(piece)
            if n == pieces // 2:
                assert not store.exists("big/body.bin"), "readers must not see a partial file"
        assert stream.tell() == len(piece) * pieces
    assert store.read_bytes("big/body.bin") == piece * pieces
    assert listing(store, "big") == ["body.bin"]
    if not is_hdfs(store):
        return
    server: WebHdfsTestServer = request.getfixturevalue("webhdfs")
    final = "/crawl/big/body.bin"
    creates = [r for r in server.requests if r.op == "CREATE"]
    assert [r.role for r in creates] == ["namenode", "datanode"], "one CREATE: NameNode 307, then one DataNode PUT"
    upload = creates[1]
    assert upload.chunked and upload.chunks > 1, "the body must be streamed in chunks, not sent as one buffer"
    assert upload.body_bytes == len(piece) * pieces
    temp = upload.path
    assert posixpath.dirname(temp) == "/crawl/big" and posixpath.basename(temp).startswith(".body.bin.")
    assert temp.endswith(".tmp")
    renames = [r for r in server.requests if r.op == "RENAME"]
    assert [(r.path, r.params["destination"]) for r in renames] == [(temp, final)]
    assert not [r for r in server.requests if r.path == final and r.op in ("CREATE", "APPEND")]


def test_exception_inside_open_write_leaves_nothing(store: Storage) -> None:
    with pytest.raises(RuntimeError, match="analyzer crashed"), store.open_write("pages/half.html") as stream:
        stream.write(b"<html>" * 1000)
        raise RuntimeError("analyzer crashed")
    assert not store.exists("pages/half.html")
    assert listing(store, "pages") == [], "no temp file may be left behind"


def test_failed_rewrite_keeps_the_old_version(store: Storage) -> None:
    store.write_bytes("pages/p.html", b"version 1")
    with pytest.raises(RuntimeError), store.open_write("pages/p.html") as stream:
        stream.write(b"version 2, partial")
        raise RuntimeError("cut")
    assert store.read_bytes("pages/p.html") == b"version 1"
    assert listing(store, "pages") == ["p.html"]


def test_missing_file_is_missing_page(store: Storage) -> None:
    with pytest.raises(MissingPage):
        store.read_bytes("pages/never-written.html")
    assert not store.exists("pages/never-written.html")


@pytest.mark.parametrize("location", ["../x", "a/../../x", "/etc/passwd", "{sibling}", "{root}", "{root}/"])
def test_escapes_are_refused(store: Storage, location: str) -> None:
    root = store.describe()
    location = location.format(root=root, sibling=root.rsplit("/", 1)[0] + "/other/x")
    for operation in (
        lambda: store.write_bytes(location, b"x"),
        lambda: store.read_bytes(location),
        lambda: store.exists(location),
        lambda: store.open_write(location).__enter__(),
    ):
        with pytest.raises(StorageRefused):
            operation()


def test_a_directory_is_not_a_file(store: Storage) -> None:
    store.write_bytes("dir/file.txt", b"x")
    with pytest.raises(StorageRefused, match="directory"):
        store.write_bytes("dir", b"y")
    with pytest.raises(StorageRefused, match="directory"):
        store.read_bytes("dir")
    with pytest.raises(StorageRefused, match="directory"):
        store.exists("dir")
    assert store.read_bytes("dir/file.txt") == b"x"


def test_a_file_is_not_a_parent(store: Storage) -> None:
    store.write_bytes("plain", b"x")
    with pytest.raises(StorageRefused):
        store.write_bytes("plain/child.txt", b"y")
    assert store.read_bytes("plain") == b"x"


# --- HDFS only ------------------------------------------------------------------------------------


def test_namenode_not_in_the_allow_list_is_refused(webhdfs: WebHdfsTestServer) -> None:
    store = hdfs_store(webhdfs)
    with pytest.raises(StorageRefused, match=f"NameNode 10.0.0.9:9870 is not allowed; allowed: {webhdfs.namenode}"):
        store.write_bytes("hdfs://10.0.0.9:9870/crawl/x.html", b"x")
    assert webhdfs.requests == [], "a refused location sends nothing"


def test_other_allowed_namenodes_are_accepted(webhdfs: WebHdfsTestServer) -> None:
    backend = WebHdfsBackend(
        f"hdfs://{webhdfs.namenode}/crawl", user=USER, allowed_namenodes=[webhdfs.namenode, "NN2.example:9870"]
    )
    assert backend.resolve("hdfs://nn2.EXAMPLE:9870/crawl/./a//b.html") == "hdfs://nn2.example:9870/crawl/a/b.html"
    assert backend.resolve(backend.resolve("hdfs://nn2.example:9870/crawl/a")) == "hdfs://nn2.example:9870/crawl/a"


@pytest.mark.parametrize(
    ("location", "problem"),
    [
        ("pages/a\nb.html", "control character U+000A"),
        ("pages/a\tb.html", "control character U+0009"),
        ("pages/a\x1b[31m.html", "control character U+001B"),
        ("pages/a\x7f.html", "control character U+007F"),
        ("pages/a\x85.html", "control character U+0085"),
        ("pages/a\x00.html", "NUL"),
        ("hdfs://{nn}/crawl/x.html?op=DELETE", "query or fragment"),
        ("hdfs://{nn}/crawl/x.html#frag", "query or fragment"),
        ("hdfs://root@{nn}/crawl/x.html", "names a user"),
        ("hdfs://127.0.0.1/crawl/x.html", "no port"),
        ("hdfs://{nn}/crawl/pages/", "ends in '/'"),
        ("hdfs://{nn}/crawl/pages/..", "ends in '..'"),
        ("pages/%2e%2e/%2e%2e/etc/passwd", "'%'"),
        ("pages/a:b.html", "':'"),
        ("hdfs://{nn}/crawl", "storage root itself"),
        ("hdfs://{nn}/crawl/../crawl-other/x", "escapes the storage root"),
        ("pages/" + "n" * 256, "longer than 255 bytes"),
    ],
)
def test_bad_hdfs_locations_are_refused(webhdfs: WebHdfsTestServer, location: str, problem: str) -> None:
    store = hdfs_store(webhdfs)
    with pytest.raises(StorageRefused) as caught:
        store.write_bytes(location.format(nn=webhdfs.namenode), b"x")
    assert problem in caught.value.problem
    assert webhdfs.requests == []


def test_transient_503s_are_retried(webhdfs: WebHdfsTestServer) -> None:
    store = hdfs_store(webhdfs)
    webhdfs.fail_next(2)
    assert store.write_bytes("pages/retried.html", b"made it") == 7
    assert store.read_bytes("pages/retried.html") == b"made it"
    assert [r.status for r in webhdfs.requests[:3]] == [503, 503, 200]


@pytest.mark.parametrize("exception", ["StandbyException", "SafeModeException"])
def test_retriable_remote_exceptions_are_retried(webhdfs: WebHdfsTestServer, exception: str) -> None:
    store = hdfs_store(webhdfs)
    webhdfs.fail_next(1, status=403, exception=exception)
    assert store.exists("pages/none.html") is False


def test_persistent_503_is_storage_failed(webhdfs: WebHdfsTestServer) -> None:
    store = hdfs_store(webhdfs)
    webhdfs.fail_next(1000)
    for operation in (
        lambda: store.write_bytes("pages/x.html", b"x"),
        lambda: store.read_bytes("pages/x.html"),
        lambda: store.exists("pages/x.html"),  # never "False" because the NameNode is down
    ):
        with pytest.raises(StorageFailed, match=r"HTTP 503 .*RetriableException.*gave up after 4 attempts"):
            operation()


def test_unreachable_namenode_is_storage_failed(tmp_path: Path) -> None:
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        namenode = f"127.0.0.1:{bound.getsockname()[1]}"
        store = Storage(f"hdfs://{namenode}/crawl", backends=backends([namenode], retries=1, backoff_s=0.01))
        with pytest.raises(StorageFailed, match="ConnectionError"):
            store.write_bytes("pages/x.html", b"x")


def test_access_denied_is_refused(webhdfs: WebHdfsTestServer) -> None:
    store = hdfs_store(webhdfs)
    store.write_bytes("private/old.html", b"secret")
    webhdfs.deny("/crawl/private")
    before = len(webhdfs.requests)
    with pytest.raises(StorageRefused, match="AccessControlException: Permission denied: user=vcrawl"):
        store.write_bytes("private/new.html", b"x")
    with pytest.raises(StorageRefused, match="AccessControlException"):
        store.read_bytes("private/old.html")
    assert len(webhdfs.requests) == before + 2, "a permanent error is not retried"
    assert store.write_bytes("public/ok.html", b"fine") == 4


def test_datanode_failure_mid_stream_is_storage_failed(webhdfs: WebHdfsTestServer) -> None:
    store = hdfs_store(webhdfs)
    webhdfs.fail_datanode_writes(1)  # keeps half the body under the temp name, then answers 500
    with pytest.raises(StorageFailed, match=r"HTTP 500 .*IOException: No space left on device"):
        with store.open_write("pages/full.html") as stream:
            for _ in range(16):
                stream.write(b"x" * 65536)
    assert not store.exists("pages/full.html")
    assert listing(store, "pages") == [], "the partial temp file must be deleted"
    assert len(dn_writes(webhdfs)) == 1, "a consumed stream cannot be replayed, so it is not retried"


def test_write_bytes_retries_a_datanode_failure(webhdfs: WebHdfsTestServer) -> None:
    store = hdfs_store(webhdfs)
    webhdfs.fail_datanode_writes(1)
    assert store.write_bytes("pages/second-try.html", b"x" * 100_000) == 100_000
    assert store.read_bytes("pages/second-try.html") == b"x" * 100_000
    assert [r.status for r in dn_writes(webhdfs)] == [500, 201]
    assert listing(store, "pages") == ["second-try.html"]


def test_persistent_datanode_failure_leaves_no_partial_file(webhdfs: WebHdfsTestServer) -> None:
    store = hdfs_store(webhdfs)
    store.write_bytes("pages/kept.html", b"old version")
    webhdfs.fail_datanode_writes(10)
    with pytest.raises(StorageFailed, match="No space left on device"):
        store.write_bytes("pages/kept.html", b"new version" * 1000)
    assert store.read_bytes("pages/kept.html") == b"old version"
    assert listing(store, "pages") == ["kept.html"]


def test_concurrent_writers_publish_whole_files(webhdfs: WebHdfsTestServer) -> None:
    store = hdfs_store(webhdfs, retries=10, backoff_s=0.001)
    bodies = [bytes([65 + n]) * 20_000 for n in range(6)]
    errors: list[BaseException] = []

    def write(body: bytes) -> None:
        try:
            store.write_bytes("pages/contended.html", body)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert store.read_bytes("pages/contended.html") in bodies
    assert listing(store, "pages") == ["contended.html"]


def test_requests_carry_the_user_and_never_ask_for_a_home_directory(webhdfs: WebHdfsTestServer) -> None:
    store = hdfs_store(webhdfs)
    store.write_bytes("pages/u.html", b"u")
    store.read_bytes("pages/u.html")
    assert {r.params.get("user.name") for r in webhdfs.requests} == {USER}
    assert "GETHOMEDIRECTORY" not in {r.op for r in webhdfs.requests}


def test_router_factory_from_settings(webhdfs: WebHdfsTestServer) -> None:
    settings = Settings(data=f"hdfs://{webhdfs.namenode}/crawl", hdfs_user=USER, hdfs_namenodes=(webhdfs.namenode,))
    store = Storage(settings.data, backends={"file": LocalBackend, "hdfs": webhdfs_factory(settings)})
    store.write_bytes("pages/s.html", b"settings")
    assert webhdfs.read("/crawl/pages/s.html") == b"settings"


def test_missing_user_is_a_config_error_at_first_use(webhdfs: WebHdfsTestServer) -> None:
    settings = Settings(data=f"hdfs://{webhdfs.namenode}/crawl", hdfs_namenodes=(webhdfs.namenode,))
    store = Storage(settings.data, backends={"file": LocalBackend, "hdfs": webhdfs_factory(settings)})
    with pytest.raises(ConfigError, match="VCRAWL_HDFS_USER must be set for hdfs:// storage"):
        store.exists("pages/x.html")


def test_kerberos_without_requests_kerberos_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hdfs.ext.kerberos", None)  # as if requests-kerberos were not installed
    with pytest.raises(ConfigError, match="VCRAWL_HDFS_KERBEROS"):
        WebHdfsBackend("hdfs://nn:9870/crawl", user=None, allowed_namenodes=[], kerberos=True)


@pytest.mark.parametrize(
    ("root", "allowed", "problem"),
    [
        ("hdfs://nn/crawl", [], "no port"),
        ("hdfs://nn:9870/", [], "below the HDFS root"),
        ("hdfs://nn:9870", [], "below the HDFS root"),
        ("hdfs://nn:9870/crawl?x=1", [], "no user, query or fragment"),
        ("hdfs://nn:9870/crawl", ["other:9870"], "not in VCRAWL_HDFS_NAMENODES"),
        ("hdfs://nn:9870/crawl", ["http://nn:9870"], "VCRAWL_HDFS_NAMENODES entry"),
        ("hdfs://nn:9870/crawl", ["nn"], "VCRAWL_HDFS_NAMENODES entry"),
    ],
)
def test_bad_configuration_is_a_config_error(root: str, allowed: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        WebHdfsBackend(root, user=USER, allowed_namenodes=allowed)


# --- the test server answers like WebHDFS (what NOTES.md says HdfsCLI relies on) ----------------------


def test_test_server_speaks_webhdfs(webhdfs: WebHdfsTestServer) -> None:
    client = hdfs.InsecureClient(webhdfs.url, user=USER, root="/")
    client.write("/d/f.txt", data=b"one")
    with pytest.raises(hdfs.HdfsError) as exists:
        client.write("/d/f.txt", data=b"two", overwrite=False)
    assert exists.value.exception == "FileAlreadyExistsException"
    client.write("/d/f.txt", data=b"+", append=True)
    with client.read("/d/f.txt", offset=1, length=2) as reader:
        assert reader.read() == b"ne"
    assert client.status("/d/f.txt")["length"] == 4 and client.status("/d", strict=False)["type"] == "DIRECTORY"
    assert client.list("/d") == ["f.txt"]
    with pytest.raises(hdfs.HdfsError) as not_empty:
        client.delete("/d")
    assert not_empty.value.exception == "PathIsNotEmptyDirectoryException"
    client.write("/d/g.txt", data=b"g")
    with pytest.raises(hdfs.HdfsError, match="Unable to rename"):
        client.rename("/d/f.txt", "/d/g.txt")
    assert client.delete("/d", recursive=True) and not client.delete("/d")
    anonymous = requests.get(f"{webhdfs.url}/webhdfs/v1/x?op=GETFILESTATUS", timeout=5)
    assert anonymous.status_code == 401
    assert anonymous.json()["RemoteException"]["exception"] == "SecurityException"
    missing = requests.get(f"{webhdfs.url}/webhdfs/v1/x?op=GETFILESTATUS&user.name=u", timeout=5)
    assert (missing.status_code, missing.json()["RemoteException"]["exception"]) == (404, "FileNotFoundException")
    shouting = requests.put(f"{webhdfs.url}/webhdfs/v1/e?op=MKDIRS&user.name=u", timeout=5)
    assert shouting.json() == {"boolean": True}
    assert requests.delete(f"{webhdfs.url}/webhdfs/v1/e?op=DELETE&recursive=TRUE&user.name=u", timeout=5).json() == {
        "boolean": True
    }
