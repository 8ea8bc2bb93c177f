"""This process's outputs of jobs: one record, WARC and fetch log writer per job, their spools, and
shipping them into the store (on demand, at worker shutdown, when a job completes)."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import redis

from engine.crawl_env import RecordSink
from storage import job_fetch_log_location, job_records_location, job_warc_location
from storage.postgres_records import PostgresRecords
from storage.records import RecordWriter
from storage.records import recover_spools as recover_record_spools
from storage.warc import WarcWriter
from storage.warc import recover_spools as recover_warc_spools
from tasks.deps.clients import made, once, per_job, redis_client, settings, storage
from tasks.deps.keepers import output_shipper
from vcrawl import redis_keys
from vcrawl.settings import Settings

__all__ = [
    "FETCH_LOG_IDLE_S",
    "close_warc",
    "fetch_log",
    "flush_records",
    "note_output",
    "records",
    "records_database",
    "recover_spools",
    "spool_dir",
    "warc",
]

logger = logging.getLogger(__name__)

# A job's fetch log part ships once no line came for this long: right after the job ends, so
# batch analysis started then finds it whole.
FETCH_LOG_IDLE_S = 2.0


def records(job_id: str) -> RecordSink:
    """Where this process writes ``job_id``'s records: the PostgreSQL table of ``VCRAWL_RECORDS_URL``
    (one connection per process, for every job), else a record writer (one part file at a time per job)."""
    if settings().records_url is not None:
        return records_database()
    return per_job(
        "records",
        job_id,
        lambda current: RecordWriter(
            storage(),
            job_records_location(job_id),
            max_part_bytes=current.records_part_bytes,
            max_part_age_s=current.records_flush_s,
            spool_dir=spool_dir(current, "records"),
            on_open=lambda _writer_id: note_output(job_id),
        ),
    )


def records_database() -> PostgresRecords:
    """This process's connection to the records database (``VCRAWL_RECORDS_URL``), made on first use."""
    return once("records_database", lambda: PostgresRecords.from_settings(settings()))


def fetch_log(job_id: str) -> RecordWriter:
    """Return this process's fetch log writer for ``job_id`` (``engine.fetch_log``).

    Its open parts are listed in Redis until shipped, so batch analysis knows to wait for them.
    """
    pending = redis_keys.job_log_writers(job_id)

    def opened(writer_id: str) -> None:
        _best_effort(lambda: redis_client().hset(pending, writer_id, round(time.time(), 3)))
        note_output(job_id)

    def shipped(writer_id: str) -> None:
        _best_effort(lambda: redis_client().hdel(pending, writer_id))

    return per_job(
        "fetch_log",
        job_id,
        lambda current: RecordWriter(
            storage(),
            job_fetch_log_location(job_id),
            max_part_bytes=current.records_part_bytes,
            max_part_age_s=current.records_flush_s,
            spool_dir=spool_dir(current, "records"),
            on_open=opened,
            on_ship=shipped,
            idle_s=FETCH_LOG_IDLE_S,
        ),
    )


def _best_effort(call: Callable[[], Any]) -> None:
    # A hint for readers (batch analysis waits less); a failure must not fail the fetch batch.
    try:
        call()
    except redis.RedisError as exc:
        logger.warning("fetch log: could not note a part in Redis: %r", exc)


def spool_dir(current: Settings, kind: str) -> str:
    """Where ``kind`` (records, warc) writers spool: ``VCRAWL_<KIND>_SPOOL_DIR``, else one directory
    per store.

    Per store, because a worker that finds a dead writer's spool ships it into its own store.
    """
    configured = current.records_spool_dir if kind == "records" else current.warc_spool_dir
    if configured:
        return configured
    data = current.data
    if "://" not in data or data.startswith("file://"):
        return os.path.join(data.removeprefix("file://"), ".spool", kind)
    tag = hashlib.sha1(data.encode(), usedforsecurity=False).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"vcrawl-spool-{os.getuid()}", tag, kind)


def recover_spools() -> list[str]:
    """Ship the records and WARC files killed workers of this store left in the spools (at worker start)."""
    current = settings()
    return [
        *recover_record_spools(storage(), spool_dir(current, "records")),
        *recover_warc_spools(storage(), spool_dir(current, "warc")),
    ]


def warc(job_id: str) -> WarcWriter:
    """Return this process's WARC writer for ``job_id``: one writer per process, so no file has two."""
    return per_job(
        "warc",
        job_id,
        lambda current: WarcWriter(
            storage(),
            job_warc_location(job_id),
            max_file_bytes=current.warc_file_bytes,
            spool_dir=spool_dir(current, "warc"),
            on_open=lambda: note_output(job_id),
        ),
    )


def close_warc() -> None:
    """Ship every job's open WARC file and its index into the store (at worker shutdown)."""
    for writer in list((made("warc") or {}).values()):
        writer.close()


def flush_records() -> None:
    """Ship every job's pending records and fetch log lines into the store (at worker shutdown, or on demand)."""
    for kind in ("records", "fetch_log"):
        for writer in list((made(kind) or {}).values()):
            writer.flush()


def note_output(job_id: str) -> None:
    """A writer of ``job_id`` in this process opened a file: note it in the ledger, and make sure this
    process's shipper runs (a prefork child has its own writers, so its own shipper)."""
    try:
        output_shipper().start().note(job_id)
    except redis.RedisError as exc:  # the shipper's next round notes it again
        logger.warning("job %s: could not note this process's open output in Redis: %r", job_id, exc)
