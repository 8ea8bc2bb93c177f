"""Storage: confinement to the data root, atomic writes, scheme routing and URL-derived names."""

from __future__ import annotations

import doctest
import functools
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path
from typing import BinaryIO

import pytest

import storage.local
import storage.naming
from storage import BACKENDS, Backend, LocalBackend, Storage, WebHdfsBackend, page_location, result_location
from vcrawl.errors import ConfigError, MissingPage, StorageRefused
from vcrawl.settings import Settings

URL = "https://example.com/products/widget-1"
SAFE_SEGMENT = re.compile(r"^[a-z0-9_-][a-z0-9._-]*$")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def real_root(root: Path) -> str:
    return os.path.realpath(root)


@pytest.fixture
def store(root: Path) -> Storage:
    return Storage(str(root))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the root, holding a file nobody may overwrite through the store."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_bytes(b"secret")
    return path


def _leftovers(directory: str | Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


# --- resolving: where locations land -------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("pages/a.html", "pages/a.html"),
        ("x.json", "x.json"),
        ("./x.json", "x.json"),
        ("a/./b/c.txt", "a/b/c.txt"),
        ("a/b/../c.html", "a/c.html"),
        ("a//b.html", "a/b.html"),
        ("notes:1.html", "notes:1.html"),
        (
            "pages/example.com/products/widget-1__31c94e6afd.html",
            "pages/example.com/products/widget-1__31c94e6afd.html",
        ),
    ],
)
def test_relative_locations_land_under_the_root(store: Storage, real_root: str, location: str, expected: str) -> None:
    assert store.resolve(location, "unused.html") == os.path.join(real_root, expected)


def test_none_takes_the_default_under_the_root(store: Storage, real_root: str) -> None:
    assert store.resolve(None, page_location(URL)) == os.path.join(real_root, page_location(URL))


@pytest.mark.parametrize(
    "spelling", ["{root}/in/x.html", "file://{root}/in/x.html", "file://localhost{root}/in/x.html"]
)
def test_absolute_paths_inside_the_root_are_accepted(store: Storage, real_root: str, spelling: str) -> None:
    assert store.resolve(spelling.format(root=real_root), "unused") == os.path.join(real_root, "in", "x.html")


def test_resolve_is_idempotent(store: Storage) -> None:
    once = store.resolve("a/../b/c.html", "unused")
    assert store.resolve(once, "unused") == once


@pytest.mark.parametrize(
    ("location", "problem"),
    [
        ("../x", "escapes the storage root"),
        ("a/../../x", "escapes the storage root"),
        ("a/../../data-sibling/x", "escapes the storage root"),
        ("/etc/passwd", "escapes the storage root"),
        ("file:///etc/passwd", "escapes the storage root"),
        ("file:///etc/%2e%2e/etc/passwd", "escapes the storage root"),
        ("{root}", "storage root itself"),
        ("file://{root}", "storage root itself"),
        ("{root}/x/..", "a directory, not a file"),
        (".", "a directory, not a file"),
        ("pages/", "ends in '/'"),
        ("{root}/", "ends in '/'"),
        ("", "is empty"),
        ("   ", "is empty"),
        ("a\x00b.html", "NUL"),
        ("file:///x%00y", "NUL"),
        ("file://otherhost/x.html", "names host 'otherhost'"),
        ("file:///x.html?y=1", "query or fragment"),
        ("a/" + "n" * 256 + ".html", "longer than 255 bytes"),
    ],
)
def test_locations_outside_the_root_are_refused(store: Storage, real_root: str, location: str, problem: str) -> None:
    location = location.format(root=real_root) if "{root}" in location else location
    with pytest.raises(StorageRefused) as caught:
        store.resolve(location, "unused")
    assert problem in caught.value.problem
    assert caught.value.location == location


