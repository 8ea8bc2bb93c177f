"""The ``vcrawl`` command line: ``demo``, ``crawl``, ``submit``, ``status``, ``cancel``, ``export``,
``schedule``, ``flower``, ``logs``, and the operator commands of ``cli.ops`` (``serve``, ``pause``,
``resume``, ``config``).

``tasks`` is imported inside the commands: it reads the configuration when imported, and a
broken one is reported by ``main`` as a configuration error, not as a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from cli.analyze import add_analysis_commands
from cli.logs import add_logs_commands
from cli.nodes import add_nodes_command
from cli.ops import add_ops_commands
from cli.progress import OUTPUTS_WAIT_S, follow, report, summary_of, wait_for_outputs
from cli.proxies import add_proxies_command
from cli.run import add_network_option, add_run_options, allowing, run_job_locally
from cli.stats import add_stats_command
from vcrawl import names
from vcrawl.errors import ConfigError, InvalidTask, RecordsUnavailable
from vcrawl.jobs import JobSpec, load_job_file
from vcrawl.settings import Settings, child_environment

__all__ = ["main"]

logger = logging.getLogger("vcrawl")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"vcrawl: configuration error: {exc}", file=sys.stderr)
        return 2
    except InvalidTask as exc:
        print(f"vcrawl: invalid job: {exc}", file=sys.stderr)
        return 2
    except RecordsUnavailable as exc:  # its message names the database without the password
        print(f"vcrawl: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vcrawl", description="A distributed vertical web crawler on Celery.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="crawl the bundled demo site on the embedded default")
    add_run_options(demo)
    demo.set_defaults(run=_cmd_demo)

    crawl = commands.add_parser("crawl", help="run a crawl job on the embedded default (private Redis, local workers)")
    crawl.add_argument("urls", nargs="*", metavar="URL", help="seed URLs (or give --job)")
    crawl.add_argument("--job", type=Path, help="a job file (YAML or JSON); URLs given are added as seeds")
    crawl.add_argument("--depth", type=int, help="maximum link depth from the seeds (default 3)")
    crawl.add_argument("--max-pages", type=int, help="stop admitting URLs after this many (default 10000)")
    scope = crawl.add_mutually_exclusive_group()
    scope.add_argument("--same-host", action="store_true", help="stay on the seeds' hosts (the default)")
    scope.add_argument("--domain", action="append", metavar="D", help="stay within domain D and its subdomains")
    crawl.add_argument("--delay", type=float, metavar="S", help="minimum seconds between requests to a host (0.25)")
    crawl.add_argument("--analyzer", help="analyzer writing a result per page (default: none, links only)")
    add_network_option(crawl)
    crawl.add_argument("--warc", action="store_true", help="also write every response to WARC files")
    add_run_options(crawl)
    crawl.set_defaults(run=_cmd_crawl)

    submit = commands.add_parser("submit", help="submit a job file to a running cluster ($VCRAWL_REDIS_URL)")
    submit.add_argument("job_file", type=Path)
    submit.add_argument("--json", action="store_true", help="print the job status (with --wait: the summary) as JSON")
    submit.add_argument(
        "--wait",
        action="store_true",
        help="follow the job to its end and its output into storage; exit 0 if it completed",
    )
    submit.add_argument("--timeout", type=float, help="with --wait: cancel the job after S seconds")
    submit.set_defaults(run=_cmd_submit)

    status = commands.add_parser("status", help="show a job's or a task's status")
    status.add_argument("id", metavar="JOB_OR_TASK_ID")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(run=_cmd_status)

    export = commands.add_parser("export", help="write a job's records as JSON Lines or CSV")
    export.add_argument("job")
    export.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    export.add_argument("--out", type=Path, help="output file (default: stdout)")
    export.add_argument("--data", help="storage root (default: $VCRAWL_DATA)")
    export.set_defaults(run=_cmd_export)

    cancel = commands.add_parser("cancel", help="stop dispatching a job (in-flight fetches finish)")
    cancel.add_argument("job")
    cancel.set_defaults(run=_cmd_cancel)

    add_ops_commands(commands)  # serve, pause, resume, config
    add_nodes_command(commands)  # nodes
    add_proxies_command(commands)  # proxies
    add_analysis_commands(commands)  # analyze, reanalyze, analyzers
    add_stats_command(commands)  # stats
    add_logs_commands(commands)  # logs, log-level

    schedule = commands.add_parser("schedule", help="recurring jobs run by Celery beat (stored in Redis)")
    actions = schedule.add_subparsers(required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add or change a schedule; beat picks it up without a restart")
    add.add_argument("name", help="the schedule's name, also its job's id")
    add.add_argument("--job", type=Path, required=True, help="the job file (YAML or JSON)")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", type=float, metavar="SECONDS", help="fire every SECONDS")
    when.add_argument("--cron", metavar="EXPR", help='fire on a cron expression in UTC, e.g. "0 3 * * *"')
    add.add_argument("--overlap", choices=("skip", "cancel"), default="skip",
                     help="if the last cycle still runs: skip this firing (default) or cancel that cycle")  # fmt: skip
    add.set_defaults(run=_cmd_schedule_add)
    listing = actions.add_parser("list", help="list schedules with their next firing")
    listing.add_argument("--json", action="store_true", help="print one JSON list")
    listing.set_defaults(run=_cmd_schedule_list)
    remove = actions.add_parser("remove", help="delete a schedule (a running cycle goes on)")
    remove.add_argument("name")
    remove.set_defaults(run=_cmd_schedule_remove)
    fire = actions.add_parser("run", help="fire a schedule now (a cycle still running is handled as by beat)")
    fire.add_argument("name")
    fire.set_defaults(run=_cmd_schedule_run)

    flower = commands.add_parser("flower", help="start Flower on the broker, behind $FLOWER_BASIC_AUTH")
    flower.add_argument("--port", type=int, default=5555, help="port to listen on (default 5555)")
    flower.add_argument("--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    flower.add_argument("--insecure-local", action="store_true",
                        help="run without FLOWER_BASIC_AUTH (loopback addresses only)")  # fmt: skip
    flower.set_defaults(run=_cmd_flower)
    return parser


def _cmd_demo(args: argparse.Namespace) -> int:
    from cli.demo import DemoSite, demo_job

    with DemoSite() as site:
        print(f"demo site at {site.url}", file=sys.stderr)
        # The demo site is on loopback, which vcrawl refuses by default: allow exactly its address.
        settings = allowing(Settings.from_env(), [site.network])
        return run_job_locally(demo_job(site.url), settings, args)


def _cmd_crawl(args: argparse.Namespace) -> int:
    data: dict[str, Any] = {}
    if args.job is not None:
        data = dict(load_job_file(args.job).to_dict())
        data.pop("id")
    if args.urls:
        data["seeds"] = [*data.get("seeds", []), *args.urls]
    if not data.get("seeds"):
        raise InvalidTask("seeds", "give seed URLs or a --job file with seeds")
    if args.depth is not None:
        data["max_depth"] = args.depth
    if args.max_pages is not None:
        data["max_pages"] = args.max_pages
    if args.domain:
        data["scope"] = {**data.get("scope", {}), "domains": args.domain, "hosts": []}
    if args.delay is not None:
        data["politeness"] = {**data.get("politeness", {}), "min_interval_s": args.delay}
    if args.analyzer is not None:
        data["rules"] = [*data.get("rules", []), {"pattern": "", "analyzer": args.analyzer}]
    if args.warc:
        data["warc"] = True
    return run_job_locally(JobSpec.from_dict(data), allowing(Settings.from_env(), args.allow_network or []), args)


def _cmd_submit(args: argparse.Namespace) -> int:
    import tasks

    started = time.monotonic()
    job_id = tasks.start_job(load_job_file(args.job_file))
    if not args.wait:
        print(json.dumps(tasks.job_status(job_id), sort_keys=True) if args.json else job_id)
        return 0
    print(f"job {job_id} submitted; following it (Ctrl-C stops following, not the job)", file=sys.stderr)
    try:
        status = follow(job_id, args.timeout)
    except KeyboardInterrupt:
        print(f"\nstopped following job {job_id}; it goes on (vcrawl status {job_id}; vcrawl cancel {job_id})",
              file=sys.stderr)  # fmt: skip
        return 130
    if not status:  # follow returns a status unless interrupted; an empty one: the job is gone
        print(f"vcrawl: job {job_id} disappeared from the cluster's Redis while it ran", file=sys.stderr)
        return 1
    # The workers ship the job's WARC files and record parts when it ends: wait for them to be in storage.
    status = wait_for_outputs(job_id, status)
    summary = summary_of(status, time.monotonic() - started, tasks.settings().data)
    report(summary, as_json=args.json)
    if status.get("outputs_pending"):
        print(f"vcrawl: job {job_id}: {status['outputs_pending']} worker process(es) still hold WARC files or "
              f"records of it {OUTPUTS_WAIT_S:g} s after it ended (see outputs_pending in vcrawl status {job_id})",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0 if summary.state == names.STATE_COMPLETED else 1


def _cmd_status(args: argparse.Namespace) -> int:
    import tasks

    record = tasks.job_status(args.id) or tasks.status(args.id)
    if record is None:
        print(f"vcrawl: no job or task {args.id!r} (unknown, or its status expired)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(record, sort_keys=True))
        return 0
    for name in sorted(record):
        if name == "filter_chain":  # one line: each filter's name, its params as JSON when it has any
            shown = (f"{f['name']} {json.dumps(f['params'])}" if f["params"] else f["name"] for f in record[name])
            print(f"{name:>20}  {', '.join(shown)}")
        elif name != "cycles":
            print(f"{name:>20}  {record[name]}")
    if record.get("cycles"):
        columns = ("cycle", "state", "fetched", "not_modified", "unchanged", "changed", "new", "analysed", "not_due")
        print("\n" + "  ".join(f"{c:>12}" for c in columns))
        for cycle in record["cycles"]:
            print("  ".join(f"{cycle[c]!s:>12}" for c in columns))
    return 0


def _schedule_store() -> Any:
    import tasks

    return tasks.schedule_store()


def _cmd_schedule_add(args: argparse.Namespace) -> int:
    import tasks
    from vcrawl.schedules import Schedule

    spec = load_job_file(args.job)
    item = Schedule(args.name, spec, every_s=args.every, cron=args.cron, overlap=args.overlap)
    tasks.check_job(item.spec)  # analyzers and selectors, as a firing would
    existing = tasks.job_status(item.name)
    if existing is not None and "cycle" not in existing:
        raise InvalidTask("name", f"{item.name!r} is a one-off job's id; a schedule needs a name of its own")
    _schedule_store().add(item)
    print(f"schedule {item.name}: {item.when()}, overlap {item.overlap}; job {item.name} ({len(spec.seeds)} seeds)")
    return 0


def _cmd_schedule_list(args: argparse.Namespace) -> int:
    from vcrawl.schedules import describe

    rows = _schedule_store().list()
    print(json.dumps(rows, sort_keys=True) if args.json else describe(rows))
    return 0


def _cmd_schedule_remove(args: argparse.Namespace) -> int:
    if _schedule_store().remove(args.name):
        print(f"schedule {args.name} removed (the job's history stays; a running cycle goes on)")
        return 0
    print(f"vcrawl: no schedule {args.name!r}", file=sys.stderr)
    return 1


def _cmd_schedule_run(args: argparse.Namespace) -> int:
    import tasks

    entry = _schedule_store().get(args.name)
    if entry is None:
        print(f"vcrawl: no schedule {args.name!r}", file=sys.stderr)
        return 1
    result = tasks.start_cycle.apply_async(entry["args"], entry["kwargs"])
    print(f"schedule {args.name} fired (task {result.id})")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    import tasks

    if args.out is None:
        count = tasks.export_records(args.job, sys.stdout, args.format, data=args.data)
    else:
        with open(args.out, "w", newline="", encoding="utf-8") as out:
            count = tasks.export_records(args.job, out, args.format, data=args.data)
    print(f"{count} records of job {args.job}", file=sys.stderr)
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    import tasks

    if tasks.cancel_job(args.job):
        print(f"job {args.job} cancelled: nothing more is dispatched; fetches in flight finish")
        return 0
    print(f"vcrawl: job {args.job!r} is not running", file=sys.stderr)
    return 1


def _cmd_flower(args: argparse.Namespace) -> int:
    from cli import flower

    options = flower.FlowerOptions(address=args.address, port=args.port, insecure_local=args.insecure_local)
    env = flower.flower_env(child_environment(), Settings.from_env(), options)
    flower.exec_flower(flower.flower_command(options), env)
