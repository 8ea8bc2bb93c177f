"""Batch analysis on Spark: the same batch analyzers over stored crawls, as one PySpark job.

``vcrawl analyze JOB --analyzer NAME --engine spark [--master URL]`` runs here, in the caller's process
(Spark's driver); no Celery worker and no Redis take part, only storage. The analyzer is looked up by
name in the batch registry on the driver and again on every executor (built-ins and the
``vcrawl.batch_analyzers`` plug-ins, their ``map`` and ``reduce`` unchanged).

The job, on the executors (``batch_analysis.spark_input``):

1. the fetch-log parts, one task each, become one line per URL: the last (of one cycle, if asked;
   within ``since``/``until``, if given), as ``latest_by_url`` keeps it;
2. the ``.cdxj`` indexes of the jobs' WARC files give each stored page's capture; the captures are
   grouped by WARC file and span (4 MiB of it), and each span's task reads them with warcio, in one
   ranged read; a page no WARC file holds is read from its page file;
3. the map runs over chunks of ``chunk`` URLs of each partition, its partial made JSON (as the chord
   stores it); the reduce runs in one task over every partial, and its result is all that comes back.

The final statuses of the URLs that were not stored (the map's ``final_status``) are gathered on the
driver and broadcast: a few bytes per failed URL. The result goes where the chord path writes it
(``jobs/<job>/results/<analyzer>.json``); over several jobs or a span of time, to
``analyses/<run>/<analyzer>.json``. A span without jobs takes every job in storage.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from analyzers.batch import CrawledUrl
from analyzers.batch_registry import get_batch_analyzer
from batch_analysis.spark_input import (
    SPAN_BYTES,
    StorageRoot,
    capture_of,
    index_captures,
    kept,
    later,
    log_entries,
    read_captures,
    read_page_file,
    settle,
)
from batch_analysis.steps import DEFAULT_CHUNK, JobView, crawled_url, new_run_id
from engine.fetch_log import LoggedUrl
from storage import (
    JOBS_DIR,
    Storage,
    analyses_result_location,
    job_fetch_log_location,
    job_result_location,
    job_warc_location,
)
from storage.naming import FETCH_LOG_DIR
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.settings import Settings

__all__ = ["DEFAULT_MASTER", "SparkRequest", "analyze_on_spark", "jobs_in_storage", "parse_conf", "spark_problem"]

DEFAULT_MASTER = "local[*]"


@dataclass(frozen=True)
class SparkRequest:
    """What to analyse: one job or several, one analyzer, optionally one cycle or a span of release times."""

    jobs: tuple[str, ...]
    analyzer: str
    master: str = DEFAULT_MASTER
    cycle: int | None = None
    since: float | None = None  # Unix seconds: URLs released from then on
    until: float | None = None  # ... and before then
    chunk: int = DEFAULT_CHUNK
    conf: tuple[tuple[str, str], ...] = ()  # more Spark settings (spark.executor.memory, ...)

    def __post_init__(self) -> None:
        if not self.jobs and self.since is None and self.until is None:
            raise InvalidTask("jobs", "name at least one job, or a span (since, until) to take every job in storage")
        if len(set(self.jobs)) != len(self.jobs):
            raise InvalidTask("jobs", f"a job is named twice: {', '.join(self.jobs)}")
        if not 1 <= self.chunk <= 100_000:
            raise InvalidTask("chunk", f"must be between 1 and 100000 URLs, got {self.chunk}")
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise InvalidTask("until", "must come after since")
        if not self.master.strip():
            raise InvalidTask("master", "must be a Spark master URL (local[*], spark://HOST:PORT, yarn)")


def spark_problem() -> str | None:
    """Why ``--engine spark`` cannot run in this environment (None: it can)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return ("--engine spark needs PySpark: pip install 'vcrawl[spark]' (make setup installs it), "
                "and a Java runtime (17 or later)")  # fmt: skip
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK)) and not shutil.which("java"):
        return ("--engine spark needs a Java runtime (17 or later) for Spark: install one (Debian: apt install "
                "openjdk-17-jre-headless) or set JAVA_HOME")  # fmt: skip
    return None


