"""Batch analysis and replay over a job's stored crawl, as plain steps a Celery chord strings together.

1. ``plan_run`` (the caller's process) reads the job's fetch log, keeps each URL's last line
   (of one cycle, if asked), cuts the URLs into chunks and writes them, with the run's plan, under
   ``jobs/<job>/analysis/<run>/``. Messages then carry a chunk's number, never its URLs.
2. ``map_chunk`` (one task per chunk, on the analysis queue) reads its chunk and the stored pages,
   runs the analyzer's ``map`` (batch) or the per-page analyzer (replay), and stores the partial
   as ``part-<n>.json``. Storing under a fixed name makes a redelivered map harmless.
3. ``reduce_run`` (the chord's body) folds the partials and writes the result:
   ``jobs/<job>/results/<analyzer>.json`` (``jobs/<job>/cycle-<n>/results/...`` for one cycle), or
   for a replay the summary beside its records, ``jobs/<job>/replays/<run>/``. Like everything a job
   writes, it stays in the job's folder (``storage.naming``).
"""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from analyzers import Page, run_analysis
from analyzers.batch import CrawledUrl
from analyzers.batch_registry import get_batch_analyzer
from batch_analysis.runs import AnalysisRuns
from engine.fetch_log import LoggedUrl, latest_by_url, read_fetch_log
from frontier import canonical_url
from storage import (
    CdxEntry,
    Storage,
    job_analysis_run_location,
    job_replay_location,
    job_result_location,
    job_warc_location,
    read_response,
)
from vcrawl.errors import InvalidTask, MissingPage, RetryableError
from vcrawl.payloads import FieldRule, field_rules

__all__ = [
    "DEFAULT_CHUNK",
    "JobView",
    "RunPlan",
    "crawled_url",
    "map_chunk",
    "plan_run",
    "reduce_run",
]

DEFAULT_CHUNK = 100  # URLs per map task: a few seconds of work, small enough to redo
_MAX_ERRORS = 20  # replay: failed pages listed in the summary (all are counted)


@dataclass(frozen=True)
class RunPlan:
    """A run as planned: what every map and the reduce read back (``plan.json``)."""

    job: str
    run: str
    kind: str  # "batch": a map/reduce analyzer; "replay": a per-page analyzer again
    analyzer: str
    chunks: int
    urls: int
    pages: int
    chunk_size: int
    cycle: int | None = None
    created_at: float = 0.0
    statuses: Mapping[str, int] = field(default_factory=dict)  # batch: final status of URLs not stored
    field_rules: Mapping[str, Any] | None = None  # replay: the field rules given instead of the job's

    @property
    def folder(self) -> str:
        """Where the run's chunks, partials and plan are kept."""
        return run_folder(self.job, self.run)

    def to_json(self) -> dict[str, Any]:
        """The plan file's content."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def summary(self) -> dict[str, Any]:
        """The run's description for its Redis state (no per-URL data)."""
        per_url = ("statuses", "field_rules", "job", "run")
        return {name: value for name, value in self.to_json().items() if name not in per_url}


def run_folder(job_id: str, run_id: str) -> str:
    """Where a run's work files are kept, under the data root."""
    return job_analysis_run_location(job_id, run_id)


def new_run_id(analyzer: str, now: float) -> str:
    """A run id that sorts by time and says what ran: ``site-report-20261126-101500-3fa2``."""
    return f"{analyzer}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{secrets.token_hex(2)}"


