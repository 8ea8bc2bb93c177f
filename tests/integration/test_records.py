"""Records as JSON Lines: part files per writer, rolled by size and age, whole lines only."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from storage import Storage
from storage.records import RecordWriter, export_records, read_records, recover_spools
from tasks.deps import FETCH_LOG_IDLE_S
from tests.waiting import wait_until


def record(n: int, writer: str = "w") -> dict:
    url = f"http://a.test/{n}"
    fields = {"n": n, "tags": ["a", "b"], "w": writer}
    return {"url": url, "final_url": url, "fetched_at": "2026-11-22T01:00:00+00:00", "job": "j",
            "analyzer": "fields", "data": {"url": url, "fields": fields}}  # fmt: skip


def test_parts_roll_by_size_and_hold_whole_lines(tmp_path: Path) -> None:
    store = Storage(str(tmp_path))
    writer = RecordWriter(store, "jobs/j/records", max_part_bytes=2000, writer_id="w1")
    for n in range(50):
        writer.append(record(n))
    writer.close()

    parts = store.list_files("jobs/j/records")
    assert len(parts) > 3 and all(Path(p).name.startswith("w1-") for p in parts)
    for part in parts:
        text = Path(part).read_text()
        assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())
    assert [r["data"]["fields"]["n"] for r in read_records(store, "jobs/j/records")] == list(range(50))


def test_parts_roll_by_age(tmp_path: Path) -> None:
    now = [0.0]
    store = Storage(str(tmp_path))
    writer = RecordWriter(store, "r", max_part_age_s=10, writer_id="w", clock=lambda: now[0])
    writer.append(record(1))
    assert store.list_files("r") == []  # not yet: the part is young and small
    now[0] = 11.0
    writer.append(record(2))
    assert len(store.list_files("r")) == 1


def test_threads_and_writers_never_interleave_lines(tmp_path: Path) -> None:
    store = Storage(str(tmp_path))
    writers = [RecordWriter(store, "r", max_part_bytes=5000, writer_id=f"w{n}") for n in range(2)]

    def work(writer: RecordWriter, offset: int) -> None:
        for n in range(200):
            writer.append(record(offset + n, writer=str(offset)))

    threads = [threading.Thread(target=work, args=(writers[n % 2], n * 1000)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for writer in writers:
        writer.close()

    numbers = sorted(r["data"]["fields"]["n"] for r in read_records(store, "r"))
    assert numbers == sorted(n * 1000 + k for n in range(6) for k in range(200))


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export(tmp_path: Path, fmt: str) -> None:
    store = Storage(str(tmp_path))
    writer = RecordWriter(store, "r", writer_id="w")
    for n in range(3):
        writer.append(record(n))
    writer.close()
    out = io.StringIO()

    assert export_records(store, "r", out, fmt) == 3

    if fmt == "jsonl":
        assert [json.loads(line)["url"] for line in out.getvalue().splitlines()] == [
            f"http://a.test/{n}" for n in range(3)
        ]
    else:
        rows = list(csv.DictReader(io.StringIO(out.getvalue())))
        assert rows[0]["n"] == "0" and json.loads(rows[0]["tags"]) == ["a", "b"] and rows[2]["job"] == "j"


def test_a_part_that_fails_to_ship_is_kept_and_shipped_later(tmp_path: Path) -> None:
    class FlakyStorage(Storage):
        failures = 1

        def open_write(self, location: str):  # type: ignore[no-untyped-def]
            if self.failures:
                self.failures -= 1
                raise OSError("disk full")
            return super().open_write(location)

    store = FlakyStorage(str(tmp_path))
    writer = RecordWriter(store, "r", writer_id="w")
    for n in range(3):
        writer.append(record(n))
    with pytest.raises(OSError):
        writer.flush()
    writer.append(record(3))
    writer.flush()

    assert [r["data"]["fields"]["n"] for r in read_records(store, "r")] == [0, 1, 2, 3]
    assert [Path(p).name for p in store.list_files("r")] == ["w-00001.jsonl"]


def test_an_idle_writer_ships_its_part_after_the_age_limit(tmp_path: Path) -> None:
    store = Storage(str(tmp_path))
    writer = RecordWriter(store, "r", max_part_age_s=0.2, writer_id="w")
    writer.append(record(1))
    deadline = time.monotonic() + 5
    while not store.list_files("r") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(store.list_files("r")) == 1


def test_a_part_ships_once_no_line_came_for_idle_s_and_not_while_lines_come(tmp_path: Path) -> None:
    store = Storage(str(tmp_path))
    opened, shipped = [], []
    # The idle time of a worker's fetch log, as shipped (2 s). A line every 0.1 s for 2.5 s, longer
    # than idle_s: a part shipped at idle_s after its first line (not its last) would show. A sleep
    # may overshoot by 1.9 s before the writer looks idle (idle_s=0.3 left 0.2 s: a loaded machine took it).
    writer = RecordWriter(store, "r", max_part_age_s=3600, writer_id="w", idle_s=FETCH_LOG_IDLE_S,
                          on_open=opened.append, on_ship=shipped.append)  # fmt: skip
    for n in range(25):
        writer.append(record(n))
        time.sleep(0.1)
    assert store.list_files("r") == [] and opened == ["w"]
    wait_until(lambda: store.list_files("r"), FETCH_LOG_IDLE_S + 5, "the idle part shipped")
    assert [r["data"]["fields"]["n"] for r in read_records(store, "r")] == list(range(25))
    assert shipped == ["w"]


_KILLED_WRITER = """
import json, sys, time
from storage import Storage
from storage.records import RecordWriter
store, spool, count = Storage(sys.argv[1]), sys.argv[2], int(sys.argv[3])
writer = RecordWriter(store, "jobs/j/records", max_part_bytes=2000, max_part_age_s=3600, writer_id="dead",
                      spool_dir=spool)
