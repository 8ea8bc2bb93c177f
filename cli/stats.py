"""``vcrawl stats JOB --by day``: a job's pages, bytes and final failures per UTC day, and per host."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.arguments import positive_int
from cli.tables import aligned

__all__ = ["add_stats_command", "format_daily"]

_COLUMNS = (("FETCHED", "pages_fetched"), ("STORED", "pages_stored"), ("BYTES", "bytes"), ("NEW", "new"),
            ("CHANGED", "changed"))  # fmt: skip


def add_stats_command(commands: Any) -> None:
    """Register ``vcrawl stats`` on the ``vcrawl`` parser's subparsers."""
    stats = commands.add_parser(
        "stats",
        help="a job's pages, bytes and failures per UTC day, per host too ($VCRAWL_REDIS_URL)",
        description="Days are UTC dates; they are kept VCRAWL_STATS_RETENTION_DAYS (90) after their last page. "
        "Per-minute figures are in the job API (GET /api/jobs/{id}/stats) and on the dashboard.",
    )
    stats.add_argument("job")
    stats.add_argument("--by", choices=("day",), default="day", help="the period of a row (only: day)")
    stats.add_argument("--days", type=positive_int, default=14, help="how many days back, today included (default 14)")
    stats.add_argument("--host", help="only this host in the per-host part")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(run=_cmd_stats)


def _cmd_stats(args: argparse.Namespace) -> int:
    import tasks

    report = tasks.job_daily(args.job, args.days, host=args.host)
    if report is None:
        print(f"vcrawl: no job {args.job!r} (unknown, or its Redis is another one)", file=sys.stderr)
        return 2
    print(json.dumps(report, sort_keys=True) if args.json else format_daily(report))
    return 0


def format_daily(report: dict[str, Any]) -> str:
    """The report as tables: the job's days from its first active one, the window's total, then per host.

    >>> day = {"day": "2026-11-26", "pages_fetched": 12, "pages_stored": 10, "bytes": 5120,
    ...        "failed": {"http_404": 2}, "new": 0, "changed": 0, "unchanged": 0}
    >>> empty = {**day, "day": "2026-11-25", "pages_fetched": 0, "pages_stored": 0, "bytes": 0, "failed": {}}
    >>> host = {"day": "2026-11-26", "pages_fetched": 12, "pages_stored": 10, "bytes": 5120, "failed": 2}
    >>> print(format_daily({"job": "j1", "days": [empty, day], "totals": {**day, "day": "total"},
    ...                     "hosts": {"a.test": [host]}}))
    job j1, by UTC day (2 days)
    DAY         FETCHED  STORED  BYTES  NEW  CHANGED  FAILED
    2026-11-26       12      10   5120    0        0  2 (http_404 2)
    total            12      10   5120    0        0  2 (http_404 2)
    <BLANKLINE>
    HOST    DAY         FETCHED  STORED  BYTES  FAILED
    a.test  2026-11-26       12      10   5120       2
    """
    days = report["days"]
    active = [i for i, day in enumerate(days) if day["pages_fetched"] or day["failed"] or day["pages_stored"]]
    lines = [f"job {report['job']}, by UTC day ({len(days)} days)"]
    if not active:
        return "\n".join([*lines, "nothing fetched in these days"])
    rows = [("DAY", *(title for title, _ in _COLUMNS), "FAILED")]
    for day in [*days[active[0] :], {**report["totals"], "day": "total"}]:
        rows.append((day["day"], *(str(day[key]) for _, key in _COLUMNS), _failures(day["failed"])))
    lines += aligned(rows, right=range(1, len(rows[0]) - 1))
    host_rows = [("HOST", "DAY", "FETCHED", "STORED", "BYTES", "FAILED")]
    for name, entries in sorted(report["hosts"].items()):
        host_rows += [(name, e["day"], str(e["pages_fetched"]), str(e["pages_stored"]), str(e["bytes"]),
                       str(e["failed"])) for e in entries]  # fmt: skip
    if len(host_rows) > 1:
        lines += ["", *aligned(host_rows, right=range(2, len(host_rows[0])))]
    return "\n".join(lines)


def _failures(failed: dict[str, int]) -> str:
    if not failed:
        return "0"
    return f"{sum(failed.values())} (" + ", ".join(f"{reason} {n}" for reason, n in sorted(failed.items())) + ")"