def test_escape_error_names_the_root(store: Storage, real_root: str) -> None:
    with pytest.raises(StorageRefused, match=re.escape(f"escapes the storage root {real_root}")):
        store.resolve("../x", "unused")


@pytest.mark.parametrize("method", ["read_bytes", "exists", "write_bytes", "open_write"])
def test_every_operation_refuses_escapes(store: Storage, outside: Path, method: str) -> None:
    target = str(outside / "secret.txt")
    with pytest.raises(StorageRefused):
        if method == "write_bytes":
            store.write_bytes(target, b"owned")
        elif method == "open_write":
            with store.open_write(target) as stream:
                stream.write(b"owned")
        else:
            getattr(store, method)(target)
    assert (outside / "secret.txt").read_bytes() == b"secret"


def test_a_directory_is_not_a_file(store: Storage, root: Path) -> None:
    store.write_bytes("pages/a.html", b"x")
    with pytest.raises(StorageRefused, match="is a directory"):
        store.write_bytes("pages", b"x")


# --- symlinks ------------------------------------------------------------------------------------


def test_parent_symlink_pointing_outside_is_refused(store: Storage, root: Path, outside: Path) -> None:
    root.mkdir()
    (root / "out").symlink_to(outside, target_is_directory=True)
    for location in ("out/x.html", "out/secret.txt", str(root / "out" / "x.html")):
        with pytest.raises(StorageRefused, match="escapes the storage root"):
            store.resolve(location, "unused")
        with pytest.raises(StorageRefused):
            store.write_bytes(location, b"owned")
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_bytes() == b"secret"


def test_final_symlink_pointing_outside_is_refused(store: Storage, root: Path, outside: Path) -> None:
    root.mkdir()
    (root / "evil.html").symlink_to(outside / "secret.txt")
    with pytest.raises(StorageRefused, match="escapes the storage root"):
        store.resolve("evil.html", "unused")
    with pytest.raises(StorageRefused):
        store.write_bytes("evil.html", b"owned")
    with pytest.raises(StorageRefused):
        store.read_bytes("evil.html")
    assert (outside / "secret.txt").read_bytes() == b"secret"
    assert (root / "evil.html").is_symlink()


def test_final_symlink_pointing_inside_is_refused(store: Storage, root: Path) -> None:
    store.write_bytes("real.html", b"real")
    (root / "alias.html").symlink_to(root / "real.html")
    with pytest.raises(StorageRefused, match="is a symlink"):
        store.write_bytes("alias.html", b"new")
    assert store.read_bytes("real.html") == b"real"


def test_parent_symlink_pointing_inside_is_followed(store: Storage, root: Path, real_root: str) -> None:
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real", target_is_directory=True)
    resolved = store.resolve("alias/page.html", "unused")
    assert resolved == os.path.join(real_root, "real", "page.html")
    assert store.write_bytes("alias/page.html", b"ok") == 2
    assert (root / "real" / "page.html").read_bytes() == b"ok"


def test_symlink_planted_after_resolve_is_refused(store: Storage, root: Path, outside: Path) -> None:
    resolved = store.resolve("late.html", "unused")
    root.mkdir(exist_ok=True)
    (root / "late.html").symlink_to(outside / "secret.txt")
    with pytest.raises(StorageRefused):
        store.write_bytes(resolved, b"owned")
    assert (outside / "secret.txt").read_bytes() == b"secret"


def test_symlink_planted_during_the_write_is_refused_before_the_rename(
    store: Storage, root: Path, outside: Path
) -> None:
    with pytest.raises(StorageRefused, match="became a symlink"):
        with store.open_write("race/page.html") as stream:
            stream.write(b"owned")
            (root / "race" / "page.html").symlink_to(outside / "secret.txt")
    assert (outside / "secret.txt").read_bytes() == b"secret"
    assert (root / "race" / "page.html").is_symlink()
    assert _leftovers(root / "race") == []


