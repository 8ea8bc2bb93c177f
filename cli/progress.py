"""Following a job: the progress line while it runs, and the summary at its end."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vcrawl import names
from views.status import JobStatus

__all__ = ["OUTPUTS_WAIT_S", "RunSummary", "follow", "redis_cost", "report", "summary_of", "wait_for_outputs"]

OUTPUTS_WAIT_S = 30.0
"""How long ``vcrawl submit --wait`` waits, after the job ends, for its output to be in storage."""

_SUMMARY_KEYS = (
    "job", "state", "pages_fetched", "pages_stored", "failed", "robots_blocked", "filtered", "duplicates",
    "links_truncated", "bytes", "analysed", "records", "analysis_failed", "redirects", "retries", "admitted", "hosts",
)  # fmt: skip


_FOLLOW_S = 0.1  # how often a run looks at its job's state: its end is seen this much late at most
_PROGRESS_S = (0.25, 2.0)  # how often the whole status is read for the progress line: on a terminal, else


def follow(
    job_id: str, timeout_s: float | None, interrupted: Callable[[], bool] = lambda: False
) -> dict[str, Any] | None:
    """Show progress until the job ends (its status) or ``interrupted()`` (None); cancel it after ``timeout_s``."""
    import tasks

    deadline = time.monotonic() + timeout_s if timeout_s is not None else float("inf")
    tty = sys.stderr.isatty()
    last_print, last = 0.0, ""
    next_status = 0.0  # the state alone in between: one Redis read, not the counters of every host
    while not interrupted():
        now = time.monotonic()
        if now >= next_status or tasks.job_state(job_id) != names.STATE_RUNNING:
            status = tasks.job_status(job_id, with_outputs=False) or {}  # no store listing on every look
            if status.get("state") != names.STATE_RUNNING:
                if tty:
                    print(file=sys.stderr)
                return status
            next_status = now + _PROGRESS_S[0 if tty else 1]
            elapsed = max(status["elapsed_s"], 0.001)
            line = (
                f"pages {status['pages_stored']} ({status['pages_stored'] / elapsed:.1f}/s), "
                f"queued {status['queued']}, in flight {status['in_flight_batches']}, "
                f"failed {sum(status['failed'].values())}, robots-blocked {status['robots_blocked']}, "
                f"hosts {status['hosts']}"
            )
            if tty:
                print(f"\r{line}   ", end="", file=sys.stderr, flush=True)
            elif line != last and now - last_print >= 2.0:
                print(line, file=sys.stderr)
                last_print, last = now, line
        if now > deadline:
            tasks.cancel_job(job_id)
            print(f"\ntimeout: job {job_id} cancelled after {timeout_s}s", file=sys.stderr)
            deadline = float("inf")
        time.sleep(_FOLLOW_S)
    return None


def wait_for_outputs(
    job_id: str, status: dict[str, Any], wait_s: float = OUTPUTS_WAIT_S, poll_s: float = 0.2
) -> dict[str, Any]:
    """Wait until no worker process holds output of the finished job (``outputs_pending`` 0), at most
    ``wait_s``; return its status then (with ``outputs``, the files in storage)."""
    import tasks

    deadline = time.monotonic() + wait_s
    while status.get("outputs_pending") and time.monotonic() < deadline:
        time.sleep(poll_s)
        status = tasks.job_status(job_id, with_outputs=False) or status
    return tasks.job_status(job_id) or status


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


@dataclass(frozen=True)
class RunSummary:
    """What a run of a job came to: its status's counters, its time and where its output went.

    ``to_dict`` is the JSON object ``vcrawl crawl --json`` and ``vcrawl submit --wait --json`` print last.
    """

    status: JobStatus
    elapsed_s: float
    data_dir: str
    redis: Mapping[str, float] | None = None  # a private Redis's cost of the run (see ``redis_cost``)

    @property
    def state(self) -> str | None:
        """The job's state at the end."""
        return self.status.state

    @property
    def job_dir(self) -> str:
        """Where the job's pages, records and WARC files are."""
        return f"{self.data_dir.rstrip('/')}/jobs/{self.status.job}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        full = self.status.to_dict()
        data = {key: full.get(key) for key in _SUMMARY_KEYS}
        if self.status.error is not None:
            data["error"] = self.status.error
        data.update(pages_failed=sum(self.status.failed.values()), elapsed_s=round(self.elapsed_s, 3),
                    data_dir=self.data_dir, job_dir=self.job_dir)  # fmt: skip
        if self.redis is not None:
            data["redis"] = dict(self.redis)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """Read the JSON form back (its status holds the summary's counters only)."""
        status = JobStatus.from_dict({**data, "seeds": (), "created_at": 0.0, "finished_at": None,
                                      "elapsed_s": data["elapsed_s"]})  # fmt: skip
        return cls(status, float(data["elapsed_s"]), str(data["data_dir"]), data.get("redis"))


def summary_of(status: Mapping[str, Any], elapsed_s: float, data_dir: str) -> RunSummary:
    """The run summary of a job's final status."""
    return RunSummary(JobStatus.from_dict(status), elapsed_s, data_dir)


def report(summary: RunSummary, as_json: bool) -> None:
    """Print the summary (and, with ``as_json``, the JSON object as the last stdout line)."""
    status = summary.status
    failed = ", ".join(f"{reason} {n}" for reason, n in sorted(status.failed.items())) or "none"
    filtered = ", ".join(f"{reason} {n}" for reason, n in sorted(status.filtered.items())) or "none"
    if status.links_truncated:  # links past a page's max_links_per_page, never read
        filtered += f"; links truncated {status.links_truncated}"
    print(
        f"job {status.job} {status.state}: {status.pages_stored} pages stored of "
        f"{status.pages_fetched} fetched, {status.analysed} analysed, {status.records} records, "
        f"{status.bytes} bytes in {round(summary.elapsed_s, 3)} s\n"
        f"failed: {failed}; robots-blocked {status.robots_blocked}; duplicates {status.duplicates}\n"
        f"filtered links: {filtered}\n"
        f"pages and results are under {summary.job_dir}"
    )
    if status.error is not None:
        print(f"error: {status.error}")
    if summary.redis:
        cost, pages = summary.redis, max(1, status.pages_fetched or 0)
        print(
            f"redis: {cost['requests']} requests ({cost['requests'] / pages:.1f} per page fetched), "
            f"{cost['commands']} commands, {cost['cpu_s']} s CPU ({1000 * cost['cpu_s'] / pages:.2f} ms per page)"
        )
    if as_json:
        print(json.dumps(summary.to_dict(), sort_keys=True))
