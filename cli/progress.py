"""Following a job: the progress line while it runs, and the summary at its end."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["follow", "redis_cost", "report", "summary_of"]

_SUMMARY_KEYS = (
    "job", "state", "pages_fetched", "pages_stored", "failed", "robots_blocked", "filtered", "duplicates",
    "bytes", "analysed", "records", "analysis_failed", "redirects", "retries", "admitted", "hosts",
)  # fmt: skip


def follow(
    job_id: str, timeout_s: float | None, interrupted: Callable[[], bool] = lambda: False
) -> dict[str, Any] | None:
    """Show progress until the job ends (its status) or ``interrupted()`` (None); cancel it after ``timeout_s``."""
    import tasks

    deadline = time.monotonic() + timeout_s if timeout_s is not None else float("inf")
    tty = sys.stderr.isatty()
    last_print, last = 0.0, ""
    while not interrupted():
        status = tasks.job_status(job_id) or {}
        if status.get("state") != "running":
            if tty:
                print(file=sys.stderr)
            return status
        elapsed = max(status["elapsed_s"], 0.001)
        line = (
            f"pages {status['pages_stored']} ({status['pages_stored'] / elapsed:.1f}/s), "
            f"queued {status['queued']}, in flight {status['in_flight_batches']}, "
            f"failed {sum(status['failed'].values())}, robots-blocked {status['robots_blocked']}, "
            f"hosts {status['hosts']}"
        )
        now = time.monotonic()
        if tty:
            print(f"\r{line}   ", end="", file=sys.stderr, flush=True)
        elif line != last and now - last_print >= 2.0:
            print(line, file=sys.stderr)
            last_print, last = now, line
        if now > deadline:
            tasks.cancel_job(job_id)
            print(f"\ntimeout: job {job_id} cancelled after {timeout_s}s", file=sys.stderr)
            deadline = float("inf")
        time.sleep(0.25)
    return None


def redis_cost() -> dict[str, float]:
    """Requests (socket reads, so a pipeline or a script is one), commands (with the commands
    scripts ran) and CPU seconds of the private Redis since it started."""
    import tasks

    info = tasks.redis_info()
    return {
        "requests": int(info.get("total_reads_processed", 0)),
        "commands": int(info.get("total_commands_processed", 0)),
        "cpu_s": round(float(info.get("used_cpu_user", 0)) + float(info.get("used_cpu_sys", 0)), 3),
    }


def summary_of(status: dict[str, Any], elapsed_s: float, data_dir: str) -> dict[str, Any]:
    """The run summary: the job's counters plus elapsed time and where the output went."""
    summary = {key: status.get(key) for key in _SUMMARY_KEYS}
    summary["pages_failed"] = sum(status.get("failed", {}).values())
    summary["elapsed_s"] = round(elapsed_s, 3)
    summary["data_dir"] = data_dir
    summary["job_dir"] = f"{data_dir.rstrip('/')}/jobs/{status.get('job')}"
    return summary


def report(summary: dict[str, Any], as_json: bool) -> None:
    """Print the summary (and, with ``as_json``, the JSON object as the last stdout line)."""
    failed = ", ".join(f"{reason} {n}" for reason, n in sorted(summary["failed"].items())) or "none"
    filtered = ", ".join(f"{reason} {n}" for reason, n in sorted(summary["filtered"].items())) or "none"
    print(
        f"job {summary['job']} {summary['state']}: {summary['pages_stored']} pages stored of "
        f"{summary['pages_fetched']} fetched, {summary['analysed']} analysed, {summary['records']} records, "
        f"{summary['bytes']} bytes in {summary['elapsed_s']} s\n"
        f"failed: {failed}; robots-blocked {summary['robots_blocked']}; duplicates {summary['duplicates']}\n"
        f"filtered links: {filtered}\n"
        f"pages and results are under {summary['job_dir']}"
    )
    if summary.get("redis"):
        cost, pages = summary["redis"], max(1, summary["pages_fetched"] or 0)
        print(
            f"redis: {cost['requests']} requests ({cost['requests'] / pages:.1f} per page fetched), "
            f"{cost['commands']} commands, {cost['cpu_s']} s CPU ({1000 * cost['cpu_s'] / pages:.2f} ms per page)"
        )
    if as_json:
        print(json.dumps(summary, sort_keys=True))
