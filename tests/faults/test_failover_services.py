"""Flower and the job API keep answering across a Redis failover (Sentinel): real processes.

A primary, a replica and three Sentinels (tests/sentinel_cluster.py), a worker, Flower (`vcrawl
flower`) and the job API (`vcrawl serve`), each given only the Sentinels' addresses, at vcrawl's
shipped settings. A thread per check asks every quarter second; the primary is SIGKILLed. Each must
answer correctly again within the failover time: the promotion, plus the moment a client needs to
notice the old connection is dead and reconnect (``ANSWER_SLACK_S``).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests

from tests.cluster import REPO, cluster_env, stop_worker
from tests.faults.test_failover import PROMOTION_LIMIT_S, Note, sentinel_settings
from tests.faults.test_faults import stop_gracefully
from tests.ports import free_port
from tests.sentinel_cluster import SentinelCluster, start_sentinel_worker

pytestmark = [pytest.mark.slow, pytest.mark.faults]

TOKEN = "failover-test-token-0123"
FLOWER_AUTH = ("ops", "failover-pass")
ANSWER_SLACK_S = 3.0  # after the promotion: a poll period, a client timeout and a reconnect
PROBE_EVERY_S = 0.25


class Prober:
    """Asks each HTTP check in a thread of its own and keeps (asked, answered, ok, detail) per check.

    One thread per check, so a check's gaps are its own service's. With one thread for all three, the
    queue check once had a 6.4 s gap after the kill with no request failing (make test-faults): it was
    not asked while the checks before it waited out their timeouts.
    """

    def __init__(self, checks: dict[str, Callable[[requests.Session], bool]]) -> None:
        self.checks = checks
        self.results: dict[str, list[tuple[float, float, bool, str]]] = {name: [] for name in checks}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(name,), name=f"failover-prober-{name}", daemon=True)
            for name in checks
        ]

    def _run(self, name: str) -> None:
        check = self.checks[name]
        with requests.Session() as http:
            http.trust_env = False  # loopback only
            while not self._stop.is_set():
                asked = time.monotonic()
                try:
                    ok, detail = check(http), ""
                except (requests.RequestException, ValueError, KeyError) as error:  # no answer, or a wrong one
                    ok, detail = False, f"{type(error).__name__}: {error}"[:200]
                self.results[name].append((asked, time.monotonic(), ok, detail))
                self._stop.wait(PROBE_EVERY_S)

    def __enter__(self) -> Prober:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def outage(self, name: str, since: float) -> tuple[float, str]:
        """The longest stretch from ``since`` on without a good answer received (a slow answer counts
        from when it came), and why the last request that failed after ``since`` failed."""
        good = [answered for _, answered, ok, _ in self.results[name] if ok and answered >= since]
        why = [detail for asked, _, ok, detail in self.results[name] if asked >= since and not ok]
        return max((b - a for a, b in itertools.pairwise([since, *good])), default=0.0), (why or [""])[-1]

    def answered_after(self, name: str, at: float) -> bool:
        return any(ok for asked, _, ok, _ in self.results[name] if asked > at)

    def wait_all_answer(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(self.answered_after(name, 0) for name in self.checks):
            if time.monotonic() > deadline:
                raise AssertionError(f"not answering within {timeout_s}s: {self.results}")
            time.sleep(0.2)


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, *command], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip


def test_flower_and_the_job_api_answer_again_within_the_failover_time(tmp_path: Path, fault_report: Note) -> None:
    with ExitStack() as stack:
        cluster = stack.enter_context(SentinelCluster(tmp_path / "ha"))
        env = cluster_env(sentinel_settings(cluster, tmp_path / "data"))
        worker = start_sentinel_worker(env, "services", tmp_path / "worker.log", concurrency=2)
        stack.callback(stop_worker, worker)
        flower_port, api_port = free_port(), free_port()
        for process in (
            _start(["-m", "cli", "flower", "--port", str(flower_port)],
                   {**env, "FLOWER_BASIC_AUTH": ":".join(FLOWER_AUTH)}, tmp_path / "flower.log"),
            _start(["-m", "cli", "serve", "--port", str(api_port)], {**env, "VCRAWL_API_TOKEN": TOKEN},
                   tmp_path / "api.log"),
        ):  # fmt: skip
            stack.callback(stop_gracefully, process)
        flower, api = f"http://127.0.0.1:{flower_port}", f"http://127.0.0.1:{api_port}"

        def flower_lists_the_worker(http: requests.Session) -> bool:  # a broadcast through the broker
            answer = http.get(f"{flower}/api/workers", params={"refresh": "1"}, auth=FLOWER_AUTH, timeout=3)
            return answer.status_code == 200 and any(name.startswith("services@") for name in answer.json())

        def flower_reads_the_queues(http: requests.Session) -> bool:  # queue lengths, from the broker
            answer = http.get(f"{flower}/api/queues/length", auth=FLOWER_AUTH, timeout=3)
            return answer.status_code == 200 and "active_queues" in answer.json()

        def api_lists_the_jobs(http: requests.Session) -> bool:  # from vcrawl's own Redis client
            answer = http.get(f"{api}/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=3)
            return answer.status_code == 200 and isinstance(answer.json(), (list, dict))

        probes = {"flower": flower_lists_the_worker, "flower_queues": flower_reads_the_queues,
                  "api": api_lists_the_jobs}  # fmt: skip
        with Prober(probes) as prober:
            prober.wait_all_answer(60)
            killed_at = time.monotonic()
            old = cluster.kill_primary()
            _, promotion_s = cluster.wait_promotion(old, PROMOTION_LIMIT_S)
            deadline = time.monotonic() + ANSWER_SLACK_S + 15
            while not all(prober.answered_after(name, killed_at + promotion_s) for name in probes):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            time.sleep(2.0)  # a few answers after the first good one: they keep coming
        outages = {name: prober.outage(name, killed_at) for name in probes}
        fault_report(fault="primary SIGKILLed under Flower and the job API", promotion_s=round(promotion_s, 2),
                     **{f"{name}_unanswered_s": round(out, 2) for name, (out, _) in outages.items()})  # fmt: skip
    problems = [
        f"{name} unanswered {out:.1f}s after the kill (promotion {promotion_s:.1f}s): {why}"
        for name, (out, why) in outages.items()
        if not prober.answered_after(name, killed_at + promotion_s) or out > promotion_s + ANSWER_SLACK_S
    ]
    assert not problems, problems
