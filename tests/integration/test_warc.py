"""WARC output: real files in a local store, read by warcio's own command line tools."""

from __future__ import annotations

import errno
import gzip
import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from warcio.archiveiterator import ArchiveIterator
from warcio.warcwriter import WARCWriter

from engine.warc_stage import StagedWarc
from storage import Storage
from storage.warc import REVISIT_MIME, CdxEntry, WarcWriter, lookup, read_response
from vcrawl.errors import StorageFailed

# The console script next to the interpreter (`python -m warcio` does not exist: no __main__).
WARCIO = str(Path(sys.executable).with_name("warcio"))
SMALL = 20 * 1024
T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
REQUEST_HEADERS = {"User-Agent": "vcrawl-test/1.0", "Accept": "*/*", "Accept-Encoding": "gzip, deflate"}


class RecordingStorage(Storage):
    """A real local Storage that remembers every read_bytes call."""

    def __init__(self, data: str) -> None:
        super().__init__(data)
        self.reads: list[tuple[str, int, int | None]] = []

    def read_bytes(self, location: str, offset: int = 0, length: int | None = None) -> bytes:
        self.reads.append((location, offset, length))
        return super().read_bytes(location, offset, length)


class FlakyStorage(Storage):
    """A real local Storage whose next `failures` WARC copies fail after all bytes were written."""

    def __init__(self, data: str, failures: int) -> None:
        super().__init__(data)
        self.failures = failures

    def open_write(self, location: str) -> AbstractContextManager[BinaryIO]:
        if location.endswith(".warc.gz") and self.failures:
            self.failures -= 1
            return self._failing(location)
        return super().open_write(location)

    @contextmanager
    def _failing(self, location: str) -> Iterator[BinaryIO]:
        with super().open_write(location) as out:
            yield out
            raise StorageFailed(location, "disk full (test)")


def page(i: int) -> dict[str, Any]:
    """Return the keyword arguments of exchange number `i`: a body that hardly compresses, so files roll."""
    rng = random.Random(i)
    body = b"<html><body>page %d " % i + rng.randbytes(rng.randint(1500, 3000)) + b"</body></html>"
    return {
        "request_headers": REQUEST_HEADERS,
        "status": 200 if i % 7 else 404,
        "reason": "OK" if i % 7 else "Not Found",
        "response_headers": {"Content-Type": "text/html; charset=utf-8", "X-Page": str(i)},
        "body": body,
        "fetched_at": T0 + timedelta(seconds=i),
        "ip": "127.0.0.1",
    }


def url_of(i: int) -> str:
    return f"http://site.test:8080/section/{i % 3}/page-{i}.html?n={i}"


def warcio(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([WARCIO, *args], capture_output=True, text=True, timeout=60, check=False)


def index_records(path: Path) -> list[dict[str, str]]:
    """Return warcio index's view of a file: offset, length, type and URI of every record."""
    done = warcio("index", "-f", "offset,length,warc-type,warc-target-uri", str(path))
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def warc_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.warc.gz"))


def index_entries(root: Path) -> list[CdxEntry]:
    return [CdxEntry.from_line(line) for path in root.rglob("*.cdxj") for line in path.read_text().splitlines()]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data: Path) -> RecordingStorage:
    return RecordingStorage(str(data))


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def thirty(store: RecordingStorage, spool: Path) -> tuple[WarcWriter, list[CdxEntry]]:
    """Thirty exchanges through a writer with a 20 KiB limit, closed."""
    writer = WarcWriter(store, "warc/job-1", max_file_bytes=SMALL, spool_dir=str(spool), writer_id="w1")
    entries = [writer.write_exchange(url_of(i), **page(i)) for i in range(30)]
    writer.close()
    return writer, entries


