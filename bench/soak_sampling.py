"""The soak's time series (bench/soak.py): pages/s, worker RSS and Redis memory per sample, and what it says.

A sample reads the jobs' counters, the universe's access log, /proc (VmRSS of each worker's
process tree, children included) and Redis (``INFO memory``/``persistence``, keys, the download
queue). The verdicts compare the first and the last window of the series: RSS growth per worker,
Redis memory left behind per job.
"""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path
from typing import Any

from celeryconfig import DOWNLOAD_QUEUE, queue_lists

MIB = 1024 * 1024


class Sampler:
    """Takes the samples of one soak: rates since the previous sample, memory now."""

    def __init__(self, redis: Any, worker_pids: list[int], log_path: Path) -> None:
        self.redis, self.worker_pids, self.log_path = redis, worker_pids, log_path
        self.samples: list[dict[str, Any]] = []
        self.log_offset = 0
        self._last: tuple[float, int, int] = (0.0, 0, 0)  # time, pages fetched, log size

    def start(self) -> None:
        """Mark where the soak's requests start in the access log (time 0, nothing fetched)."""
        self.log_offset = self.log_path.stat().st_size
        self._last = (0.0, 0, self.log_offset)

    def take(self, now: float, running: int, ended: int, fetched: int) -> dict[str, Any]:
        """Append and return the sample at ``now`` (seconds since the soak began)."""
        log_size = self.log_path.stat().st_size
        last_t, last_fetched, last_log = self._last
        dt = max(now - last_t, 1e-6)
        kids = _children_map()
        memory, persistence = self.redis.info("memory"), self.redis.info("persistence")
        sample = {
            "t_s": round(now, 1),
            "running": running,
            "ended": ended,
            "pages_fetched": fetched,
            "pages_per_s": round((fetched - last_fetched) / dt, 1) if now > 0 else 0.0,
            "requests_per_s": round(_count_lines(self.log_path, last_log, log_size) / dt, 1) if now > 0 else 0.0,
            "worker_rss_mib": [round(_tree_rss_kib(pid, kids) / 1024, 1) for pid in self.worker_pids],
            "workers_alive": sum(is_alive(pid) for pid in self.worker_pids),
            "redis_used_mib": round(memory["used_memory"] / MIB, 2),
            "redis_rss_mib": round(memory["used_memory_rss"] / MIB, 2),
            "redis_keys": self.redis.dbsize(),
            "aof_mib": round(persistence.get("aof_current_size", 0) / MIB, 2),
            "download_queue": sum(self.redis.llen(key) for key in queue_lists(DOWNLOAD_QUEUE)),
            "load1": float(Path("/proc/loadavg").read_text().split()[0]),
        }
        self.samples.append(sample)
        self._last = (now, fetched, log_size)
        return sample


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return kids


def _tree_rss_kib(root: int, kids: dict[int, list[int]]) -> int:
    """VmRSS of ``root`` and all its descendants, in KiB."""
    total, todo, seen = 0, [root], set()
    while todo and len(seen) < 1000:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo += kids.get(pid, [])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        total += int(match.group(1)) if match else 0
    return total


def is_alive(pid: int) -> bool:
    """True if the process exists and is neither a zombie nor dead."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _count_lines(path: Path, start: int, end: int) -> int:
    with open(path, "rb") as log:
        log.seek(start)
        return log.read(max(0, end - start)).count(b"\n")


def quantiles(values: list[float]) -> dict[str, float] | None:
    """p10, p50, p90 and max of sorted ``values`` (None when empty)."""
    if not values:
        return None
    at = [values[min(len(values) - 1, int(q * len(values)))] for q in (0.1, 0.5, 0.9)]
    return {"p10": at[0], "p50": at[1], "p90": at[2], "max": values[-1]}


def _windows(samples: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """The first and the last window of the samples after the idle baseline (60 s, or a quarter of the run)."""
    loaded = [s for s in samples if s["t_s"] > 0]
    end = loaded[-1]["t_s"] if loaded else 0.0
    window = min(60.0, end / 4)
    return [s for s in loaded if s["t_s"] <= window], [s for s in loaded if s["t_s"] >= end - window], window


def rss_verdict(samples: list[dict[str, Any]], bound_pct: float, bound_mib: float) -> dict[str, Any]:
    """Per worker, median RSS of the first and the last window; growth beyond either bound is flagged."""
    first, last, window = _windows(samples)
    if not first or not last:
        return {"verdict": "not enough samples"}
    workers = []
    for index in range(len(samples[0]["worker_rss_mib"])):
        before = statistics.median(s["worker_rss_mib"][index] for s in first)
        after = statistics.median(s["worker_rss_mib"][index] for s in last)
        growth = after - before
        flagged = growth > bound_mib or growth > before * bound_pct / 100
        workers.append(
            {
                "first_mib": before,
                "last_mib": after,
                "growth_mib": round(growth, 1),
                "growth_pct": round(100 * growth / max(before, 1e-6), 1),
                "flagged": flagged,
            }
        )
    totals = [(s["t_s"] / 60, sum(s["worker_rss_mib"])) for s in samples if s["t_s"] > window]
    flagged = [i for i, w in enumerate(workers) if w["flagged"]]
    text = (
        f"GROWTH beyond +{bound_pct:g} % or +{bound_mib:g} MiB in worker(s) {flagged}"
        if flagged
        else f"OK: no worker grew beyond +{bound_pct:g} % or +{bound_mib:g} MiB"
    )
    return {
        "verdict": text,
        "window_s": round(window, 1),
        "workers": workers,
        "idle_mib": samples[0]["worker_rss_mib"],
        "max_total_mib": max(sum(s["worker_rss_mib"]) for s in samples),
        "slope_mib_per_min_after_first_window": _slope(totals),
    }


def _slope(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in points) / var, 2) if var else None


def redis_summary(samples: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    """Redis memory at the start, the end and its peak, and what is left per job."""
    start, end = samples[0], samples[-1]
    return {
        "used_mib_start": start["redis_used_mib"],
        "used_mib_end": end["redis_used_mib"],
        "used_mib_max": max(s["redis_used_mib"] for s in samples),
        "rss_mib_max": max(s["redis_rss_mib"] for s in samples),
        "used_kib_left_per_job": round((end["redis_used_mib"] - start["redis_used_mib"]) * 1024 / jobs, 1),
        "keys_end": end["redis_keys"],
        "aof_mib_end": end["aof_mib"],
    }


def redis_key_groups(client: Any, limit: int = 200_000) -> dict[str, list[int]]:
    """Key pattern -> [keys, bytes (MEMORY USAGE)], job ids and per-host parts folded."""
    groups: dict[str, list[int]] = {}
    batch: list[str] = []

    def flush() -> None:
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.memory_usage(key, samples=0)
        for key, used in zip(batch, pipe.execute(), strict=True):
            pattern = re.sub(r"\{[^}]*\}", "{job}", key)
            pattern = re.sub(r":(q|stats|bloom|robots|task|gate|free|busy):.*", r":\1:*", pattern)
            pattern = re.sub(r"^(celery-task-meta-|_kombu\.binding\.).*", r"\1*", pattern)
            group = groups.setdefault(pattern, [0, 0])
            group[0] += 1
            group[1] += int(used or 0)
        batch.clear()

    for count, key in enumerate(client.scan_iter(count=1000)):
        if count >= limit:
            break
        batch.append(key)
        if len(batch) >= 500:
            flush()
    if batch:
        flush()
    return dict(sorted(groups.items(), key=lambda item: -item[1][1]))
