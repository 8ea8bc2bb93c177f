"""The soak's job loop (bench/soak.py): start, replace and drain crawl jobs, check each one's storage, score the run.

Every job crawls the whole universe under its own id; when it ends its recall is checked on its
own storage (file present with the served file's size) and its pages are deleted unless
``--keep-pages``. The server-side check scores all jobs from the universe's access log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import node_cluster as nc
from soak_report import print_row
from soak_sampling import Sampler, quantiles, redis_summary, rss_verdict

import tasks
from storage import page_location

_POLL_S = 1.0


@dataclass
class JobRun:
    """One job of the soak: when it started and ended (seconds since the soak began), what it did."""

    id: str
    started_s: float
    ended_s: float | None = None
    status: dict[str, Any] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)


class Soak:
    """Keeps ``jobs`` jobs running until the duration is used up, sampling as it goes."""

    def __init__(self, args: argparse.Namespace, state: Path, data: Path, worker_pids: list[int]) -> None:
        served = json.loads(state.read_text())
        self.args, self.state, self.data = args, state, data
        self.manifest = json.loads(Path(served["manifest"]).read_text())
        self.expected = _expected_files(self.manifest["reachable_pages"], Path(served["dir"]) / "site")
        self.sampler = Sampler(tasks.deps.redis_client(), worker_pids, Path(served["log"]))
        self.jobs: list[JobRun] = []
        self.began = 0.0
        self.timed_out = False

    @property
    def samples(self) -> list[dict[str, Any]]:
        """The time series so far, one dict per sample."""
        return self.sampler.samples

    def run(self) -> dict[str, Any]:
        """Start, replace and drain jobs; return the run's summary."""
        args = self.args
        self.sampler.start()
        self.began = time.monotonic()
        self._sample()  # idle baseline: workers up, no job yet
        ramp_step_s = min(30.0, args.duration / 10) / args.jobs
        next_sample = args.sample_s
        for _ in range(int(args.timeout / _POLL_S) + args.jobs + 10):  # each round sleeps (ramp: shorter)
            now = self._now()
            if now > args.timeout:
                self._cancel_running()
                break
            self._poll()
            running = sum(job.ended_s is None for job in self.jobs)
            for _ in range(args.jobs - running if now < args.duration else 0):
                if len(self.jobs) < args.jobs and now < len(self.jobs) * ramp_step_s:
                    break  # the first jobs start one by one over the ramp
                self._start_job()
                running += 1
            if not running and now >= args.duration:
                break
            in_ramp = len(self.jobs) < args.jobs
            if now >= next_sample:
                self._sample()
                next_sample += args.sample_s
            time.sleep(_POLL_S if not in_ramp else min(_POLL_S, ramp_step_s))
        if any(job.ended_s is None for job in self.jobs):
            self._cancel_running()
        self._sample()
        return self._summary()

    def _now(self) -> float:
        return time.monotonic() - self.began

    def _start_job(self) -> None:
        job_id = f"soak-{os.getpid()}-{len(self.jobs):03d}"
        tasks.start_job(_job_spec(self.manifest, job_id, self.args))
        self.jobs.append(JobRun(job_id, self._now()))

    def _poll(self) -> None:
        """Refresh running jobs; check and clean up the ones that ended."""
        for job in self.jobs:
            if job.ended_s is not None:
                continue
            job.status = tasks.job_status(job.id) or {}
            if job.status.get("state") not in ("running", "paused"):
                job.ended_s = self._now()
                job.check = _check_storage(self.data, job.id, self.expected)
                if not self.args.keep_pages:
                    shutil.rmtree(self.data / "jobs" / job.id, ignore_errors=True)

    def _cancel_running(self) -> None:
        self.timed_out = True
        running = [job for job in self.jobs if job.ended_s is None]
        for job in running:
            tasks.cancel_job(job.id)
        deadline = time.monotonic() + 15
        while any(job.ended_s is None for job in running) and time.monotonic() < deadline:
            self._poll()
            time.sleep(0.5)

    def _sample(self) -> None:
        sample = self.sampler.take(
            self._now(),
            running=sum(job.ended_s is None for job in self.jobs),
            ended=sum(job.ended_s is not None for job in self.jobs),
            fetched=sum(job.status.get("pages_fetched", 0) for job in self.jobs),
        )
        print_row(sample, header=len(self.samples) == 1)

    def _summary(self) -> dict[str, Any]:
        loaded = [s for s in self.samples if 0 < s["t_s"] and s["running"]]
        rates = sorted(s["pages_per_s"] for s in loaded)
        wall = self.samples[-1]["t_s"]
        completed = [j for j in self.jobs if j.status.get("state") == "completed"]
        full = [j for j in completed if j.check.get("recall") == 1.0 and not j.check.get("size_mismatch")]
        job_walls = [j.ended_s - j.started_s for j in self.jobs if j.ended_s is not None]
        return {
            "wall_s": wall,
            "jobs_started": len(self.jobs),
            "jobs_completed": len(completed),
            "jobs_complete_with_full_recall": len(full),
            "timed_out": self.timed_out,
            "recall_min": min((j.check.get("recall", 0.0) for j in self.jobs), default=None),
            "job_wall_s_median": round(statistics.median(job_walls), 1) if job_walls else None,
            "pages_fetched": self.samples[-1]["pages_fetched"],
            "pages_per_s_overall": round(self.samples[-1]["pages_fetched"] / max(wall, 1e-6), 1),
            "pages_per_s_samples": quantiles(rates),
            "rss": rss_verdict(self.samples, self.args.rss_bound_pct, self.args.rss_bound_mib),
            "redis": redis_summary(self.samples, max(1, len(self.jobs))),
            "reachable_pages": len(self.expected),
        }

    def server_check(self) -> dict[str, Any]:
        """Score the whole soak from the server's access log (after its 1 s flush)."""
        time.sleep(1.3)
        scored = nc.evaluate(self.state, self.sampler.log_offset, None)
        fetches = scored["reachable_fetched"] + scored["duplicate_page_fetches"] + scored["js_only_fetched"]
        complete = sum(j.status.get("state") == "completed" for j in self.jobs)
        return {
            "requests": scored["requests"],
            "robots_violations": scored["robots_violations"],
            "page_fetches_200": fetches,
            "expected_if_each_job_fetches_each_page_once": complete * scored["reachable_pages"],
            "distinct_reachable_fetched": scored["reachable_fetched"],
            "status_counts": scored["status_counts"],
        }

    def job_rows(self) -> list[dict[str, Any]]:
        """Per job: state, timing, counters and the storage check."""
        keys = ("state", "pages_fetched", "pages_stored", "failed", "robots_blocked", "retries", "admitted")
        return [
            {
                "job": j.id,
                "started_s": round(j.started_s, 1),
                "ended_s": j.ended_s and round(j.ended_s, 1),
                **{k: j.status.get(k) for k in keys},
                **j.check,
            }
            for j in self.jobs
        ]


