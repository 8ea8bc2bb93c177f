"""Redis behind Sentinel loses its primary: beat goes on firing across the failover.

Real processes on loopback (tests/sentinel_cluster.py): a Redis primary, one replica and three
Sentinels (quorum 2, down-after 2 s). vcrawl runs with its shipped settings (only the data folder
and the Sentinel addresses are set). The crawl-under-failover tests (a job with the primary
SIGKILLed, the fail-back, Flower) are on branch failover-pending: a message a worker held when the
connection broke waits out the visibility timeout in kombu's unacked hash, so the job's completion
depends on lease expiry and is not yet reliable (issue 22's orphaned messages).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import REPO, cluster_env
from tests.faults.test_faults import page, stop_gracefully
from tests.sentinel_cluster import SentinelCluster
from tests.site import TestSite
from vcrawl.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.faults]

HOSTS = ("127.0.0.2",)
PROMOTION_LIMIT_S = 30.0
Note = Callable[..., None]  # the fault_report fixture (tests/faults/conftest.py)


def sentinel_settings(cluster: SentinelCluster, data: Path, **overrides: Any) -> Settings:
    """vcrawl's shipped defaults, pointed at the Sentinels."""
    return Settings(redis_url=cluster.url, redis_sentinel_master=cluster.master_name, data=str(data), **overrides)


EVERY_S = 2.0


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, *command], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip


def _sent(log: Path) -> list[float]:
    """When beat sent each firing (its log's clock, seconds of the day)."""
    times = []
    for line in log.read_text(errors="replace").splitlines():
        if "Sending due task news" in line:
            clock = line.split(",", 1)[0].rsplit(" ", 1)[-1]
            hours, minutes, seconds = (float(part) for part in clock.split(":"))
            times.append(hours * 3600 + minutes * 60 + seconds)
    return times


def test_beat_goes_on_firing_across_a_failover(tmp_path: Path, fault_report: Note) -> None:
    """RedBeat extends its lock at every tick; the failover's connection error used to leave Celery's
    beat loop and end beat for good (tasks/beat.py). Beat, at its shipped settings, keeps firing."""
    with ExitStack() as stack:
        cluster = stack.enter_context(SentinelCluster(tmp_path / "ha"))
        site = stack.enter_context(TestSite(HOSTS[0]))
        site.add_page("/", page())
        schedules = tmp_path / "schedules.yaml"
        news = {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}, "sitemaps": False}
        schedules.write_text(yaml.safe_dump({"schedules": [{"name": "news", "every": EVERY_S, "job": news}]}))
        env = cluster_env(sentinel_settings(cluster, tmp_path / "data", schedules_file=str(schedules)))
        beat_log = tmp_path / "beat.log"
        beat = _start(["-m", "celery", "-A", "tasks", "beat", "-l", "INFO", "--schedule", str(tmp_path / "beat.db")],
                      env, beat_log)  # fmt: skip
        stack.callback(stop_gracefully, beat)
        deadline = time.monotonic() + 40
        while len(_sent(beat_log)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_sent(beat_log)) >= 2, beat_log.read_text()[-2000:]
        before = len(_sent(beat_log))
        old = cluster.kill_primary()
        _, promotion_s = cluster.wait_promotion(old, PROMOTION_LIMIT_S)
        deadline = time.monotonic() + promotion_s + 4 * EVERY_S + 20
        while len(_sent(beat_log)) < before + 3 and time.monotonic() < deadline and beat.poll() is None:
            time.sleep(0.2)
        sent = _sent(beat_log)
        gaps = [later - earlier for earlier, later in itertools.pairwise(sent)]
        fault_report(fault="primary SIGKILLed under beat (RedBeat)", promotion_s=round(promotion_s, 2),
                     firings_after=len(sent) - before, longest_gap_s=round(max(gaps), 2))  # fmt: skip
        assert beat.poll() is None, f"beat exited ({beat.returncode}): {beat_log.read_text()[-3000:]}"
        assert len(sent) - before >= 3, beat_log.read_text()[-3000:]
        assert max(gaps) <= promotion_s + 2 * EVERY_S + 3  # no firing lost beyond the failover
        assert min(gaps) >= EVERY_S / 2  # none sent twice
        assert "Redis unreachable" in beat_log.read_text()  # it did meet the failover
