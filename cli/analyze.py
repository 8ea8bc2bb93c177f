"""``vcrawl analyze``, ``vcrawl reanalyze`` and ``vcrawl analyzers``: batch analysis and replay of a stored crawl.

Both run on the cluster's analysis workers (a Celery chord) and wait here, with a progress line on
stderr. ``--json`` prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vcrawl.errors import AnalysisFailed, ConfigError, InvalidTask, UnknownComponent

__all__ = ["add_analysis_commands", "progress_line"]

_CHUNK_HELP = "URLs per map task (default 100); each chunk is retried on its own"


def add_analysis_commands(commands: Any) -> None:
    """Register ``analyze``, ``reanalyze`` and ``analyzers`` on the ``vcrawl`` parser's subparsers."""
    analyze = commands.add_parser(
        "analyze",
        help="run a batch (map/reduce) analyzer over a finished job's stored crawl",
        description="Runs a batch analyzer over every URL a finished job crawled, as a chord of map tasks on the "
        "analysis queue and one reduce. Built-in analyzers: site-report (per host: pages, bytes, status codes, "
        "content types, depth histogram, top outgoing domains, broken links with their referrers) and "
        "near-duplicates (clusters of identical and near-identical pages). The result is written to "
        "jobs/<job>/results/<analyzer>.json under the data root (jobs/<job>/cycle-<n>/results/ with --cycle; "
        "analyses/<run>/ for several jobs); its location is printed. With --engine spark the same analyzer runs "
        "as a PySpark job over the jobs' WARC files and fetch logs instead (docs/analysis.md).",
    )
    analyze.add_argument("job", nargs="?", help="the job id (or --jobs)")
    analyze.add_argument("--analyzer", required=True, help="the batch analyzer's name (see `vcrawl analyzers`)")
    analyze.add_argument("--engine", choices=("chord", "spark"), default="chord",
                         help="chord: the cluster's analysis workers (default); spark: a PySpark job run from here, "
                         "reading storage itself (pip install 'vcrawl[spark]' and a Java runtime)")  # fmt: skip
    analyze.add_argument(
        "--master",
        default=None,
        help="with --engine spark: the Spark master, local[*] (default), spark://HOST:PORT or yarn",
    )
    analyze.add_argument("--jobs", help="with --engine spark: several jobs at once, A,B,C (one report over them all)")
    analyze.add_argument("--since", help="with --engine spark: only URLs fetched from this UTC date or time on "
                         "(2026-11-01 or 2026-11-01T12:00); without a job, over every job in storage")  # fmt: skip
    analyze.add_argument("--until", help="with --engine spark: only URLs fetched before this UTC date or time")
    analyze.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --engine spark: a Spark setting (repeatable), e.g. spark.executor.memory=4g",
    )
    analyze.add_argument("--cycle", type=int, help="one cycle of a scheduled job (default: every URL's last visit)")
    analyze.add_argument("--chunk", type=int, default=100, help=_CHUNK_HELP)
    analyze.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the result")
    analyze.add_argument("--json", action="store_true", help="print the finished run as one JSON object")
    analyze.set_defaults(run=_cmd_analyze)

    replay = commands.add_parser(
        "reanalyze",
        help="run a per-page analyzer again over a job's stored pages, fetching nothing",
        description="Replays a finished job's stored pages through a per-page analyzer (e.g. fields with a fixed "
        "rule). New records go to jobs/<job>/replays/<run>/records/, beside the crawl's own, which stay.",
    )
    replay.add_argument("job", help="the job id")
    replay.add_argument("--analyzer", required=True, help="the per-page analyzer's name (e.g. fields)")
    replay.add_argument("--fields", type=Path, help="a JSON or YAML file of field rules (name -> rule), "
                        "instead of the job's rules")  # fmt: skip
    replay.add_argument("--cycle", type=int, help="one cycle of a scheduled job")
    replay.add_argument("--chunk", type=int, default=100, help=_CHUNK_HELP)
    replay.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the replay")
    replay.add_argument("--json", action="store_true", help="print the finished run as one JSON object")
    replay.set_defaults(run=_cmd_reanalyze)

    listing = commands.add_parser("analyzers", help="list the analyzers: per page and batch (map/reduce)")
    listing.add_argument("--json", action="store_true", help="one JSON object: {page: [...], batch: [...]}")
    listing.set_defaults(run=_cmd_analyzers)


def _cmd_analyze(args: argparse.Namespace) -> int:
    try:
        jobs = _jobs_of(args)
        if args.engine == "spark":
            return _run_on_spark(args, jobs)
        if len(jobs) > 1 or args.master or args.since or args.until or args.spark_conf:
            raise InvalidTask("engine", "--jobs, --master, --since, --until and --spark-conf need --engine spark")
    except (InvalidTask, ConfigError, UnknownComponent) as exc:
        print(f"vcrawl: {exc}", file=sys.stderr)
        return 2
    import tasks

    return _run(args, lambda: tasks.start_analysis(jobs[0], args.analyzer, cycle=args.cycle, chunk=args.chunk))


