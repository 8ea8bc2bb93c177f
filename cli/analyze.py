"""``vcrawl analyze``, ``vcrawl reanalyze`` and ``vcrawl analyzers``: batch analysis and replay of a stored crawl.

Both run on the cluster's analysis workers (a Celery chord) and wait here, with a progress line on
stderr. ``--json`` prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from vcrawl.errors import AnalysisFailed, InvalidTask

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
        "jobs/<job>/results/<analyzer>.json under the data root (jobs/<job>/cycle-<n>/results/ with --cycle); "
        "its location is printed.",
    )
    analyze.add_argument("job", help="the job id")
    analyze.add_argument("--analyzer", required=True, help="the batch analyzer's name (see `vcrawl analyzers`)")
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
    import tasks

    return _run(args, lambda: tasks.start_analysis(args.job, args.analyzer, cycle=args.cycle, chunk=args.chunk))


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
