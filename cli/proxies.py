"""``vcrawl proxies``: the harvested proxy pool (fastest first), the proxies cooling off; ``--harvest`` runs one now."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from cli.tables import aligned

__all__ = ["add_proxies_command", "format_pool"]


def add_proxies_command(commands: Any) -> None:
    """Register ``vcrawl proxies`` on the ``vcrawl`` parser's subparsers."""
    proxies = commands.add_parser(
        "proxies",
        help="list the harvested proxies ($VCRAWL_REDIS_URL): latency, anonymity, source, last check; and the "
        "proxies cooling off",
        description="Beat harvests the proxy sources of VCRAWL_PROXY_SOURCES every VCRAWL_PROXY_HARVEST_EVERY_S "
        "(docs/proxies.md). --harvest runs one harvest in this process, with this process's settings.",
    )
    proxies.add_argument("--json", action="store_true", help="one JSON object")
    proxies.add_argument("--harvest", action="store_true", help="harvest now and print the run's report")
    proxies.set_defaults(run=_cmd_proxies)


def _cmd_proxies(args: argparse.Namespace) -> int:
    import tasks

    if args.harvest:
        report = tasks.harvest_proxies_now()
        print(json.dumps(report, sort_keys=True) if args.json else _format_report(report))
        return 0 if report["status"] in ("done", "skipped") else 1
    listing = tasks.proxy_pool()
    print(json.dumps(listing, sort_keys=True) if args.json else format_pool(listing, time.time()))
    return 0


def format_pool(listing: dict[str, Any], now: float) -> str:
    """The pool as a table, then the proxies cooling off.

    >>> print(format_pool({"harvested": [{"proxy": "http://203.0.113.7:8080", "latency_s": 0.1234,
    ...     "anonymity": "elite", "source": "https://lists.example/p", "checked_at": 100.0}],
    ...     "cooling": {"http://203.0.113.7:8080": 41.5}}, now=160.0))
    PROXY                    LATENCY  ANONYMITY  CHECKED   SOURCE
    http://203.0.113.7:8080  0.123 s  elite      60 s ago  https://lists.example/p
    1 harvested proxies; cooling off: http://203.0.113.7:8080 (41.5 s left)
    """
    rows = [("PROXY", "LATENCY", "ANONYMITY", "CHECKED", "SOURCE")]
    for entry in listing["harvested"]:
        age = max(0.0, now - entry["checked_at"])
        rows.append((entry["proxy"], f"{entry['latency_s']:.3f} s", entry["anonymity"] or "-", f"{age:.0f} s ago",
                     entry["source"] or "-"))  # fmt: skip
    lines = aligned(rows)
    cooling = ", ".join(f"{name} ({left:g} s left)" for name, left in sorted(listing["cooling"].items()))
    lines.append(f"{len(listing['harvested'])} harvested proxies; cooling off: {cooling or 'none'}")
    return "\n".join(lines)


def _format_report(report: dict[str, Any]) -> str:
    if report["status"] != "done":
        return f"harvest {report['status']}{': ' + report['problem'] if report['problem'] else ''}"
    sources = ", ".join(f"{url}: {read}" for url, read in report["sources"].items())
    return (f"harvest done: {report['checked']} checked, rejected {report['rejected'] or 'none'}; "
            f"{len(report['pool'])} in the pool ({len(report['joined'])} joined, {len(report['dropped'])} dropped)\n"
            f"sources: {sources}")  # fmt: skip