@pytest.mark.parametrize("with_proc", [True, False])
def test_parent_swapped_for_a_symlink_during_the_write_is_refused(
    store: Storage, root: Path, outside: Path, monkeypatch: pytest.MonkeyPatch, with_proc: bool
) -> None:
    if not with_proc:  # no kernel path of the open directory: the directory at the checked path must be it
        monkeypatch.setattr(storage.local, "_fd_path", lambda _fd: "")
    with store.open_write("plain/page.html") as stream:  # nothing swapped: written
        stream.write(b"fine")
    assert (root / "plain" / "page.html").read_bytes() == b"fine"
    with pytest.raises(StorageRefused, match="parent directory was replaced"):
        with store.open_write("swap/page.html") as stream:
            stream.write(b"owned")
            (root / "swap").rename(root / "moved")
            (root / "swap").symlink_to(outside, target_is_directory=True)
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert _leftovers(root / "moved") == []


# --- relative to the root: where a location really is ---------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("pages/a.html", "pages/a.html"),
        ("./pages//x/../a.html", "pages/a.html"),
        ("{root}/results/links/b.json", "results/links/b.json"),
        ("file://{root}/results/links/b.json", "results/links/b.json"),
        ("pages/../jobs/j/records/r.jsonl", "jobs/j/records/r.jsonl"),
        (".spool/records/x.jsonl", ".spool/records/x.jsonl"),
        ("top.html", "top.html"),
    ],
)
def test_relative_names_the_path_under_the_root_for_every_spelling(
    store: Storage, real_root: str, spelling: str, expected: str
) -> None:
    assert store.relative(spelling.format(root=real_root)) == expected


def test_relative_follows_a_symlinked_directory_inside_the_root(store: Storage, root: Path) -> None:
    (root / "jobs" / "other").mkdir(parents=True)
    (root / "pages").mkdir()
    (root / "pages" / "alias").symlink_to(root / "jobs" / "other", target_is_directory=True)
    assert store.relative("pages/alias/x.html") == "jobs/other/x.html"


@pytest.mark.parametrize("location", ["../x.html", "/etc/passwd", "file:///etc/passwd", "{root}", "hdfs://nn:9870/x"])
def test_relative_refuses_what_resolve_refuses(store: Storage, real_root: str, location: str) -> None:
    with pytest.raises(StorageRefused):
        store.relative(location.format(root=real_root))


@pytest.fixture
def hdfs_store() -> Storage:
    """An ``hdfs://`` data root with a second allowed NameNode; nothing is sent (no call reaches HDFS)."""
    factory = functools.partial(WebHdfsBackend, user="u", allowed_namenodes=["nn:9870", "standby:9870"])
    return Storage("hdfs://nn:9870/crawl/", backends={**BACKENDS, "hdfs": factory})


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("pages/a.html", "pages/a.html"),
        ("hdfs://nn:9870/crawl/results/links/b.json", "results/links/b.json"),
        ("hdfs://standby:9870/crawl/results/links/b.json", "results/links/b.json"),
        ("hdfs://nn:9870//crawl/pages/x/../../jobs/j/a.html", "jobs/j/a.html"),
        ("hdfs://nn:9870/crawl/.vcrawl-redis/appendonly.aof", ".vcrawl-redis/appendonly.aof"),
    ],
)
def test_relative_on_an_hdfs_root(hdfs_store: Storage, spelling: str, expected: str) -> None:
    assert hdfs_store.relative(spelling) == expected


@pytest.mark.parametrize(
    "location", ["../x.html", "hdfs://nn:9870/crawl", "hdfs://nn:9870/other/x.html", "hdfs://evil:9870/crawl/x"]
)
def test_relative_on_an_hdfs_root_refuses_what_resolve_refuses(hdfs_store: Storage, location: str) -> None:
    with pytest.raises(StorageRefused):
        hdfs_store.relative(location)


# --- writing and reading -------------------------------------------------------------------------