def _job_spec(manifest: dict[str, Any], job_id: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "id": job_id,
        "seeds": manifest["seeds"],
        "max_depth": 1000,
        "max_pages": 10 * len(manifest["reachable_pages"]) + 1000,
        "politeness": {
            "min_interval_s": args.delay,
            "jitter": 0.0,
            "per_host": args.per_host if args.delay == 0 else 1,
        },
        "limits": {"retries": 1},  # the universe's 429/503 traps never recover
        "allowed_networks": [nc.LOOPBACK],  # and never leave loopback
    }


def _expected_files(urls: list[str], site: Path) -> list[tuple[str, int]]:
    """(storage location under a job, size of the universe's file) per reachable URL."""
    expected = []
    for url in urls:
        parts = urlsplit(url)
        path = parts.path.lstrip("/")
        if not path or path.endswith("/"):
            path += "index.html"
        expected.append((page_location(url), (site / (parts.hostname or "") / path).stat().st_size))
    return expected


def _check_storage(data: Path, job_id: str, expected: list[tuple[str, int]]) -> dict[str, Any]:
    """The job's recall from what it stored: files present, with the served file's size."""
    root = data / "jobs" / job_id
    found = mismatched = 0
    for location, size in expected:
        try:
            stored = (root / location).stat().st_size
        except OSError:
            continue
        found += 1
        mismatched += stored != size
    files = sum(len(names) for _, _, names in os.walk(root / "pages"))
    return {
        "recall": round(found / len(expected), 4),
        "missing": len(expected) - found,
        "size_mismatch": mismatched,
        "files": files,
    }
