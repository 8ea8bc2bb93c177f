"""What bench/soak.py prints: the table over time, a row per sample, and the closing report and JSON line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from soak_sampling import MIB

_COLUMNS = (
    ("t_s", "t s", 6),
    ("running", "run", 4),
    ("ended", "ended", 5),
    ("pages_per_s", "pages/s", 8),
    ("requests_per_s", "req/s", 7),
    ("worker_rss_mib", "worker RSS MiB", 16),
    ("redis_used_mib", "redis MiB", 9),
    ("redis_rss_mib", "redis RSS", 9),
    ("redis_keys", "keys", 6),
    ("download_queue", "queue", 6),
    ("load1", "load1", 5),
)


def print_row(sample: dict[str, Any], header: bool) -> None:
    """Print one sample as a row of the table over time (after the header when ``header``)."""
    if header:
        print(" ".join(f"{title:>{width}}" for _, title, width in _COLUMNS), flush=True)
    cells = []
    for key, _, width in _COLUMNS:
        value = sample[key]
        text = "/".join(f"{v:.0f}" for v in value) if isinstance(value, list) else f"{value:g}"
        cells.append(f"{text:>{width}}")
    print(" ".join(cells), flush=True)


def print_report(args: argparse.Namespace, report: dict[str, Any], work: Path) -> int:
    """Print the job table and the verdicts, write the time series, print the JSON line; the exit code."""
    soak_args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    server = report["server_check"]
    print(f"\n{'job':>22} {'start s':>7} {'end s':>7} {'state':>9} {'stored':>6} {'recall':>6} {'missing':>7} failed")
    for job in report["jobs"]:
        failed = ",".join(f"{reason}:{n}" for reason, n in sorted((job["failed"] or {}).items())) or "-"
        print(
            f"{job['job']:>22} {job['started_s']:>7} {job['ended_s']!s:>7} {job['state']!s:>9} "
            f"{job['pages_stored']!s:>6} {job.get('recall', '-')!s:>6} {job.get('missing', '-')!s:>7} {failed}"
        )
    print(f"\nRSS: {report['rss']['verdict']}")
    for index, worker in enumerate(report["rss"].get("workers", [])):
        print(
            f"  worker {index}: {worker['first_mib']} -> {worker['last_mib']} MiB "
            f"({worker['growth_mib']:+} MiB, {worker['growth_pct']:+} %)"
        )
    print(
        f"jobs: {report['jobs_started']} started, {report['jobs_completed']} completed, "
        f"{report['jobs_complete_with_full_recall']} complete with full recall (min recall {report['recall_min']}); "
        f"server: {server['page_fetches_200']} page fetches (expected "
        f"{server['expected_if_each_job_fetches_each_page_once']}), robots violations {server['robots_violations']}"
    )
    print(
        "Redis at the end, largest key groups: "
        + "; ".join(
            f"{pattern} x{count} = {used / MIB:.1f} MiB"
            for pattern, (count, used) in list(report["redis_key_groups_end"].items())[:4]
        )
    )
    print(f"worker logs: {work / 'logs'}")
    args.out.write_text(json.dumps({"args": soak_args, **report}, indent=1))
    print(f"time series: {args.out}")
    final = {
        "label": "soak",
        **{k: soak_args[k] for k in ("duration", "jobs", "workers", "threads", "hosts", "pages", "delay")},
        **{k: v for k, v in report.items() if k not in ("samples", "jobs", "redis_key_groups_end")},
        "series_file": str(args.out),
    }
    print(json.dumps(final), flush=True)
    ok = report["jobs_complete_with_full_recall"] == report["jobs_started"] and not report["timed_out"]
    return 0 if ok else 1