def test_write_creates_parents_and_reads_back(store: Storage, root: Path) -> None:
    assert store.write_bytes("a/b/c/d.txt", b"hello") == 5
    assert (root / "a" / "b" / "c" / "d.txt").read_bytes() == b"hello"
    assert store.read_bytes("a/b/c/d.txt") == b"hello"
    assert store.exists("a/b/c/d.txt")
    assert not store.exists("a/b/c/other.txt")


def test_overwrite_replaces_the_whole_content(store: Storage) -> None:
    store.write_bytes("p.html", b"first version, rather long" * 100)
    store.write_bytes("p.html", b"second")
    assert store.read_bytes("p.html") == b"second"


def test_open_write_is_invisible_until_the_block_exits(store: Storage, root: Path) -> None:
    with store.open_write("pages/new.html") as stream:
        stream.write(b"part one, ")
        stream.flush()
        assert not store.exists("pages/new.html")
        stream.write(b"part two")
    assert store.read_bytes("pages/new.html") == b"part one, part two"
    assert _leftovers(root / "pages") == []


def test_open_write_tolerates_the_caller_closing_the_stream(store: Storage) -> None:
    with store.open_write("closed.txt") as stream:
        stream.write(b"closed early")
        stream.close()
    assert store.read_bytes("closed.txt") == b"closed early"


@pytest.mark.parametrize("existed", [False, True])
def test_exception_inside_open_write_leaves_nothing_behind(store: Storage, root: Path, existed: bool) -> None:
    if existed:
        store.write_bytes("pages/p.html", b"old")
    with pytest.raises(RuntimeError, match="boom"):
        with store.open_write("pages/p.html") as stream:
            stream.write(b"partial")
            stream.flush()
            raise RuntimeError("boom")
    assert os.listdir(root / "pages") == (["p.html"] if existed else [])
    if existed:
        assert store.read_bytes("pages/p.html") == b"old"


