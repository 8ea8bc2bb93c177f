"""A job's records in PostgreSQL (``VCRAWL_RECORDS_URL``): one table, one row per record, upserted.

The row of a record is keyed by (job, url_id, record_index): a page's record has index 0, an api
page's records their index in its answer. A re-crawl of a URL, or an analysis batch delivered
again after its worker died, overwrites the rows it wrote before instead of adding more; rows of
the same page past its new record count are deleted in the same transaction (an api page that
now answers fewer records).

``write`` takes an analysis batch's records and stores them in one transaction, sent in one
round trip (psycopg's pipeline mode), so a batch's records are all in or all out. Every database
failure is a ``RecordsUnavailable`` (a ``RetryableError``): the batch is retried, nothing is lost.
The connection (one per process) is made on first use, with bounded connect and statement
timeouts, and made again after a failure or in a forked child. The table is created if missing,
under an advisory lock, so many workers starting at once create it once.

psycopg's errors stop here; the URL's password never reaches a log or an error.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from vcrawl.errors import RecordsUnavailable
from vcrawl.settings import Settings
from vcrawl.targets.records import redacted

__all__ = ["DEFAULT_TABLE", "PostgresRecords"]

DEFAULT_TABLE = "vcrawl_records"
_CREATE_LOCK = 0x7663_7261_776C  # pg_advisory_xact_lock key: "vcrawl", held while the table is created
_READ_PAGE = 1000  # rows an export's server-side cursor fetches at a time

logger = logging.getLogger(__name__)

_CREATE = """
CREATE TABLE IF NOT EXISTS {table} (
    job          text        NOT NULL,
    url_id       text        NOT NULL,
    record_index integer     NOT NULL DEFAULT 0,
    url          text        NOT NULL,
    final_url    text,
    fetched_at   timestamptz,
    ip           text,
    analyzer     text        NOT NULL,
    data         jsonb,
    written_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, url_id, record_index)
)"""
_COLUMNS = "job text, url_id text, record_index integer, url text, final_url text, fetched_at timestamptz, " \
    "ip text, analyzer text, data jsonb"  # fmt: skip
_UPSERT = f"""
INSERT INTO {{table}} (job, url_id, record_index, url, final_url, fetched_at, ip, analyzer, data)
SELECT job, url_id, record_index, url, final_url, fetched_at, ip, analyzer, data
FROM jsonb_to_recordset(%s::jsonb) AS r({_COLUMNS})
ON CONFLICT (job, url_id, record_index) DO UPDATE SET
    url = EXCLUDED.url, final_url = EXCLUDED.final_url, fetched_at = EXCLUDED.fetched_at, ip = EXCLUDED.ip,
    analyzer = EXCLUDED.analyzer, data = EXCLUDED.data, written_at = now()"""
# A page's rows past its record count now: left by an earlier crawl whose answer had more records.
_TRIM = """
DELETE FROM {table} AS t USING jsonb_to_recordset(%s::jsonb) AS p(job text, url_id text, count integer)
WHERE t.job = p.job AND t.url_id = p.url_id AND t.record_index >= p.count"""
_SELECT = """
SELECT job, url_id, record_index, url, final_url, fetched_at, ip, analyzer, data, written_at
FROM {table} WHERE job = %s ORDER BY url_id, record_index"""


class PostgresRecords:
    """Records of every job in one PostgreSQL table; thread-safe; one connection per process."""

    def __init__(
        self,
        url: str,
        *,
        table: str = DEFAULT_TABLE,
        connect_timeout_s: float = 5.0,
        statement_timeout_s: float = 30.0,
    ) -> None:
        self._url = url
        self.target = redacted(url)
        self._password = urlsplit(url).password or ""
        self._table = sql.Identifier(table)
        self._connect_timeout_s = max(2, round(connect_timeout_s))  # libpq: whole seconds, 1 counts as 2
        self._statement_timeout_ms = round(statement_timeout_s * 1000)
        self._lock = threading.Lock()
        self._connection: psycopg.Connection[Any] | None = None
        self._pid = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> PostgresRecords:
        """From ``VCRAWL_RECORDS_URL`` and its timeouts."""
        if settings.records_url is None:
            raise ValueError("VCRAWL_RECORDS_URL is not set")
        return cls(settings.records_url, connect_timeout_s=settings.records_connect_timeout_s,
                   statement_timeout_s=settings.records_statement_timeout_s)  # fmt: skip

    def write(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Upsert ``records`` (each with job, url_id, url, analyzer, data; ``index`` for an api
        page's) in one transaction; return how many rows were written.

        Raises:
            RecordsUnavailable: the database failed; none of them was written.
        """
        rows = _rows(records)
        if not rows:
            return 0
        counts: dict[tuple[str, str], int] = {}
        for row in rows:
            key = (row["job"], row["url_id"])
            counts[key] = max(counts.get(key, 0), row["record_index"] + 1)
        trims = [{"job": job, "url_id": uid, "count": count} for (job, uid), count in counts.items()]
        statements = ((sql.SQL(_TRIM).format(table=self._table), json.dumps(trims)),
                      (sql.SQL(_UPSERT).format(table=self._table), json.dumps(rows, default=str)))  # fmt: skip
        with self._lock:
            reused = self._connection is not None
            connection = self._connect()
            try:
                self._run_in_one_transaction(connection, statements)
            except psycopg.OperationalError as exc:
                if not (reused and connection.broken):
                    raise self._failed("writing records", exc) from None
                # A connection kept from before a server restart: one more try on a new one
                # (the upsert is idempotent, so a commit whose answer was lost does no harm).
                self._connection = None
                try:
                    self._run_in_one_transaction(self._connect(), statements)
                except psycopg.Error as again:
                    raise self._failed("writing records", again) from None
            except psycopg.Error as exc:
                raise self._failed("writing records", exc) from None
        return len(rows)

    @staticmethod
    def _run_in_one_transaction(connection: psycopg.Connection[Any], statements: Sequence[tuple[Any, str]]) -> None:
        """Run ``statements`` (each with its one JSON argument) in one transaction, sent in one round trip."""
        with connection.pipeline(), connection.transaction():
            for statement, argument in statements:
                connection.execute(statement, [argument])

    def read(self, job_id: str) -> Iterator[dict[str, Any]]:
        """Every record of ``job_id``, in the shape the analysis wrote it (with its ``index`` and
        ``written_at``), by URL id; read through its own connection, a page of rows at a time.

        Raises:
            RecordsUnavailable: the database failed.
        """
        try:
            with self._open() as connection, connection.transaction():
                with connection.cursor(name="vcrawl_records_read") as cursor:
                    cursor.itersize = _READ_PAGE
                    cursor.execute(sql.SQL(_SELECT).format(table=self._table), [job_id])
                    for row in cursor:
                        yield _record(row)
        except psycopg.Error as exc:
            raise self._failed("reading records", exc) from None

    def count(self, job_id: str) -> int:
        """How many rows ``job_id`` has.

        Raises:
            RecordsUnavailable: the database failed.
        """
        query = sql.SQL("SELECT count(*) FROM {table} WHERE job = %s").format(table=self._table)
        with self._lock:
            connection = self._connect()
            try:
                row = connection.execute(query, [job_id]).fetchone()
            except psycopg.Error as exc:
                raise self._failed("counting records", exc) from None
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Close this process's connection (made again on next use)."""
        with self._lock:
            if self._connection is not None and self._pid == os.getpid():
                self._connection.close()
            self._connection = None

    def _connect(self) -> psycopg.Connection[Any]:
        """This process's connection (the lock held), made and the table created if missing."""
        if self._connection is not None and self._pid == os.getpid() and not self._connection.closed:
            return self._connection
        self._connection = None  # a parent's connection is the parent's: a forked child makes its own
        try:
            connection = self._open()
            with connection.transaction():
                connection.execute("SELECT pg_advisory_xact_lock(%s)", [_CREATE_LOCK])
                connection.execute(sql.SQL(_CREATE).format(table=self._table))
        except psycopg.Error as exc:
            raise self._failed("connecting", exc) from None
        logger.info("records go to PostgreSQL at %s, table %s", self.target, self._table.as_string(None))
        self._connection, self._pid = connection, os.getpid()
        return connection

    def _open(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._url, autocommit=True, connect_timeout=self._connect_timeout_s,
                                   options=f"-c statement_timeout={self._statement_timeout_ms}",
                                   application_name="vcrawl")  # fmt: skip
        except psycopg.Error as exc:
            raise self._failed("connecting", exc) from None

    def _failed(self, doing: str, exc: psycopg.Error) -> RecordsUnavailable:
        """The error to raise for ``exc``; the connection is dropped, so the next call makes a new one."""
        if self._connection is not None:  # broken, or in doubt: the next call starts on a new one
            if self._pid == os.getpid():
                self._connection.close()
            self._connection = None
        problem = f"{doing}: {type(exc).__name__}: {str(exc).strip()}"
        if self._password:  # libpq does not echo passwords; this makes sure
            problem = problem.replace(self._password, "***")
        logger.warning("records database %s: %s", self.target, problem)
        return RecordsUnavailable(self.target, problem)