for n in range(count):
    writer.append({"url": f"http://a.test/{n}", "fetched_at": "t", "analyzer": "fields", "data": {"fields": {"n": n}}})
print("appended", flush=True)
time.sleep(60)
"""


def test_records_of_a_sigkilled_writer_are_recovered_from_its_spool(tmp_path: Path) -> None:
    store, spool = Storage(str(tmp_path / "data")), str(tmp_path / "spool")
    repo = Path(__file__).resolve().parents[2]
    writer = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path / "data"), spool, "50"], cwd=repo,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "appended"
        assert recover_spools(store, spool) == []  # the writer lives: its spool is its own
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(10)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(10)
    shipped_before = store.list_files("jobs/j/records")  # parts rolled at 2000 bytes before the kill
    assert shipped_before  # some parts went out as usual; the last one was only spooled
    recovered = recover_spools(store, spool)
    assert len(recovered) == 1 and recovered[0] not in shipped_before
    assert sorted(r["data"]["fields"]["n"] for r in read_records(store, "jobs/j/records")) == list(range(50))
    assert not os.listdir(spool) and recover_spools(store, spool) == []


def test_a_line_cut_short_by_the_kill_is_dropped(tmp_path: Path) -> None:
    store, spool = Storage(str(tmp_path / "data")), tmp_path / "spool"
    spool.mkdir()
    (spool / "jobs%2Fj%2Frecords@w9-00001.jsonl").write_bytes(b'{"n":1}\n{"n":2}\n{"n":')
    assert recover_spools(store, str(spool)) == ["jobs/j/records/w9-00001.jsonl"]
    assert [r["n"] for r in read_records(store, "jobs/j/records")] == [1, 2]


def test_a_live_writer_ships_and_removes_its_own_spool(tmp_path: Path) -> None:
    store, spool = Storage(str(tmp_path / "data")), str(tmp_path / "spool")
    writer = RecordWriter(store, "jobs/j/records", writer_id="live", spool_dir=spool)
    writer.append(record(1))
    assert len(os.listdir(spool)) == 1 and recover_spools(store, spool) == []
    writer.close()
    assert os.listdir(spool) == [] and len(list(read_records(store, "jobs/j/records"))) == 1


def test_export_shows_a_repeated_analysis_once(tmp_path: Path) -> None:
    store = Storage(str(tmp_path))
    for writer_id in ("killed", "redelivered"):  # the same analysis written by two workers
        writer = RecordWriter(store, "jobs/j/records", writer_id=writer_id)
        for n in range(3):
            writer.append(record(n))
        writer.close()
    out = io.StringIO()
    assert export_records(store, "jobs/j/records", out, "jsonl") == 3


def test_export_keeps_every_record_of_an_api_page_and_still_drops_a_repeat(tmp_path: Path) -> None:
    store = Storage(str(tmp_path))
    page = {"url": "http://127.0.0.1/api?page=1", "fetched_at": "2026-11-30T10:00:00Z", "analyzer": "api"}
    for writer_id in ("killed", "redelivered"):  # one answer of three records, written twice
        writer = RecordWriter(store, "jobs/j/records", writer_id=writer_id)
        for index in range(3):
            writer.append({**page, "index": index, "data": {"n": index}})
        writer.close()
    out = io.StringIO()
    assert export_records(store, "jobs/j/records", out, "jsonl") == 3
    assert [json.loads(line)["data"]["n"] for line in out.getvalue().splitlines()] == [0, 1, 2]
