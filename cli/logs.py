"""``vcrawl logs``: the cluster log stream (every worker's lines in Redis); ``vcrawl log-level``: what goes in it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from cli.arguments import positive_int
from cli.tables import aligned
from vcrawl.settings import LOG_LEVELS

__all__ = ["add_logs_commands"]


def add_logs_commands(commands: Any) -> None:
    """Register ``vcrawl logs`` and ``vcrawl log-level`` on the ``vcrawl`` parser's subparsers."""
    logs = commands.add_parser(
        "logs",
        help="read the cluster log stream ($VCRAWL_REDIS_URL): every worker's lines, by job, node and level",
        description="Workers ship their lines from WARNING on (VCRAWL_LOG_STREAM_LEVEL; per logger with "
        "`vcrawl log-level`) to one Redis stream of about VCRAWL_LOG_MAXLEN lines. Lines print oldest first.",
    )
    logs.add_argument("--job", help="only lines about this job")
    logs.add_argument("--node", help="only lines of this worker (its name, w1@box, or its host, box)")
    logs.add_argument("--level", type=str.upper, choices=LOG_LEVELS, default="DEBUG", help="only from this level on")
    logs.add_argument("--limit", type=positive_int, default=100, help="how many of the last lines (default 100)")
    logs.add_argument("--follow", "-f", action="store_true", help="then print new lines as they come (Ctrl-C stops)")
    logs.add_argument("--timeout", type=float, metavar="S", help="with --follow: stop after S seconds")
    logs.add_argument("--json", action="store_true", help="one JSON object per line (the stream's fields)")
    logs.set_defaults(run=_cmd_logs)

    level = commands.add_parser(
        "log-level",
        help="set from which level a logger's lines go to the cluster log stream; workers apply it within seconds",
        description="LOGGER is a logger name (engine, engine.fetch_step, fetchers, celery) and its children, or "
        "root for all. Without LEVEL: list the levels set. LEVEL reset: back to VCRAWL_LOG_STREAM_LEVEL.",
    )
    level.add_argument("logger", nargs="?", help="the logger (root: every logger)")
    level.add_argument("level", nargs="?", type=str.upper, choices=(*LOG_LEVELS, "RESET"), help="the level, or reset")
    level.set_defaults(run=_cmd_log_level)


def _print(fields: dict[str, str], as_json: bool) -> None:
    from telemetry.log_stream import format_entry

    print(json.dumps(fields, sort_keys=True) if as_json else format_entry(fields), flush=True)


def _cmd_logs(args: argparse.Namespace) -> int:
    import tasks

    entries = tasks.read_logs(args.job, args.node, args.level, args.limit)
    for _, fields in entries:
        _print(fields, args.json)
    if not entries and not args.follow:  # say so on stderr: stdout stays only lines
        of_job = f" of job {args.job}" if args.job else ""
        print(f"vcrawl: no lines{of_job} in the log stream (from {args.level} on)", file=sys.stderr)
    if not args.follow:
        return 0
    # Nothing shown yet: a job's own stream is short, read it from its start so no line that came
    # meanwhile is missed; the cluster's stream from now on.
    after = entries[-1][0] if entries else ("0-0" if args.job else "$")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    try:
        # Each read blocks at most a second: Ctrl-C and --timeout are noticed at once.
        while deadline is None or time.monotonic() < deadline:
            found, after = tasks.read_new_logs(after, args.job, args.node, args.level, block_ms=1000)
            for _, fields in found:
                _print(fields, args.json)
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    return 0


def _cmd_log_level(args: argparse.Namespace) -> int:
    import tasks
    from telemetry.log_stream import DEFAULT_LOGGER

    if args.logger is None or args.level is None:
        if args.logger is not None:
            print("vcrawl: give a LEVEL (or reset) after the logger", file=sys.stderr)
            return 2
        levels = tasks.log_levels()
        rows = sorted(levels.items())
        if DEFAULT_LOGGER not in levels:  # the workers' own setting: only this shell's is known here
            default = f"each worker's VCRAWL_LOG_STREAM_LEVEL ({tasks.settings().log_stream_level} in this shell)"
            rows.append((f"{DEFAULT_LOGGER} (not set)", default))
        print("\n".join(aligned(rows)))
        return 0
    tasks.set_log_level(args.logger, None if args.level == "RESET" else args.level)
    shown = "the default" if args.level == "RESET" else args.level
    poll_s = tasks.settings().log_levels_poll_s
    print(f"log stream: {args.logger} from {shown} on; workers apply it within {poll_s:g} s")
    return 0