def test_new_files_are_0644_under_the_umask(store: Storage, root: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    store.write_bytes("mode.txt", b"x")
    assert (root / "mode.txt").stat().st_mode & 0o777 == 0o644 & ~umask


def test_fsync_flag_writes_normally(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "synced", fsync=True)
    location = backend.resolve(str(tmp_path / "synced" / "f.bin"))
    assert backend.write_bytes(location, b"\x00\x01") == 2
    assert backend.read_bytes(location) == b"\x00\x01"


def test_very_long_file_names_still_get_a_temp_file(store: Storage) -> None:
    name = "n" * 255
    assert store.write_bytes(name, b"x") == 1
    assert store.read_bytes(name) == b"x"


@pytest.mark.parametrize("location", ["missing.html", "no/such/dir/page.html", "file.txt/child.html"])
def test_reading_a_missing_location_raises_missing_page(store: Storage, location: str) -> None:
    store.write_bytes("file.txt", b"a file, not a directory")
    with pytest.raises(MissingPage):
        store.read_bytes(location)
    assert not store.exists(location)


def test_writing_under_a_file_is_refused(store: Storage) -> None:
    store.write_bytes("file.txt", b"x")
    with pytest.raises(StorageRefused, match="not a directory"):
        store.write_bytes("file.txt/child.html", b"y")


def test_concurrent_writers_never_leave_mixed_content(store: Storage, root: Path) -> None:
    location = store.resolve("pages/hot.html", "unused")

    def content(thread: int, round_: int) -> bytes:
        return b"%d:%d;" % (thread, round_) * (300 + 97 * thread + 13 * round_)

    def is_whole(data: bytes) -> bool:
        match = re.match(rb"(\d+):(\d+);", data)
        return match is not None and data == content(int(match[1]), int(match[2]))

    def write(thread: int) -> None:
        for round_ in range(50):
            body = content(thread, round_)
            with store.open_write(location) as stream:
                for start in range(0, len(body), 512):
                    stream.write(body[start : start + 512])
                    stream.flush()  # a non-atomic writer would now expose a partial file

    done = threading.Event()

    def read() -> list[bytes]:
        broken = []
        while not done.is_set():
            data = store.read_bytes(location)  # MissingPage here would mean a moment without the file
            if not is_whole(data):
                broken.append(data[:40])
        return broken

    store.write_bytes(location, content(99, 0))
    with ThreadPoolExecutor(max_workers=2) as reading:
        readers = [reading.submit(read) for _ in range(2)]
        try:
            with ThreadPoolExecutor(max_workers=8) as writing:
                for writer in [writing.submit(write, thread) for thread in range(8)]:
                    writer.result()
        finally:
            done.set()
        assert [reader.result() for reader in readers] == [[], []]
    assert is_whole(store.read_bytes(location))
    assert os.listdir(root / "pages") == ["hot.html"]


# --- the router: data roots and schemes ----------------------------------------------------------


def test_unknown_scheme_names_the_scheme_and_the_known_ones(store: Storage) -> None:
    with pytest.raises(StorageRefused) as caught:
        store.resolve("hdfs://nn:9870/x", "unused")
    assert caught.value.location == "hdfs://nn:9870/x"
    assert caught.value.problem == "no storage backend for scheme 'hdfs'; known: file"


@pytest.mark.parametrize("location", ["http://example.com/x", "S3://bucket/x"])
def test_other_url_schemes_are_refused(store: Storage, location: str) -> None:
    with pytest.raises(StorageRefused, match="no storage backend for scheme"):
        store.write_bytes(location, b"x")


def test_storage_does_no_io_until_used(tmp_path: Path) -> None:
    store = Storage(str(tmp_path / "lazy" / "data"))
    assert store.describe() == str(tmp_path / "lazy" / "data")
    assert not (tmp_path / "lazy").exists()
    store.resolve("x.html", "unused")
    assert (tmp_path / "lazy" / "data").is_dir()


@pytest.mark.parametrize("spelling", ["crawl-data", "./crawl-data", "file://{tmp}/crawl-data", "{tmp}/x/../crawl-data"])
def test_data_root_spellings_normalize_to_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    monkeypatch.chdir(tmp_path)
    store = Storage(spelling.format(tmp=tmp_path))
    assert store.describe() == str(tmp_path / "crawl-data")


def test_from_settings_uses_vcrawl_data(tmp_path: Path) -> None:
    settings = Settings.from_env({"VCRAWL_DATA": str(tmp_path / "d")})
    assert Storage.from_settings(settings).describe() == str(tmp_path / "d")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ("", "non-empty"),
        ("a\x00b", "NUL"),
        ("/", "below the filesystem root"),
        ("file:///", "below the filesystem root"),
        ("hdfs://nn:9870/crawl", "no storage backend for scheme 'hdfs'; known: file"),
        ("file://otherhost/x", "names host"),
    ],
)
def test_bad_data_roots_are_config_errors(data: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        Storage(data)


class MemoryBackend:
    """A test backend for ``mem://`` roots: proves a new scheme plugs in with one registry entry."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.files: dict[str, bytes] = {}

    def resolve(self, location: str) -> str:
        if not location.startswith(self.root + "/") or "/../" in location:
            raise StorageRefused(location, f"escapes the storage root {self.root}")
        return location

    @contextmanager
    def open_write(self, location: str) -> Iterator[BinaryIO]:
        buffer = BytesIO()
        yield buffer
        self.files[self.resolve(location)] = buffer.getvalue()

    def write_bytes(self, location: str, data: bytes) -> int:
        self.files[self.resolve(location)] = data
        return len(data)

    def list_files(self, location: str) -> list[str]:
        prefix = self.resolve(location).rstrip("/") + "/"
        return sorted(name for name in self.files if name.startswith(prefix) and "/" not in name[len(prefix) :])

    def read_bytes(self, location: str, offset: int = 0, length: int | None = None) -> bytes:
        try:
            data = self.files[self.resolve(location)]
        except KeyError:
            raise MissingPage(location) from None
        return data[offset:] if length is None else data[offset : offset + length]

    def exists(self, location: str) -> bool:
        return self.resolve(location) in self.files

    def relative(self, location: str) -> str:
        return self.resolve(location)[len(self.root) + 1 :]


@pytest.fixture
def mem_store() -> Storage:
    return Storage("MEM://bucket/crawl", backends={**BACKENDS, "mem": MemoryBackend})


def test_backends_satisfy_the_protocol(tmp_path: Path) -> None:
    assert isinstance(LocalBackend(tmp_path), Backend)
    assert isinstance(MemoryBackend("mem://b"), Backend)


def test_a_registered_scheme_gets_relative_locations_and_its_own_urls(mem_store: Storage) -> None:
    assert mem_store.describe() == "mem://bucket/crawl"
    location = mem_store.resolve(None, page_location(URL))
    assert location == "mem://bucket/crawl/" + page_location(URL)
    with mem_store.open_write(location) as stream:
        stream.write(b"<html>")
    assert mem_store.read_bytes(location) == b"<html>"
    assert mem_store.exists("mem://bucket/crawl/" + page_location(URL))
    with pytest.raises(MissingPage):
        mem_store.read_bytes("other.html")


@pytest.mark.parametrize(
    ("location", "problem"),
    [
        ("/var/lib/x.html", "is a local path but the data root is mem://bucket/crawl"),
        ("file:///var/lib/x.html", "is a local path but the data root is mem://bucket/crawl"),
        ("mem://other-bucket/x.html", "escapes the storage root"),
        ("../x.html", "escapes the storage root"),
        ("hdfs://nn/x", "no storage backend for scheme 'hdfs'; known: file, mem"),
    ],
)
def test_a_non_local_root_refuses_local_paths_and_other_roots(mem_store: Storage, location: str, problem: str) -> None:
    with pytest.raises(StorageRefused) as caught:
        mem_store.resolve(location, "unused")
    assert problem in caught.value.problem
    assert caught.value.location == location


def test_a_registered_scheme_gives_paths_relative_to_its_root(mem_store: Storage) -> None:
    assert mem_store.relative("pages/a.html") == "pages/a.html"
    assert mem_store.relative("mem://bucket/crawl/results/x/b.json") == "results/x/b.json"


def test_a_registered_scheme_other_than_the_roots_is_outside_it(store: Storage) -> None:
    store = Storage(store.describe(), backends={**BACKENDS, "mem": MemoryBackend})
    with pytest.raises(StorageRefused, match="is outside the data root"):
        store.resolve("mem://bucket/x", "unused")


# --- naming --------------------------------------------------------------------------------------


def test_naming_doctests_pass() -> None:
    results = doctest.testmod(storage.naming)
    assert results.attempted > 0
    assert results.failed == 0


def test_names_are_stable_and_match_the_documented_shape() -> None:
    assert page_location(URL) == page_location(URL) == "pages/example.com/products/widget-1__8a2152ca73.html"
    assert result_location(URL, "links") == "results/links/example.com/products/widget-1__8a2152ca73.json"


@pytest.mark.parametrize(
    "urls",
    [
        ["https://example.com/p", "https://example.com/p?a=1", "https://example.com/p?a=2", "https://example.com/p?"],
        ["https://example.com/P", "https://example.com/p", "https://example.com/p.html", "https://example.com/p!"],
        ["https://example.com/p#top", "https://example.com/p"],
        ["http://example.com/p", "https://example.com/p", "http://example.com:8080/p"],
    ],
)
def test_different_urls_never_share_a_location(urls: list[str]) -> None:
    assert len({page_location(url) for url in urls}) == len(urls)
    assert len({result_location(url, "links") for url in urls}) == len(urls)


@pytest.mark.parametrize(
    ("url", "expected_prefix"),
    [
        ("https://example.com", "pages/example.com/index__"),
        ("https://example.com/", "pages/example.com/index__"),
        ("https://example.com/?q=1", "pages/example.com/index__"),
        ("https://example.com/products/", "pages/example.com/products/index__"),
        ("https://example.com/products/widget.HTML", "pages/example.com/products/widget__"),
        ("http://example.com:8080/x", "pages/example.com_8080/x__"),
        ("http://example.com:80/x", "pages/example.com/x__"),
        ("https://example.com:443/x", "pages/example.com/x__"),
        ("https://example.com:80/x", "pages/example.com_80/x__"),
        ("http://EXAMPLE.COM./x", "pages/example.com/x__"),
        ("https://bücher.example/", "pages/xn--bcher-kva.example/index__"),
        ("https://xn--bcher-kva.example/", "pages/xn--bcher-kva.example/index__"),
        ("https://a..b/", "pages/a..b/index__"),
        ("https://\u0080x.example/", "pages/x.example/index__"),
        ("http://[2001:db8::1]:8080/", "pages/ipv6-2001-db8-1_8080/index__"),
        ("https://example.com/a/b/c/d/e/f", "pages/example.com/a/b/c/f__"),
        ("https://example.com/../../etc/passwd", "pages/example.com/etc/passwd__"),
        ("https://example.com/./.hidden/..", "pages/example.com/hidden/index__"),
        ("https://example.com/%2e%2e/%2F/x", "pages/example.com/x__"),
        ("https://example.com/Caf%C3%A9/na%C3%AFve%20page", "pages/example.com/cafe/naive-page__"),
        ("https://example.com/%E6%97%A5%E6%9C%AC", "pages/example.com/index__"),
        ("https://example.com/a b/c<d>|e", "pages/example.com/a-b/c-d-e__"),
        ("https://example.com/x:abc/", "pages/example.com/x-abc/index__"),
        ("mailto:someone@example.com", "pages/no-host/someone-example.com__"),
    ],
)
def test_names_from_odd_urls(url: str, expected_prefix: str) -> None:
    location = page_location(url)
    assert location.startswith(expected_prefix)
    assert re.fullmatch(r".*__[0-9a-f]{10}\.html", location)


def _long_url() -> str:
    host = ".".join(["sub" + "x" * 55] * 4) + ".example.com"
    return f"https://{host}:8443/" + "/".join(["Segment-%C3%A9-" + "y" * 300] * 40) + "?" + "q=" * 500


@pytest.mark.parametrize(
    "url",
    [
        URL,
        "https://bücher.example/Über/uns?x=1",
        "https://example.com/" + "%00%01%7f" * 20,
        "https://example.com/...../..../x",
        "https://example.com/-/--/---/x-",
        "https://\u0080\u0081/\ud800",
        _long_url(),
    ],
)
def test_names_are_safe_and_bounded(url: str) -> None:
    for location in (page_location(url), result_location(url, "links")):
        assert len(location) <= 400
        for segment in location.split("/"):
            assert SAFE_SEGMENT.match(segment), segment
            assert segment not in (".", "..")
            assert len(segment.encode()) <= 255


def test_default_names_resolve_inside_the_root(store: Storage, real_root: str) -> None:
    for url in (URL, _long_url(), "https://example.com/../../etc/passwd"):
        for default in (page_location(url), result_location(url, "article")):
            resolved = store.resolve(None, default)
            assert resolved == os.path.join(real_root, default)
            store.write_bytes(resolved, b"x")


@pytest.mark.parametrize("analyzer", ["", "..", ".hidden", "a/b", "links\x00", "x" * 65])
def test_result_location_refuses_non_names(analyzer: str) -> None:
    with pytest.raises(ValueError, match="not an analyzer name"):
        result_location(URL, analyzer)
