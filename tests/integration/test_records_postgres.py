"""Records in PostgreSQL (``VCRAWL_RECORDS_URL``) on a real private server (tests/postgres.py): rows
upserted by (job, url_id, index), the table made once by many workers at once, the embedded
``vcrawl crawl`` writing one row per page through its Celery worker, ``vcrawl export`` reading
them back, and the URL's password kept out of every log, error and repr."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from storage.postgres_records import PostgresRecords
from tests.integration.test_cli import _vcrawl
from tests.postgres import PostgresServer
from tests.site import TestSite
from vcrawl.errors import RecordsUnavailable, RetryableError
from vcrawl.settings import Settings

SECRET = "pg-s3cret-7d1e"  # trust authentication: accepted and not checked, so it can only leak


def _record(n: int, job: str = "j", **changes: Any) -> dict[str, Any]:
    record = {"url": f"http://shop.test/p{n}", "url_id": f"{n:016x}", "final_url": f"http://shop.test/p{n}",
              "fetched_at": "2026-05-01T12:00:00+00:00", "ip": "127.0.0.1", "job": job, "analyzer": "fields",
              "data": {"fields": {"n": n}}}  # fmt: skip
    return {**record, **changes}


def _rows(url: str, job: str = "j") -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as connection:
        return connection.execute(
            "SELECT url_id, record_index, data, written_at FROM vcrawl_records WHERE job = %s "
            "ORDER BY url_id, record_index",
            [job],
        ).fetchall()


def test_a_recrawl_updates_the_rows_of_its_urls_and_adds_none(records_database: str) -> None:
    sink = PostgresRecords(records_database)
    assert sink.write([_record(n) for n in range(3)]) == 3
    first = _rows(records_database)

    # The same URLs again (a re-crawl, or a redelivered batch), one with new data, one new URL.
    sink.write([_record(0), _record(1, data={"fields": {"n": 100}}), _record(3)])

    rows = _rows(records_database)
    assert [(uid, index) for uid, index, _, _ in rows] == [(f"{n:016x}", 0) for n in range(4)]
    assert rows[1][2] == {"fields": {"n": 100}}
    assert rows[0][3] > first[0][3] and rows[2][3] == first[2][3]  # written_at: rewritten rows only
    assert sink.count("j") == 4 and sink.count("other") == 0


def test_an_api_page_with_fewer_records_now_keeps_only_those(records_database: str) -> None:
    sink = PostgresRecords(records_database)
    sink.write([_record(7, analyzer="api", index=i, data={"id": i}) for i in range(3)])
    sink.write([_record(7, analyzer="api", index=i, data={"id": 10 + i}) for i in range(2)])

    assert [(index, data) for _, index, data, _ in _rows(records_database)] == [(0, {"id": 10}), (1, {"id": 11})]


def test_many_workers_starting_at_once_make_the_table_once(records_database: str) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(number: int) -> None:
        try:
            start.wait(10)
            PostgresRecords(records_database).write([_record(number), _record(number + 100)])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and len(_rows(records_database)) == 16


def test_text_with_a_nul_is_stored_with_a_replacement_character(records_database: str) -> None:
    PostgresRecords(records_database).write([_record(1, data={"fields": {"title": "a\x00b"}})])

    assert _rows(records_database)[0][2] == {"fields": {"title": "a\ufffdb"}}


def test_a_database_down_is_retryable_and_the_password_is_in_no_error_or_log(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres_server.create_database("t_down").replace("postgres@", f"postgres:{SECRET}@")
    sink = PostgresRecords(url)
    sink.write([_record(1)])
    caplog.set_level(logging.DEBUG)

    postgres_server.stop()
    try:
        with pytest.raises(RetryableError) as failed:  # its connection is broken, and no new one is made
            sink.write([_record(2)])
    finally:
        postgres_server.start()
    assert isinstance(failed.value, RecordsUnavailable)
    assert failed.value.target == f"postgresql://postgres:***@127.0.0.1:{postgres_server.port}/t_down"
    assert SECRET not in str(failed.value) + repr(failed.value.args) + caplog.text
    assert f"postgres:***@127.0.0.1:{postgres_server.port}/t_down: connecting" in caplog.text

    sink.write([_record(2)])  # a new connection once the server is back
    assert sink.count("j") == 2
    postgres_server.stop()
    postgres_server.start()
    sink.write([_record(3)])  # its connection broke with the restart: made again at once, not failed
    assert sink.count("j") == 3
    assert SECRET not in caplog.text
    assert SECRET not in repr(Settings(records_url=url))


def test_a_server_gone_fails_to_connect_at_once(postgres_server: PostgresServer) -> None:
    with PostgresServer(postgres_server.bindir) as other:
        url = other.url("postgres", password=SECRET)
    with pytest.raises(RecordsUnavailable) as failed:  # its server is gone: nobody listens there
        PostgresRecords(url).write([_record(1)])
    assert "connecting" in failed.value.problem and SECRET not in str(failed.value)


@pytest.mark.slow
def test_the_embedded_crawl_writes_one_row_per_page_and_export_reads_them(
    site: TestSite, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    paths = ["/", *(f"/p{n}" for n in range(5))]
    site.add_page("/", "".join(f"<a href='{path}'>{path}</a>" for path in paths[1:]))
    for path in paths[1:]:
        site.add_page(path, f"<html><h1>page {path}</h1><a href='/'>home</a></html>")
    job = tmp_path / "job.json"
    rules = [{"pattern": "", "analyzer": "fields", "fields": {"title": "h1"}}]
    job.write_text(json.dumps({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0}, "rules": rules}))
    url = postgres_server.create_database("t_embedded").replace("postgres@", f"postgres:{SECRET}@")
    env = {"VCRAWL_RECORDS_URL": url}

    done = _vcrawl("-v", "crawl", "--job", str(job), "--workers", "1", "--data", str(tmp_path / "data"), "--json",
                   "--allow-network", "127.0.0.1/32", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["state"] == "completed" and summary["records"] == len(paths), summary
    with psycopg.connect(url.replace(SECRET, "x")) as connection:
        rows = connection.execute("SELECT url, url_id, record_index, data FROM vcrawl_records WHERE job = %s",
                                  [summary["job"]]).fetchall()  # fmt: skip
    assert sorted(row[0] for row in rows) == sorted(site.url(path) for path in paths)
    assert all(len(uid) == 16 and index == 0 for _, uid, index, _ in rows)
    assert not list((tmp_path / "data").glob("jobs/*/records/*"))  # no record parts beside the table

    exported = _vcrawl("export", summary["job"], env=env)
    assert exported.returncode == 0, exported.stderr
    records = [json.loads(line) for line in exported.stdout.splitlines()]
    assert sorted(r["url"] for r in records) == sorted(site.url(path) for path in paths)
    assert {r["data"]["fields"]["title"] for r in records if r["url"] != site.url("/")} == \
        {f"page {path}" for path in paths[1:]}  # fmt: skip
    assert f"{len(paths)} records of job" in exported.stderr
    worker_logs = "".join(path.read_text(errors="replace") for path in (tmp_path / "data" / "logs").iterdir())
    for output in (done.stdout, done.stderr, exported.stdout, exported.stderr, worker_logs):
        assert SECRET not in output