def _jobs_of(args: argparse.Namespace) -> list[str]:
    """The job, or the --jobs list (not both); none: with --engine spark and a span, every job in storage."""
    listed = [job.strip() for job in (args.jobs or "").split(",") if job.strip()]
    if args.job and listed:
        raise InvalidTask("jobs", "name one job, or several with --jobs A,B,C")
    if not args.job and not listed and not (args.engine == "spark" and (args.since or args.until)):
        raise InvalidTask("jobs", "name one job, or several with --jobs A,B,C (or, with --engine spark, a span "
                          "with --since/--until: every job in storage)")  # fmt: skip
    return [args.job] if args.job else listed


def _run_on_spark(args: argparse.Namespace, jobs: list[str]) -> int:
    from batch_analysis.spark import DEFAULT_MASTER, SparkRequest, analyze_on_spark, parse_conf
    from vcrawl.settings import Settings

    request = SparkRequest(jobs=tuple(jobs), analyzer=args.analyzer, master=args.master or DEFAULT_MASTER,
                           cycle=args.cycle, since=_moment(args.since, "since"), until=_moment(args.until, "until"),
                           chunk=args.chunk, conf=parse_conf(args.spark_conf))  # fmt: skip
    print(f"{args.analyzer}: a Spark job on {request.master} over {', '.join(jobs) or 'every job in storage'}",
          file=sys.stderr)  # fmt: skip
    started = time.monotonic()
    try:
        done = analyze_on_spark(Settings.from_env(), request)
    except (InvalidTask, ConfigError, UnknownComponent):
        raise  # a refusal: the caller says it in one line, exit 2
    except Exception as exc:  # Spark's or storage's failure (an executor lost for good, storage gone): its last words
        words = [line for line in str(exc).splitlines() if line.strip()]
        print(f"vcrawl: the Spark job failed: {type(exc).__name__}: {(words or [''])[-1][:500]}", file=sys.stderr)
        return 1
    done["elapsed_s"] = round(time.monotonic() - started, 2)
    print(
        f"{args.analyzer}: {done['urls']} URLs, {done['pages']} pages, done in {done['elapsed_s']} s", file=sys.stderr
    )
    print(json.dumps(done) if args.json else f"result: {done['result']}")
    return 0


def _moment(text: str | None, option: str) -> float | None:
    """Unix seconds of a UTC date or date and time given on the command line."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidTask(
            option, f"expected a date or date and time (2026-11-01, 2026-11-01T12:00), got {text!r}"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _cmd_reanalyze(args: argparse.Namespace) -> int:
    import tasks

    fields = _read_fields(args.fields) if args.fields is not None else None
    return _run(
        args,
        lambda: tasks.start_analysis(
            args.job, args.analyzer, replay=True, cycle=args.cycle, chunk=args.chunk, fields=fields
        ),
    )


def _cmd_analyzers(args: argparse.Namespace) -> int:
    import tasks

    known = tasks.analyzers()
    if args.json:
        print(json.dumps(known))
        return 0
    print("per-page analyzers (job rules, crawl.delay, vcrawl reanalyze): " + ", ".join(known["page"]))
    print("batch analyzers (vcrawl analyze, a job's batch_analyzers): " + ", ".join(known["batch"]))
    return 0


def _run(args: argparse.Namespace, start: Any) -> int:
    from tasks.analysis_facade import wait_for_run

    started = time.monotonic()
    try:
        run = start()
    except InvalidTask as exc:
        print(f"vcrawl: {exc}", file=sys.stderr)
        return 2
    print(f"run {run['run']}: {run.get('urls')} URLs in {run.get('chunks')} chunks on the analysis queue",
          file=sys.stderr)  # fmt: skip
    show = sys.stderr.isatty()
    try:
        done = wait_for_run(args.job, run["run"], args.timeout, _progress(show))
    except AnalysisFailed as exc:
        print(f"\nvcrawl: {exc}", file=sys.stderr)
        return 1
    except TimeoutError as exc:
        print(f"\nvcrawl: {exc}", file=sys.stderr)
        return 1
    done["elapsed_s"] = round(time.monotonic() - started, 2)
    print(("\r" if show else "") + progress_line(done), file=sys.stderr)
    if args.json:
        print(json.dumps(done))
    else:
        print(f"result: {done['result']}")
    return 0


def _progress(on_tty: bool) -> Any:
    last = {"line": ""}

    def show(run: dict[str, Any]) -> None:
        line = progress_line(run)
        if line != last["line"]:
            print(("\r" + line) if on_tty else line, end="" if on_tty else "\n", file=sys.stderr, flush=True)
            last["line"] = line

    return show


def progress_line(run: dict[str, Any]) -> str:
    """The progress of a run, one line.

    >>> progress_line({"run": "r", "analyzer": "site-report", "state": "running", "chunks": 8, "chunks_done": 2})
    'site-report: 2/8 chunks mapped (25%), running'
    """
    chunks, done = int(run.get("chunks") or 0), int(run.get("chunks_done") or 0)
    share = f" ({100 * done // chunks}%)" if chunks else ""
    return f"{run.get('analyzer')}: {done}/{chunks} chunks mapped{share}, {run.get('state')}"


def _read_fields(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)