def _rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``records``, the last one of a key kept (one statement may not touch a row twice)."""
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    for record in records:
        row = {
            "job": str(record["job"]),
            "url_id": str(record["url_id"]),
            "record_index": int(record.get("index") or 0),
            "url": str(record["url"]),
            "final_url": record.get("final_url"),
            "fetched_at": _timestamp(record.get("fetched_at")),
            "ip": record.get("ip"),
            "analyzer": str(record.get("analyzer") or ""),
            "data": _without_nul(record.get("data")),
        }
        rows[(row["job"], row["url_id"], row["record_index"])] = row
    return list(rows.values())


def _timestamp(value: Any) -> str | None:
    """An ISO 8601 time as PostgreSQL reads it, or None when there is none (or it is unreadable)."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value)).isoformat()
    except ValueError:
        return None


def _without_nul(value: Any) -> Any:
    """``value`` with U+0000 as U+FFFD in every string: jsonb refuses NUL, and web text may hold one.

    >>> _without_nul({"a\\x00": ["b\\x00c", 1]})
    {'a\\ufffd': ['b\\ufffdc', 1]}
    """
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, Mapping):
        return {_without_nul(str(key)): _without_nul(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(item) for item in value]
    return value


def _record(row: tuple[Any, ...]) -> dict[str, Any]:
    job, uid, index, url, final_url, fetched_at, ip, analyzer, data, written_at = row
    return {
        "url": url,
        "url_id": uid,
        "final_url": final_url,
        "fetched_at": _iso(fetched_at),
        "ip": ip,
        "job": job,
        "analyzer": analyzer,
        "index": index,
        "data": data,
        "written_at": _iso(written_at),
    }


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat(timespec="seconds") if value is not None else None