def analyze_on_spark(settings: Settings, request: SparkRequest, now: Callable[[], float] = time.time) -> dict[str, Any]:
    """Run the analyzer over the jobs' stored crawl on Spark, write its result; return the run's summary
    (``run``, ``result``, ``urls``, ``pages``, ``engine``, ``master``, ...).

    Raises:
        ConfigError: PySpark or Java is missing.
        UnknownComponent: no batch analyzer has that name.
        InvalidTask: a job has no fetch log, or nothing was crawled in the cycle or span asked.
    """
    if problem := spark_problem():
        raise ConfigError(problem)
    get_batch_analyzer(request.analyzer)  # an unknown name is refused before Spark starts
    store = Storage.from_settings(settings)
    if not request.jobs:
        request = replace(request, jobs=tuple(jobs_in_storage(store)))
        if not request.jobs:
            raise InvalidTask("jobs", f"no job in {store.describe()} has a fetch log")
    parts, indexes = _inputs(store, request)
    started = now()
    run_id = new_run_id(request.analyzer, started)
    session = _session(request, run_id)
    try:
        urls, pages, result = _run(session.sparkContext, StorageRoot.from_settings(settings), request, parts, indexes)
    finally:
        session.stop()
    # One job's whole crawl: its own report, where the chord writes it. A span or several jobs: a report
    # of its own (a span's must not replace the job's).
    spanned = request.since is not None or request.until is not None
    single = len(request.jobs) == 1 and not spanned
    head: dict[str, Any] = {"job": request.jobs[0]} if single else {"jobs": list(request.jobs)}
    head.update(analyzer=request.analyzer, cycle=request.cycle, run=run_id, urls=urls)
    if spanned:
        head.update(since=request.since, until=request.until)
    location = (job_result_location(request.jobs[0], request.analyzer, request.cycle) if single
                else analyses_result_location(run_id, request.analyzer))  # fmt: skip
    document = {**head, **result, "generated_at": round(now(), 3)}
    store.write_bytes(location, json.dumps(document, ensure_ascii=False, indent=1).encode())
    finished = now()
    return {"run": run_id, "analyzer": request.analyzer, "state": "done", "engine": "spark", "master": request.master,
            "jobs": list(request.jobs), "cycle": request.cycle, "urls": urls, "pages": pages,
            "result": store.resolve(location, location), "started_at": round(started, 3),
            "finished_at": round(finished, 3)}  # fmt: skip


def jobs_in_storage(store: Storage) -> list[str]:
    """Every job under the data root that has a fetch log (a job folder holds ``fetch-log/`` once it ended a URL)."""
    return [job for job in store.list_dirs(JOBS_DIR) if FETCH_LOG_DIR in store.list_dirs(f"{JOBS_DIR}/{job}")]


def _inputs(store: Storage, request: SparkRequest) -> tuple[list[str], list[str]]:
    """The fetch-log parts and WARC indexes of the jobs (listed on the driver; read on the executors)."""
    parts: list[str] = []
    indexes: list[str] = []
    for job_id in request.jobs:
        own = [part for part in store.list_files(job_fetch_log_location(job_id)) if part.endswith(".jsonl")]
        if not own:
            raise InvalidTask("job", f"job {job_id} has no crawled URLs in its fetch log")
        parts += own
        indexes += [index for index in store.list_files(job_warc_location(job_id)) if index.endswith(".cdxj")]
    return parts, indexes