def plan_run(
    store: Storage,
    runs: AnalysisRuns,
    job_id: str,
    analyzer: str,
    *,
    kind: str = "batch",
    cycle: int | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    fields: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> RunPlan:
    """Cut the job's crawled URLs into chunks and record the run; nothing is sent yet.

    A replay takes the stored pages only; a batch analyzer gets every URL the job ended.

    Raises:
        InvalidTask: ``chunk`` out of range, or the job (cycle) has no fetch log lines.
    """
    if not 1 <= chunk_size <= 100_000:
        raise InvalidTask("chunk", f"must be between 1 and 100000 URLs, got {chunk_size}")
    now = time.time() if now is None else now
    lines = latest_by_url(read_fetch_log(store, job_id), cycle)
    if kind == "replay":
        lines = [line for line in lines if line.stored]
    if not lines:
        where = f"job {job_id}" + ("" if cycle is None else f" cycle {cycle}")
        what = "stored pages" if kind == "replay" else "crawled URLs"
        raise InvalidTask("job", f"{where} has no {what} in its fetch log")
    chunks = [lines[i : i + chunk_size] for i in range(0, len(lines), chunk_size)]
    plan = RunPlan(
        job=job_id,
        run=new_run_id(analyzer, now),
        kind=kind,
        analyzer=analyzer,
        chunks=len(chunks),
        urls=len(lines),
        pages=sum(1 for line in lines if line.stored),
        chunk_size=chunk_size,
        cycle=cycle,
        created_at=round(now, 3),
        statuses={line.url: line.status for line in lines if not line.stored and line.status is not None}
        if kind == "batch"
        else {},
        field_rules=fields,
    )
    for index, chunk in enumerate(chunks):
        store.write_bytes(_chunk_file(plan.folder, index), _dumps([line.to_json() for line in chunk]))
    store.write_bytes(f"{plan.folder}/plan.json", _dumps(plan.to_json()))
    runs.create(job_id, plan.run, plan.summary(), now)
    return plan


def map_chunk(
    store: Storage,
    runs: AnalysisRuns,
    job_id: str,
    run_id: str,
    index: int,
    rules_for: Callable[[str], Mapping[str, FieldRule] | None] | None = None,
) -> str:
    """Run the map of chunk ``index`` and store its partial; return the partial's location.

    ``rules_for`` (replay without its own fields): a URL's field rules in the job.

    Raises:
        MissingPage: the run's plan or chunk is gone.
        StorageFailed, OSError: storage trouble (worth a retry).
        Exception: whatever the batch analyzer's map raised.
    """
    plan = load_plan(store, job_id, run_id)
    lines = [LoggedUrl.from_json(item) for item in json.loads(store.read_bytes(_chunk_file(plan.folder, index)))]
    if plan.kind == "replay":
        partial = _replay_chunk(store, plan, index, lines, rules_for)
    else:
        analyzer = get_batch_analyzer(plan.analyzer)
        bodies = _Bodies(store, job_id)
        partial = analyzer.map([_crawled(bodies, line) for line in lines], JobView(plan.statuses))
    location = f"{plan.folder}/part-{index:05d}.json"
    store.write_bytes(location, _dumps(partial))
    runs.chunk_done(job_id, run_id, index, time.time())
    return location


def reduce_run(store: Storage, runs: AnalysisRuns, job_id: str, run_id: str, partials: list[str]) -> str:
    """Fold the partials into the run's result, write it, mark the run done; return the result's location.

    Raises:
        MissingPage: a partial is gone.
        Exception: whatever the batch analyzer's reduce raised.
    """
    plan = load_plan(store, job_id, run_id)
    runs.reducing(job_id, run_id, time.time())
    parts = _read_partials(store, partials)
    head = {"job": job_id, "analyzer": plan.analyzer, "cycle": plan.cycle, "run": run_id}
    if plan.kind == "replay":
        location = f"{job_replay_location(job_id, run_id)}/summary.json"
        result = {**head, **_replay_totals(parts), "records_in": f"{job_replay_location(job_id, run_id)}/records"}
    else:
        location = job_result_location(job_id, plan.analyzer, plan.cycle)
        result = {**head, "urls": plan.urls, **get_batch_analyzer(plan.analyzer).reduce(parts)}
    result["generated_at"] = round(time.time(), 3)
    store.write_bytes(location, _dumps(result, indent=1))
    runs.finish(job_id, run_id, store.resolve(location, location), time.time())
    return location


def load_plan(store: Storage, job_id: str, run_id: str) -> RunPlan:
    """The plan of a run (read once per process and run).

    Raises:
        MissingPage: no such run in storage.
    """
    return _cached_plan(store, run_folder(job_id, run_id))


@lru_cache(maxsize=64)
def _cached_plan(store: Storage, folder: str) -> RunPlan:
    data = json.loads(store.read_bytes(f"{folder}/plan.json"))
    return RunPlan(**data)


class JobView:
    """The map's view of the job (``MapContext``): canonical URLs and the final status of URLs not stored."""

    def __init__(self, statuses: Mapping[str, int]) -> None:
        self._statuses = statuses

    def canonical(self, url: str) -> str:
        try:
            canonical = canonical_url(url)
        except ValueError:
            return ""
        return canonical if canonical.startswith(("http://", "https://")) else ""

    def final_status(self, canonical_url: str) -> int | None:
        return self._statuses.get(canonical_url)


class _Bodies:
    """A stored page's body: its file where the fetch log says, else its capture in the job's WARC
    files (a ``warc: true`` job whose page files were removed). The WARC index is read on first need."""

    def __init__(self, store: Storage, job_id: str) -> None:
        self._store, self._job_id = store, job_id
        self._captures: dict[str, CdxEntry] | None = None

    def read(self, line: LoggedUrl) -> bytes | None:
        """The body, or None when it is neither in its file nor in a WARC file."""
        try:
            return self._store.read_bytes(line.location)
        except MissingPage:
            if self._captures is None:
                self._captures = self._index()
            entry = self._captures.get(line.final_url or line.url)
            return None if entry is None else read_response(self._store, entry)[2]

    def _index(self) -> dict[str, CdxEntry]:
        """The latest 200 capture of each URL, from every ``.cdxj`` index of the job."""
        captures: dict[str, CdxEntry] = {}
        for index in self._store.list_files(job_warc_location(self._job_id)):
            if index.endswith(".cdxj"):
                for raw in self._store.read_bytes(index).decode("utf-8").splitlines():
                    entry = CdxEntry.from_line(raw)
                    known = captures.get(entry.url)
                    if entry.status == 200 and (known is None or entry.timestamp >= known.timestamp):
                        captures[entry.url] = entry
        return captures


def _crawled(bodies: _Bodies, line: LoggedUrl) -> CrawledUrl:
    return crawled_url(line, bodies.read(line) if line.stored and line.location else None)  # None: deleted since


def crawled_url(line: LoggedUrl, body: bytes | None) -> CrawledUrl:
    """What a batch analyzer's map is given for one URL: its fetch-log line, and its stored body if any."""
    page = None if body is None else Page(url=line.final_url or line.url, body=body, content_type=line.content_type)
    return CrawledUrl(
        url=line.url,
        host=urlsplit(line.url).netloc,
        outcome=line.outcome,
        status=line.status,
        depth=line.depth,
        bytes=line.bytes,
        content_type=line.content_type,
        reason=line.reason,
        target=line.target,
        page=page,
    )


def _replay_chunk(
    store: Storage,
    plan: RunPlan,
    index: int,
    lines: list[LoggedUrl],
    rules_for: Callable[[str], Mapping[str, FieldRule] | None] | None,
) -> dict[str, Any]:
    """Run the per-page analyzer on the chunk's stored pages; their records go in one file of the chunk."""
    given = None if plan.field_rules is None else field_rules(plan.field_rules)
    records: list[bytes] = []
    failed: Counter[str] = Counter()
    errors: list[list[str]] = []
    bodies = _Bodies(store, plan.job)
    for line in lines:
        body = bodies.read(line)
        if body is None:
            failed["missing_page"] += 1
            continue
        page = Page(url=line.final_url or line.url, body=body, content_type=line.content_type)
        fields = given if given is not None else (rules_for(line.url) if rules_for is not None else None)
        try:
            data = run_analysis(page, plan.analyzer, fields)
        except RetryableError:
            raise
        # An analyzer's bug on one page (any exception) fails that page, not the chunk.
        except Exception as exc:
            failed[getattr(exc, "reason", "analyzer_error")] += 1
            errors.append([line.url, f"{type(exc).__name__}: {exc}"[:300]])
            continue
        record = {
            "url": line.url,
            "final_url": line.final_url or line.url,
            "fetched_at": line.fetched_at,
            "job": plan.job,
            "analyzer": plan.analyzer,
            "replay": plan.run,
            "data": data,
        }
        records.append(json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str).encode() + b"\n")
    if records:  # one whole file per chunk: a redelivered map writes the same file again
        location = f"{job_replay_location(plan.job, plan.run)}/records/chunk-{index:05d}.jsonl"
        store.write_bytes(location, b"".join(records))
    return {"pages": len(lines), "records": len(records), "failed": dict(failed), "errors": errors[:_MAX_ERRORS]}


def _replay_totals(partials: Iterator[dict[str, Any]]) -> dict[str, Any]:
    pages = records = 0
    failed: Counter[str] = Counter()
    errors: list[list[str]] = []
    for partial in partials:
        pages += partial["pages"]
        records += partial["records"]
        failed.update(partial["failed"])
        errors.extend(partial["errors"][: _MAX_ERRORS - len(errors)])
    return {"pages": pages, "records": records, "failed": dict(failed), "errors": errors}


def _read_partials(store: Storage, locations: list[str]) -> Iterator[dict[str, Any]]:
    for location in sorted(locations):  # in chunk order: a reduce sees the same sequence every time
        yield json.loads(store.read_bytes(location))


def _chunk_file(folder: str, index: int) -> str:
    return f"{folder}/chunk-{index:05d}.json"


def _dumps(value: Any, indent: int | None = None) -> bytes:
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(value, ensure_ascii=False, separators=separators, indent=indent).encode()
