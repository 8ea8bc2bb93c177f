"""A job's statistics by UTC day, as ``vcrawl stats JOB --by day --json`` and ``GET /api/jobs/{id}/daily`` give them.

The frontier's release script counts a fetch batch's pages, bytes and final failures into the job's
and the host's bucket of the day in the same step as its status counters, so a job's days add up to
its ``vcrawl status`` (a scheduled job's days span its cycles; its status counts the current cycle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from frontier import Frontier
from frontier.statistics import DayStats
from vcrawl import names

__all__ = ["MAX_DAYS", "daily_report", "day_entry", "host_entry", "job_daily"]

MAX_DAYS = 3660
"""The longest window asked for (days kept: ``VCRAWL_STATS_RETENTION_DAYS``)."""


def day_entry(day: str, counters: Mapping[str, int]) -> dict[str, Any]:
    """One day of a job: pages fetched and stored, bytes, final failures by reason, new/changed/unchanged pages.

    >>> day_entry("2026-11-26", {"fetched": 3, "stored": 2, "bytes": 10, "failed:http_404": 1})["failed"]
    {'http_404': 1}
    """
    return {
        "day": day,
        "pages_fetched": int(counters.get(names.COUNTER_FETCHED, 0)),
        "pages_stored": int(counters.get(names.COUNTER_STORED, 0)),
        "bytes": int(counters.get(names.COUNTER_BYTES, 0)),
        "failed": _failures(counters),
        "new": int(counters.get(names.COUNTER_NEW, 0)),
        "changed": int(counters.get(names.COUNTER_CHANGED, 0)),
        "unchanged": int(counters.get(names.COUNTER_UNCHANGED, 0)),
    }


def host_entry(day: str, counts: Mapping[str, int]) -> dict[str, Any]:
    """One day of one host in a job: pages fetched and stored, bytes, final failures (all reasons).

    >>> host_entry("2026-11-26", {"fetched": 4, "stored": 3, "bytes": 99, "failed": 1})
    {'day': '2026-11-26', 'pages_fetched': 4, 'pages_stored': 3, 'bytes': 99, 'failed': 1}
    """
    return {
        "day": day,
        "pages_fetched": int(counts.get("fetched", 0)),
        "pages_stored": int(counts.get("stored", 0)),
        "bytes": int(counts.get("bytes", 0)),
        "failed": int(counts.get("failed", 0)),
    }


def daily_report(job_id: str, rows: Sequence[DayStats], host: str | None = None) -> dict[str, Any]:
    """The JSON form: every day of the window (oldest first) and, per host, the days it had any.

    ``host``: only that host under ``hosts``. ``totals`` sums the window.

    >>> report = daily_report("j", [("2026-11-25", {}, {}), ("2026-11-26", {"fetched": 2, "failed:timeout": 1},
    ...                             {"a.test": {"fetched": 2, "stored": 0, "bytes": 0, "failed": 1}})])
    >>> [day["pages_fetched"] for day in report["days"]], report["totals"]["failed"], list(report["hosts"])
    ([0, 2], {'timeout': 1}, ['a.test'])
    """
    days = [day_entry(day, counters) for day, counters, _ in rows]
    hosts: dict[str, list[dict[str, Any]]] = {}
    for day, _, by_host in rows:
        for name, counts in sorted(by_host.items()):
            if (host is None or name == host) and any(counts.values()):
                hosts.setdefault(name, []).append(host_entry(day, counts))
    return {"job": job_id, "by": "day", "days": days, "hosts": hosts, "totals": _totals(days)}


def job_daily(frontier: Frontier, job_id: str, days: int, now: float, host: str | None = None) -> dict[str, Any] | None:
    """A job's last ``days`` UTC days (``daily_report``), or None if the job is unknown."""
    if not frontier.jobs.raw_state(job_id):
        return None
    return daily_report(job_id, frontier.stats.daily(job_id, min(max(1, days), MAX_DAYS), now), host)


def _failures(counters: Mapping[str, int]) -> dict[str, int]:
    prefix = names.PREFIX_FAILED
    return {name.removeprefix(prefix): int(n) for name, n in sorted(counters.items()) if name.startswith(prefix) and n}


def _totals(days: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {key: sum(day[key] for day in days) for key in
                              ("pages_fetched", "pages_stored", "bytes", "new", "changed", "unchanged")}  # fmt: skip
    failed: dict[str, int] = {}
    for day in days:
        for reason, count in day["failed"].items():
            failed[reason] = failed.get(reason, 0) + count
    totals["failed"] = dict(sorted(failed.items()))
    return totals