def test_rolled_files_pass_warcio_check_and_index(thirty: tuple[WarcWriter, list[CdxEntry]], data: Path) -> None:
    writer, entries = thirty
    files = warc_files(data)
    assert len(files) >= 3, "a 20 KiB limit must roll 30 pages of ~2 KiB into several files"
    assert [str(data / location) for location in writer.shipped] == [str(path) for path in files]
    assert [path.name for path in files] == [f"w1-{n:05d}.warc.gz" for n in range(1, len(files) + 1)]
    responses = 0
    for path in files:
        checked = warcio("check", "-v", str(path))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "digest pass" in checked.stdout
        types = [record["warc-type"] for record in index_records(path)]
        assert types[0] == "warcinfo" and types.count("warcinfo") == 1
        assert types[1:] == ["response", "request"] * ((len(types) - 1) // 2)
        responses += types.count("response")
        assert path.stat().st_size < SMALL + 4 * 1024  # rolled after the capture that passed the limit
    assert responses == len(entries) == 30


def test_records_hold_the_exchange(thirty: tuple[WarcWriter, list[CdxEntry]], data: Path) -> None:
    _writer, entries = thirty
    with (data / entries[5].warc).open("rb") as stream:
        records = {}
        for record in ArchiveIterator(stream):
            records.setdefault(record.rec_headers.get_header("WARC-Target-URI"), []).append(
                (record.rec_type, record.rec_headers, record.http_headers)
            )
    (_, response_warc, response_http), (_, request_warc, request_http) = records[url_of(5)]
    assert response_warc.protocol == "WARC/1.1"
    assert response_warc.get_header("WARC-Date") == "2025-03-04T05:06:12Z"
    assert response_warc.get_header("WARC-IP-Address") == "127.0.0.1"
    assert response_warc.get_header("WARC-Payload-Digest") == f"sha1:{entries[5].digest}"
    assert request_warc.get_header("WARC-Concurrent-To") == response_warc.get_header("WARC-Record-ID")
    assert response_http.protocol == "HTTP/1.1" and response_http.statusline == "200 OK"
    assert (request_http.protocol, request_http.statusline) == ("GET", "/section/2/page-5.html?n=5 HTTP/1.1")
    assert request_http.get_header("Host") == "site.test:8080"
    assert request_http.get_header("User-Agent") == "vcrawl-test/1.0"


def test_every_entry_reads_back_with_one_ranged_read(
    thirty: tuple[WarcWriter, list[CdxEntry]], store: RecordingStorage
) -> None:
    _writer, entries = thirty
    for i, entry in enumerate(entries):
        store.reads.clear()
        status, headers, body = read_response(store, entry)
        assert store.reads == [(entry.warc, entry.offset, entry.length)]
        expected = page(i)
        assert (status, body) == (expected["status"], expected["body"])
        assert headers["X-Page"] == str(i)
        assert (entry.url, entry.status, entry.mime) == (url_of(i), expected["status"], "text/html")
        assert entry.timestamp == (T0 + timedelta(seconds=i)).strftime("%Y%m%d%H%M%S")


def test_cdxj_index_next_to_each_file_is_sorted_and_complete(
    thirty: tuple[WarcWriter, list[CdxEntry]], store: RecordingStorage, data: Path
) -> None:
    _writer, entries = thirty
    seen: list[CdxEntry] = []
    for path in warc_files(data):
        index = path.with_name(path.name + ".cdxj")
        lines = index.read_text().splitlines()
        assert lines == sorted(lines)
        responses = [r for r in index_records(path) if r["warc-type"] == "response"]
        assert len(lines) == len(responses)
        parsed = [CdxEntry.from_line(line) for line in lines]
        location = str(path.relative_to(data))
        assert {entry.warc for entry in parsed} == {location}
        assert sorted(entry.offset for entry in parsed) == sorted(int(r["offset"]) for r in responses)
        assert all(
            line.startswith(f"{entry.url} {entry.timestamp} {{") for line, entry in zip(lines, parsed, strict=True)
        )
        seen.extend(parsed)
    assert sorted(seen, key=lambda e: e.url) == sorted(entries, key=lambda e: e.url)
    target = entries[17]
    assert lookup(store, f"{target.warc}.cdxj", target.url) == [target]
    assert lookup(store, f"{target.warc}.cdxj", target.url + "x") == []


def test_each_record_is_its_own_gzip_member(thirty: tuple[WarcWriter, list[CdxEntry]], data: Path) -> None:
    _writer, entries = thirty
    for path in warc_files(data):
        raw = path.read_bytes()
        records = index_records(path)
        ends = [int(record["offset"]) + int(record["length"]) for record in records]
        assert ends[-1] == len(raw)
        for record in records:
            start, length = int(record["offset"]), int(record["length"])
            text = gzip.decompress(raw[start : start + length])
            assert text.startswith(b"WARC/1.1\r\n")
            assert f"WARC-Type: {record['warc-type']}\r\n".encode() in text
    for entry in entries:
        raw = (data / entry.warc).read_bytes()[entry.offset : entry.offset + entry.length]
        assert f"WARC-Target-URI: {entry.url}\r\n".encode() in gzip.decompress(raw)


def test_revisit_is_checked_and_indexed_with_its_digest(store: RecordingStorage, spool: Path, data: Path) -> None:
    writer = WarcWriter(store, "warc", spool_dir=str(spool), writer_id="rv")
    url = url_of(1)
    first = writer.write_exchange(url, **page(1))
    again = writer.write_revisit(
        url,
        fetched_at=T0 + timedelta(days=1),
        status=200,
        response_headers={"Content-Type": "text/html", "Content-Encoding": "gzip", "ETag": '"v1"'},
        refers_to_uri=first.url,
        refers_to_date=first.timestamp,
        digest=first.digest,
    )
    writer.close()
    (path,) = warc_files(data)
    checked = warcio("check", "-v", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert [r["warc-type"] for r in index_records(path)] == ["warcinfo", "response", "request", "revisit"]
    assert lookup(store, f"{first.warc}.cdxj", url) == [first, again]
    assert (again.digest, again.mime, again.is_revisit, first.is_revisit) == (first.digest, REVISIT_MIME, True, False)
    status, headers, body = read_response(store, again)
    assert (status, body, headers["ETag"]) == (200, b"", '"v1"')
    assert "Content-Encoding" not in headers
    with path.open("rb") as stream:
        records = {record.rec_type: record.rec_headers for record in ArchiveIterator(stream)}
    revisit = records["revisit"]
    assert revisit.get_header("WARC-Profile") == "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
    assert revisit.get_header("WARC-Refers-To-Date") == records["response"].get_header("WARC-Date")
    assert revisit.get_header("WARC-Refers-To-Target-URI") == url
    assert revisit.get_header("WARC-Payload-Digest") == f"sha1:{first.digest}"


def test_two_writers_never_share_a_file(store: RecordingStorage, spool: Path, data: Path) -> None:
    a = WarcWriter(store, "warc", max_file_bytes=SMALL, spool_dir=str(spool), writer_id="host-1-a")
    b = WarcWriter(store, "warc", max_file_bytes=SMALL, spool_dir=str(spool), writer_id="host-1-b")
    for i in range(24):
        (a if i % 2 else b).write_exchange(url_of(i), **page(i))
    a.close()
    b.close()
    assert set(a.shipped).isdisjoint(b.shipped)
    assert len(a.shipped) >= 2 and len(b.shipped) >= 2
    assert sorted(a.shipped + b.shipped) == sorted(str(path.relative_to(data)) for path in warc_files(data))
    for writer, parity in ((a, 1), (b, 0)):
        urls: set[str] = set()
        for location in writer.shipped:
            urls |= {CdxEntry.from_line(line).url for line in (data / f"{location}.cdxj").read_text().splitlines()}
        assert urls == {url_of(i) for i in range(24) if i % 2 == parity}
    defaults = {WarcWriter(store, "warc").writer_id for _ in range(50)}
    assert len(defaults) == 50
    assert all(f"-{os.getpid()}-" in writer_id for writer_id in defaults)


def test_eight_threads_share_one_writer(store: RecordingStorage, spool: Path, data: Path) -> None:
    writer = WarcWriter(store, "warc", max_file_bytes=SMALL, spool_dir=str(spool), writer_id="threads")
    with ThreadPoolExecutor(max_workers=8) as pool:
        returned = list(pool.map(lambda i: writer.write_exchange(url_of(i), **page(i)), range(100)))
    writer.close()
    files = warc_files(data)
    assert len(files) >= 5
    responses = 0
    for path in files:
        checked = warcio("check", str(path))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        responses += sum(record["warc-type"] == "response" for record in index_records(path))
    indexed = index_entries(data)
    assert responses == len(indexed) == 100
    assert Counter(entry.url for entry in indexed) == Counter(url_of(i) for i in range(100))
    assert set(indexed) == set(returned)
    assert list(spool.iterdir()) == []  # every spool file was shipped and deleted


def test_decoded_body_drops_content_encoding(store: RecordingStorage, spool: Path, data: Path) -> None:
    writer = WarcWriter(store, "warc", spool_dir=str(spool), writer_id="enc")
    body = b"<html>" + b"decoded text " * 50 + b"</html>"
    entry = writer.write_exchange(
        "https://site.test/zipped",
        request_headers=REQUEST_HEADERS,
        status=200,
        reason="OK",
        response_headers={
            "Content-Type": "text/html",
            "content-encoding": "gzip",
            "Transfer-Encoding": "chunked",
            "Content-Length": "99",  # the compressed length on the wire
            "Vary": "Accept-Encoding",
        },
        body=body,
        fetched_at=T0,
    )
    writer.close()
    status, headers, read_body = read_response(store, entry)
    assert (status, read_body) == (200, body)
    assert {name.lower() for name in headers} == {"content-type", "content-length", "vary"}
    assert headers["Content-Length"] == str(len(body))
    checked = warcio("check", str(data / entry.warc))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_failed_ship_keeps_the_file_and_retries(spool: Path, data: Path) -> None:
    store = FlakyStorage(str(data), failures=2)
    writer = WarcWriter(store, "warc", spool_dir=str(spool), writer_id="flaky")
    first = writer.write_exchange(url_of(1), **page(1))
    with pytest.raises(StorageFailed):
        writer.close()
    assert warc_files(data) == [] and not any(p.is_file() for p in data.rglob("*"))  # nothing partial visible
    assert len(list(spool.glob("*.warc.gz"))) == 1  # the finished file waits in the spool
    with pytest.raises(StorageFailed):
        writer.write_exchange(url_of(2), **page(2))  # the queue ships first; it fails before writing
    assert len(list(spool.glob("*.warc.gz"))) == 1
    third = writer.write_exchange(url_of(3), **page(3))
    writer.close()
    assert writer.shipped == ["warc/flaky-00001.warc.gz", "warc/flaky-00002.warc.gz"]
    assert sorted(e.url for e in index_entries(data)) == sorted([url_of(1), url_of(3)])
    assert read_response(store, first)[2] == page(1)["body"]
    assert read_response(store, third)[2] == page(3)["body"]
    assert list(spool.iterdir()) == []


def test_close_without_captures_ships_nothing(store: RecordingStorage, spool: Path, data: Path) -> None:
    writer = WarcWriter(store, "warc", spool_dir=str(spool), writer_id="idle")
    writer.close()
    writer.roll()
    assert writer.shipped == [] and warc_files(data) == [] and list(spool.iterdir()) == []


def test_bad_arguments_are_refused_before_writing(store: RecordingStorage, spool: Path) -> None:
    writer = WarcWriter(store, "warc", spool_dir=str(spool), writer_id="strict")
    with pytest.raises(ValueError, match="timezone-aware"):
        writer.write_exchange(url_of(1), **{**page(1), "fetched_at": datetime(2025, 1, 1)})
    with pytest.raises(ValueError, match="http"):
        writer.write_exchange("ftp://site.test/x", **page(1))
    with pytest.raises(ValueError, match="digest"):
        writer.write_revisit(
            url_of(1),
            fetched_at=T0,
            status=200,
            response_headers={},
            refers_to_uri=url_of(1),
            refers_to_date="20250101000000",
            digest="md5:abc",
        )
    with pytest.raises(ValueError, match="writer_id"):
        WarcWriter(store, "warc", writer_id="../escape")
    assert list(spool.iterdir()) == []  # nothing was started


def test_a_capture_failing_mid_write_leaves_no_half_record(
    store: RecordingStorage, spool: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = WarcWriter(store, "warc", spool_dir=str(spool), writer_id="half")
    writer.write_exchange(url_of(1), **page(1))
    real = WARCWriter._write_warc_record

    def disk_full_at_request(self: WARCWriter, out: BinaryIO, record: Any) -> None:
        if record.rec_type == "request":  # the response of this capture is already written
            out.write(b"\x1f\x8b\x08 half a member")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, out, record)

    with monkeypatch.context() as patch:
        patch.setattr(WARCWriter, "_write_warc_record", disk_full_at_request)
        with pytest.raises(OSError, match="No space"):
            writer.write_exchange(url_of(2), **page(2))
    third = writer.write_exchange(url_of(3), **page(3))
    writer.close()
    (path,) = warc_files(data)
    checked = warcio("check", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    records = index_records(path)
    assert [r["warc-type"] for r in records] == ["warcinfo", "response", "request", "response", "request"]
    assert {r.get("warc-target-uri") for r in records} == {None, url_of(1), url_of(3)}
    assert read_response(store, third)[2] == page(3)["body"]


@pytest.mark.parametrize(
    "line",
    [
        "",
        "http://a.test/ 2025 {}",
        'http://a.test/ 20250101000000 {"url":"http://a.test/"}',
        'http://a.test/ 20250101000000 {"url":"u","status":200,"digest":"sha1:x","mime":"m","warc":"w",'
        '"offset":0,"length":1}',
        "http://a.test/ 20250101000000 not-json",
        'http://a.test/ 20250101000000 {"url":"u","status":"200","digest":"' + "A" * 32 + '","mime":"m","warc":"w",'
        '"offset":0,"length":1}',
    ],
)
def test_malformed_index_lines_are_refused(line: str) -> None:
    with pytest.raises(ValueError, match="CDXJ"):
        CdxEntry.from_line(line)


def test_index_line_round_trips_and_escapes_spaces() -> None:
    entry = CdxEntry(
        url="http://a.test/a b?q=1",
        timestamp="20250304050607",
        status=200,
        digest="A" * 32,
        mime="text/html",
        warc="warc/x-00001.warc.gz",
        offset=10,
        length=20,
    )
    line = entry.to_line()
    assert line.startswith("http://a.test/a%20b?q=1 20250304050607 {")
    assert CdxEntry.from_line(line) == entry


_KILLED_WARC_WRITER = """
import sys, time
from engine.warc_stage import StagedWarc
from storage import Storage
from storage.warc import WarcWriter
from tests.integration.test_warc import page, url_of
writer = WarcWriter(Storage(sys.argv[1]), "jobs/j/warc", spool_dir=sys.argv[2], writer_id="dead")
for i in range(1, int(sys.argv[3]) + 1):
    writer.write_exchange(url_of(i), **page(i))
print("written", flush=True)
time.sleep(60)
"""


def test_captures_of_a_sigkilled_writer_are_recovered_from_its_spool(spool: Path, data: Path) -> None:
    from storage.warc import recover_spools

    store = Storage(str(data))
    repo = Path(__file__).resolve().parents[2]
    writer = subprocess.Popen([sys.executable, "-c", _KILLED_WARC_WRITER, str(data), str(spool), "12"], cwd=repo,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "written"
        assert recover_spools(store, str(spool)) == []  # alive: its spool is its own
        writer.kill()
        writer.wait(10)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(10)
    # A capture being written when the worker died: bytes past the last indexed capture, and a cut index line.
    (warc_spool,) = spool.glob("*.warc.gz")
    with open(warc_spool, "ab") as out:
        out.write(gzip.compress(b"WARC/1.1\r\nWARC-Type: response\r\n")[:20])
    with open(str(warc_spool) + ".cdxj.part", "ab") as out:
        out.write(b"999999 http://cut")

    assert recover_spools(store, str(spool)) == ["jobs/j/warc/dead-00001.warc.gz"]
    entries = index_entries(data)
    assert sorted(e.url for e in entries) == sorted(url_of(i) for i in range(1, 13))
    for entry in entries:  # every capture reads back whole, digest checked
        assert read_response(store, entry)[2] == page(int(entry.url.rsplit("=", 1)[1]))["body"]
    with (data / "jobs/j/warc/dead-00001.warc.gz").open("rb") as archive:
        assert sum(1 for _ in ArchiveIterator(archive)) == 1 + 2 * 12  # warcinfo + response/request pairs
    assert list(spool.iterdir()) == [] and recover_spools(store, str(spool)) == []


def test_staged_captures_are_appended_whole_and_indexed_where_they_land(
    store: RecordingStorage, spool: Path, data: Path
) -> None:
    writer = WarcWriter(store, "warc/job-1", max_file_bytes=SMALL, spool_dir=str(spool), writer_id="w1")
    direct = writer.write_exchange(url_of(0), **page(0))
    staged = StagedWarc(lambda: writer, "batch 1")
    for i in range(1, 13):  # past the 20 KiB limit: the commit rolls the file too
        staged.stage().write_exchange(url_of(i), **page(i))
    dropped = StagedWarc(lambda: writer, "batch 2")
    dropped.stage().write_exchange(url_of(99), **page(99))

    assert staged.settle(holds_lease=True) == 12 and dropped.settle(holds_lease=False) == 0
    writer.close()

    files = warc_files(data)
    assert len(files) >= 2
    for path in files:
        checked = warcio("check", str(path))
        assert checked.returncode == 0, checked.stdout + checked.stderr
    entries = sorted(index_entries(data), key=lambda entry: entry.url)
    assert sorted(entry.url for entry in entries) == sorted(url_of(i) for i in range(13))
    assert direct in entries
    for entry in entries:
        i = int(entry.url.rsplit("=", 1)[1])
        assert read_response(store, entry)[2] == page(i)["body"]  # its index names where it landed


def test_a_discarded_stage_leaves_no_temporary_file(store: RecordingStorage, spool: Path, tmp_path: Path) -> None:
    writer = WarcWriter(store, "warc/job-1", spool_dir=str(spool), writer_id="w1")
    staged = StagedWarc(lambda: writer, "batch 1")
    stage = staged.stage()
    stage.write_exchange(url_of(1), **page(1))
    path = Path(stage._spool.path)  # the stage's temporary file, to see it go
    assert path.exists()

    staged.discard()

    assert not path.exists() and len(stage) == 0
    writer.close()
    assert writer.shipped == []
