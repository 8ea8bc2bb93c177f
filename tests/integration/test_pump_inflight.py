"""How many batches of a job a pump keeps in flight: a quarter of the cap while this process's requests are
answered at once, all of it once they wait (``engine.pump.inflight_cap``). A real Redis; the pump's
dispatch only collects what it leased."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis

import tasks
from cli.local_redis import LocalRedis
from engine.answer_times import AnswerTimes
from engine.jobs import lease_ms, start
from engine.pump import FrontierPump
from engine.runtime_cache import RuntimeCache
from frontier import Frontier
from frontier.queue import RENEWAL_HOLDS_S
from vcrawl.settings import Settings


def _leased_in_flight(tmp_path: Path, answer_times: AnswerTimes) -> int:
    with LocalRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        frontier = Frontier(client)
        settings = Settings(redis_url=server.url, data=str(tmp_path / "data"))  # the shipped limits and cap
        runtimes = RuntimeCache(frontier, settings, tasks.deps.session(), client)
        seeds = [f"http://h{n}.example/" for n in range(300)]  # one batch each: more hosts than any cap
        job = tasks.JobSpec.from_dict({"seeds": seeds, "politeness": {"min_interval_s": 0}})
        start(job, frontier, runtimes, tasks.deps.fetchers())
        leased: list[Any] = []
        pump = FrontierPump(frontier, runtimes, lambda _job, batches, _producer: leased.extend(batches), settings,
                            answer_times=answer_times)  # fmt: skip
        for _ in range(20):  # a call leases 32 batches at most; the cap stops it
            pump.pump_once()
        return len(leased)


def test_a_pump_keeps_a_quarter_of_its_cap_in_flight_while_answers_come_at_once_and_all_of_it_when_they_wait(
    tmp_path: Path,
) -> None:
    assert Settings().frontier_inflight == 128  # shipped: what _leased_in_flight's pump runs with
    quick, slow = AnswerTimes(), AnswerTimes()
    for _ in range(200):
        quick.add(0.002)
        slow.add(0.1)
    assert _leased_in_flight(tmp_path / "quick", quick) == 36  # 32 and a little for 2 ms
    assert _leased_in_flight(tmp_path / "slow", slow) == 128


def test_batches_whose_dispatch_fails_go_back_to_the_frontier_at_once(tmp_path: Path) -> None:
    """A broker that stays away past the publish retries: the leased batches are handed back, not held
    until their leases run out (minutes); the next round leases them again."""
    with LocalRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        frontier = Frontier(client)
        settings = Settings(redis_url=server.url, data=str(tmp_path / "data"))
        runtimes = RuntimeCache(frontier, settings, tasks.deps.session(), client)
        job = tasks.JobSpec.from_dict({"seeds": [f"http://h{n}.example/" for n in range(5)],
                                       "politeness": {"min_interval_s": 0}})  # fmt: skip
        job_id = start(job, frontier, runtimes, tasks.deps.fetchers())
        tries: list[list[str]] = []

        def broker_away(_job: str, batches: list[Any], _producer: Any) -> None:
            tries.append(sorted(batch.host for batch in batches))
            raise ConnectionError("the broker is away")

        pump = FrontierPump(frontier, runtimes, broker_away, settings)
        try:
            pump.pump_once()
        except ConnectionError:
            pass
        assert frontier.queue.in_flight(job_id) == 0  # nothing held leased
        time.sleep(RENEWAL_HOLDS_S + 0.1)  # each host waits its interval (0 here) and the renewal hold
        sent: list[Any] = []
        FrontierPump(frontier, runtimes, lambda _job, batches, _producer: sent.extend(batches), settings).pump_once()
    assert len(tries) == 1 and len(tries[0]) == 5
    assert sorted(batch.host for batch in sent) == tries[0]  # the same hosts, leased again at once
    assert lease_ms(runtimes.get(job_id, 0)) >= 60_000  # not after their leases (minutes)