def _session(request: SparkRequest, run_id: str) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(request.master).appName(f"vcrawl analyze {run_id}")
    # Executors run this interpreter (vcrawl installed in it) unless PYSPARK_PYTHON says otherwise: PySpark
    # reads the variable, not its setting. The web UI stays off (a port per run) unless asked for.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    defaults = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    for key, value in {**defaults, **dict(request.conf)}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _run(sc: Any, root: StorageRoot, request: SparkRequest, parts: list[str],
         indexes: list[str]) -> tuple[int, int, dict[str, Any]]:  # fmt: skip
    """The Spark job: (URLs, stored pages, the reduce's result)."""
    from pyspark import StorageLevel

    cycle, since, until, name, chunk = request.cycle, request.since, request.until, request.analyzer, request.chunk

    def wanted(entry: tuple[str, tuple[Any, dict[str, Any]]]) -> bool:
        line = entry[1][1]
        at = float(line.get("at") or 0.0)
        return ((cycle is None or int(line.get("cycle") or 0) == cycle) and (since is None or at >= since)
                and (until is None or at < until))  # fmt: skip

    # Spark's task and shuffle costs are fixed per partition: a fetch-log part is small (a batch's lines), so
    # a task takes several, and every shuffle has two partitions per core.
    shares = max(2, 2 * sc.defaultParallelism)
    lines = (
        sc.parallelize(list(enumerate(parts)), min(len(parts), 2 * shares))
        .flatMap(lambda part: log_entries(root, part[0], part[1]))
        .filter(wanted)
        .mapValues(kept)
        .reduceByKey(later, numPartitions=shares)
        .mapValues(lambda fold: settle(fold, cycle is None))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        stored_or_not = lines.map(lambda entry: entry[1].get("outcome") == "stored").countByValue()
        urls, pages_stored = sum(stored_or_not.values()), stored_or_not.get(True, 0)
        if not urls:
            span = "" if cycle is None else f" in cycle {cycle}"
            span += "" if since is None and until is None else " in the span asked"
            raise InvalidTask("job", f"{', '.join(request.jobs)}: no crawled URLs{span}")
        stored = lines.filter(lambda entry: entry[1].get("outcome") == "stored")
        failed = lines.filter(lambda entry: entry[1].get("outcome") != "stored" and entry[1].get("status") is not None)
        statuses = failed.mapValues(lambda line: int(line["status"])).collectAsMap()
        view = sc.broadcast(dict(statuses))
        pages = _pages(sc, root, stored, indexes, shares)
        others = lines.filter(lambda entry: entry[1].get("outcome") != "stored").map(
            lambda entry: crawled_url(LoggedUrl.from_json(entry[1]), None)
        )
        partials = pages.union(others).mapPartitions(lambda urls_: _map_chunks(name, urls_, chunk, view.value))
        # One task folds every partial (shuffled to it: the maps before it stay parallel).
        reduced = partials.coalesce(1, shuffle=True).mapPartitions(lambda all_: [_reduce(name, all_)]).collect()
        return urls, pages_stored, json.loads(reduced[0])
    finally:
        lines.unpersist()


def _pages(sc: Any, root: StorageRoot, stored: Any, indexes: list[str], shares: int) -> Any:
    """The stored pages as ``CrawledUrl``: from the WARC files that hold them (a task per file), else
    from their page files."""
    if not indexes:
        return stored.map(lambda entry: read_page_file(root, entry[1]))
    captures = (sc.parallelize(indexes, min(len(indexes), 2 * shares))
                .flatMap(lambda index: index_captures(root, index)).groupByKey(numPartitions=shares))  # fmt: skip
    placed = stored.leftOuterJoin(captures, numPartitions=shares).map(
        lambda joined: (joined[1][0], capture_of(joined[1][0], joined[1][1] or ()))
    )
    # A task per span of a WARC file (its captures that start there), spread over the cores.
    in_warc = (placed.filter(lambda found: found[1] is not None)
               .map(lambda found: ((found[1][1], found[1][2] // SPAN_BYTES), (found[1][2], found[1][3], found[0])))
               .groupByKey(numPartitions=shares)
               .flatMap(lambda span: read_captures(root, span[0][0], span[1])))  # fmt: skip
    in_files = placed.filter(lambda found: found[1] is None).map(lambda found: read_page_file(root, found[0]))
    return in_warc.union(in_files)


def _map_chunks(
    analyzer_name: str, urls: Iterator[CrawledUrl], chunk: int, statuses: Mapping[str, int]
) -> Iterator[str]:
    """The map over a partition, ``chunk`` URLs at a time: each partial as JSON, as the chord stores it
    (a map's tuples come back as lists, its keys as strings, on both engines)."""
    analyzer = get_batch_analyzer(analyzer_name)
    view = JobView(statuses)
    while batch := list(itertools.islice(urls, chunk)):
        yield json.dumps(analyzer.map(batch, view), ensure_ascii=False, separators=(",", ":"))


def _reduce(analyzer_name: str, partials: Iterator[str]) -> str:
    return json.dumps(get_batch_analyzer(analyzer_name).reduce(json.loads(partial) for partial in partials))


def parse_conf(pairs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` Spark settings from the command line.

    Raises:
        InvalidTask: a pair without ``=`` or with an empty key.
    """
    parsed = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidTask("spark-conf", f"expected KEY=VALUE, got {pair!r}")
        parsed.append((key.strip(), value))
    return tuple(parsed)
