"""The ``vcrawl`` command line: ``demo``, ``crawl`` and ``status``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.settings import Settings

__all__ = ["main", "summarize"]

logger = logging.getLogger("vcrawl")

_STORED_STATES = frozenset({"downloaded", "analyzing", "analyzed", "analysis_failed"})
_EXIT_INTERRUPTED = 130
_INTERRUPT_GRACE_S = 3.0
_TASK_KEYS = ("id", "url", "state", "http_status", "reason", "save_path", "result_path")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"vcrawl: configuration error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vcrawl", description="A distributed vertical web crawler on Celery.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="crawl the bundled demo site on the embedded default")
    _add_run_options(demo)
    demo.set_defaults(run=_cmd_demo)

    crawl = commands.add_parser("crawl", help="download and analyse URLs on the embedded default")
    crawl.add_argument("urls", nargs="+", metavar="URL")
    crawl.add_argument("--analyzer", default="links", help="analyzer name (default: links)")
    _add_run_options(crawl)
    crawl.set_defaults(run=_cmd_crawl)

    status = commands.add_parser("status", help="show the status trail of a submitted task")
    status.add_argument("task_id")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(run=_cmd_status)
    return parser


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="storage root (default: $VCRAWL_DATA or ./crawl-data)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last stdout line")
    parser.add_argument("--workers", type=int, default=8, help="worker threads (default: 8)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up waiting after S seconds")


def _cmd_demo(args: argparse.Namespace) -> int:
    from vcrawl.demo import DemoSite, demo_tasks

    settings = Settings.from_env()
    if "VCRAWL_MIN_INTERVAL_S" not in os.environ:
        settings = replace(settings, min_interval_s=0.1)  # our own loopback site: a short pause is polite
    with DemoSite() as site:
        print(f"demo site at {site.url}", file=sys.stderr)
        return _run_embedded(demo_tasks(site.url), settings, args)


def _cmd_crawl(args: argparse.Namespace) -> int:
    submissions = [{"url": url, "analyzer": args.analyzer} for url in args.urls]
    return _run_embedded(submissions, Settings.from_env(), args)


def _cmd_status(args: argparse.Namespace) -> int:
    import tasks

    record = tasks.status(args.task_id)
    if record is None:
        print(f"vcrawl: no task {args.task_id!r} (unknown, or its status expired)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(record, sort_keys=True))
    else:
        for name in sorted(record):
            print(f"{name:>20}  {record[name]}")
    return 0


def _run_embedded(submissions: list[dict[str, Any]], settings: Settings, args: argparse.Namespace) -> int:
    """Private Redis (unless VCRAWL_REDIS_URL is set), an in-process worker, submit, wait, report."""
    import tasks
    from tasks.embedded import EmbeddedWorker
    from vcrawl.local_redis import LocalRedis

    if args.data is not None:
        settings = replace(settings, data=args.data)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops as cleanly as Ctrl-C
    with ExitStack() as stack:
        if not os.environ.get("VCRAWL_REDIS_URL"):
            local = stack.enter_context(LocalRedis())
            settings = replace(settings, redis_url=local.url)
            print(f"started a private redis-server (pid {local.pid})", file=sys.stderr)
        tasks.configure(settings)
        worker = EmbeddedWorker(concurrency=args.workers).start()
        try:
            ids = [tasks.crawl.delay(payload).id for payload in submissions]
            records = _wait_for(ids, args.timeout)
        except InvalidTask as exc:
            print(f"vcrawl: invalid task: {exc}", file=sys.stderr)
            worker.stop()
            return 2
        except KeyboardInterrupt:
            print("\ninterrupted: stopping the worker", file=sys.stderr)
            finished = worker.stop(timeout_s=_INTERRUPT_GRACE_S)
            stack.close()
            if not finished:
                # Running downloads would keep the interpreter alive until their timeouts.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(_EXIT_INTERRUPTED)
            return _EXIT_INTERRUPTED
        worker.stop()
    summary = summarize(records, time.monotonic() - started, str(Path(settings.data).resolve()))
    _report(records, summary, as_json=args.json)
    return 0 if summary["pending"] == 0 else 1


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _wait_for(ids: list[str], timeout_s: float) -> list[dict[str, Any]]:
    """Poll the status trails until every task has ended or ``timeout_s`` passed."""
    from tasks import TERMINAL_STATES, deps

    trail = deps.trail()
    deadline = time.monotonic() + timeout_s
    last_line = ""
    while True:
        found = trail.get_many(ids)
        records = [found[i] or {"id": i, "state": "unknown"} for i in ids]
        counts = Counter(record["state"] for record in records)
        line = "progress: " + ", ".join(f"{state} {n}" for state, n in sorted(counts.items()))
        if line != last_line:
            print(line, file=sys.stderr)
            last_line = line
        if all(record["state"] in TERMINAL_STATES for record in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def summarize(records: list[dict[str, Any]], elapsed_s: float, data_dir: str) -> dict[str, Any]:
    """Return the run summary: pages stored and failed, failure reasons, bytes, time, paths."""
    from tasks import TERMINAL_STATES

    failed = Counter(record.get("reason", "error") for record in records if record["state"] == "download_failed")
    analysis_failed = Counter(
        record.get("reason", "error") for record in records if record["state"] == "analysis_failed"
    )
    return {
        "pages_stored": sum(record["state"] in _STORED_STATES for record in records),
        "pages_failed": sum(record["state"] == "download_failed" for record in records),
        "failed": dict(failed),
        "pages_analyzed": sum(record["state"] == "analyzed" for record in records),
        "analysis_failed": dict(analysis_failed),
        "pending": sum(record["state"] not in TERMINAL_STATES for record in records),
        "bytes": sum(int(record.get("bytes") or 0) for record in records),
        "elapsed_s": round(elapsed_s, 3),
        "data_dir": data_dir,
        "tasks": [{key: record.get(key) for key in _TASK_KEYS} for record in records],
    }


def _report(records: list[dict[str, Any]], summary: dict[str, Any], as_json: bool) -> None:
    for record in records:
        where = record.get("result_path") if record["state"] == "analyzed" else record.get("error") or ""
        print(f"{record['state']:<16} {record.get('url', record['id'])}  {where}")
    print(
        f"\n{summary['pages_stored']} pages stored, {summary['pages_analyzed']} analysed, "
        f"{summary['pages_failed']} failed {summary['failed'] or ''}, {summary['bytes']} bytes "
        f"in {summary['elapsed_s']} s\npages and results are under {summary['data_dir']}"
    )
    if as_json:
        print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
