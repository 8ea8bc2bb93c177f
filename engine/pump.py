"""The frontier pump: a thread in every worker that sends due batches to the download queue.

Any number of pumps may run (one per worker process on every machine): each pump call is
one atomic script, so a URL is leased once however many pumps race. A pump sleeps until
the earliest host is due, or until new URLs are admitted (a wake-up list), never longer
than ``max_sleep_s``. It also requeues the URLs of batches whose lease ran out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.answer_times import ANSWER_TIMES, AnswerTimes
from engine.jobs import lease_ms
from engine.runtime_cache import RuntimeCache
from frontier import Batch, Frontier
from telemetry.alerts import Alert
from vcrawl.errors import VcrawlError
from vcrawl.settings import Settings

__all__ = ["FrontierPump", "inflight_cap"]

logger = logging.getLogger(__name__)

_REDIS_TICK_S = 0.1  # Redis times out blocked clients on its serverCron tick (hz 10 by default)

_RECLAIM_EVERY_S = 5.0
_MAX_BATCHES_PER_CALL = 32
_PACED_BUNDLE_CAP = 8  # batches in flight the pump leases for a paced job whose bundles refill themselves
SLOW_ANSWER_S = 0.05


def inflight_cap(most: int, answer_s: float) -> int:
    """Batches of a job a pump keeps in flight: a quarter of ``most`` while hosts answer at once (more
    batches then are smaller ones, and more threads busy at once: CPU, not speed; U20 clean took 1.87
    ms/page with 128, 1.77 with 64, 1.69 with 32), up to all of it as answers take ``SLOW_ANSWER_S``
    (threads wait then: at 100 ms, 380 pages/s with 64, 590 with 128).

    >>> inflight_cap(128, 0.002), inflight_cap(128, 0.01), inflight_cap(128, 0.05), inflight_cap(1, 0.0)
    (36, 51, 128, 1)
    """
    quarter = max(1, most // 4)
    return min(most, round(quarter * (1 + 3 * answer_s / SLOW_ANSWER_S)))


class FrontierPump:
    """Lease due batches of every running job and hand them to ``dispatch``."""

    def __init__(
        self,
        frontier: Frontier,
        runtimes: RuntimeCache,
        dispatch: Callable[[str, list[Batch], Any], None],
        settings: Settings,
        producer: Callable[[], Any] | None = None,
        max_sleep_s: float = 0.25,
        clock: Callable[[], float] = time.time,
        alert: Callable[[str, Alert], None] | None = None,
        paced_bundles: Callable[[], bool] = lambda: False,
        answer_times: AnswerTimes = ANSWER_TIMES,
    ) -> None:
        self._frontier = frontier
        self._runtimes = runtimes
        self._dispatch = dispatch
        self._settings = settings
        self._producer = producer
        self._max_sleep_s = max_sleep_s
        self._clock = clock
        self._alert = alert  # (cause, alert): sent at most once per cause and alert window
        # True while paced hosts' batches travel in bundles (one message for a pump call's batches):
        # the in-flight cap then counts bundles, not batches.
        self._paced_bundles = paced_bundles
        self._answer_times = answer_times  # this process's: its threads are the ones that wait
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_reclaim = 0.0

    def start(self) -> FrontierPump:
        """Run the pump in a daemon thread (again after a stop; once while running)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="vcrawl-pump", daemon=True)
        self._thread.start()
        return self

    def stop_soon(self) -> None:
        """Tell the pump to stop after its current round, without waiting for it (``stop`` waits)."""
        self._stop.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after the current round."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def pump_once(self) -> float | None:
        """One round over the running jobs; return seconds until the next host is due (None: idle)."""
        now = self._clock()
        reclaim = now - self._last_reclaim >= _RECLAIM_EVERY_S
        if reclaim:
            self._last_reclaim = now
        next_due: float | None = None
        dispatched = 0
        for job_id in self._frontier.jobs.running_jobs():
            try:
                runtime = self._runtimes.get(job_id, self._frontier.jobs.cycle(job_id))
            except VcrawlError as exc:
                logger.warning("pump: skipping job %s: %s", job_id, exc)
                continue
            interval_ms = runtime.spec.politeness.min_interval_s * 1000
            if reclaim:
                requeued, failed = self._frontier.queue.reclaim_expired(job_id, runtime.limits.retries + 1, interval_ms)
                if requeued or failed:
                    logger.warning("job %s: leases ran out: %d URLs requeued, %d failed", job_id, requeued, failed)
                self._check_stuck(job_id, now)
            # Paced hosts in bundles: a running bundle leases more of them itself (engine.fetch_bundle);
            # the pump only starts a few bundles, lest hosts wait leased in bundles still queued. Without
            # bundles (ring nodes own the hosts), a paced batch holds one URL: a task never sleeps.
            bundled = interval_ms > 0 and self._paced_bundles()
            result = self._frontier.queue.pump(
                job_id,
                max_batches=_MAX_BATCHES_PER_CALL,
                batch_size=runtime.batch_size if interval_ms <= 0 or bundled else 1,
                per_host=runtime.spec.politeness.per_host,
                interval_ms=interval_ms,
                lease_ms=lease_ms(runtime),
                cap=_PACED_BUNDLE_CAP
                if bundled
                else inflight_cap(self._settings.frontier_inflight, self._answer_times.typical_s()),
            )
            if result.stopped:
                self._frontier.jobs.forget_if_stopped(job_id, runtime.bloom.keys)
                continue
            producer = self._producer() if (self._producer and result.batches) else None
            try:
                if result.batches:
                    self._dispatch(job_id, list(result.batches), producer)
            except Exception:
                # The broker refused or stayed away past the publish retries: the batches go back to the
                # frontier now rather than when their leases run out (minutes). One that was sent after
                # all finds its lease gone and fetches nothing.
                self._frontier.queue.hand_over(job_id, [batch.batch_id for batch in result.batches], interval_ms)
                raise
            finally:
                if producer is not None:
                    producer.release()
            dispatched += len(result.batches)
            if result.next_due_s is not None:
                next_due = result.next_due_s if next_due is None else min(next_due, result.next_due_s)
        if dispatched:
            return 0.0
        if next_due is not None and next_due <= 0:
            # Hosts are due but the in-flight cap is reached: a released batch wakes us.
            return self._max_sleep_s
        return next_due

    def _check_stuck(self, job_id: str, now: float) -> None:
        stalled_s = self._frontier.stats.stalled_s(job_id, now)
        if self._alert is None or stalled_s < self._settings.alert_stuck_s:
            return
        self._alert(
            f"{job_id}:stuck",
            Alert(
                subject=f"job {job_id} stuck",
                text=f"Job {job_id} has URLs left but finished no fetch batch for {stalled_s:.0f} s. Are workers "
                "consuming the download queue? Is a host holding every URL back (Retry-After, Crawl-delay)?",
                details={
                    "job": job_id,
                    "stalled_s": round(stalled_s),
                    "in_flight_batches": self._frontier.queue.in_flight(job_id),
                },
            ),
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait_s = self.pump_once()
            except Exception:  # the pump must survive a Redis restart or a bad job
                logger.exception("frontier pump round failed")
                self._stop.wait(1.0)
                continue
            if wait_s is not None and wait_s <= 0:
                continue
            # Redis ends a blocking wait on its 100 ms timer tick (hz 10), up to 100 ms late; that
            # stretched every 0.4 s host interval to 0.5 s. So the blocking wait ends a tick early
            # and the last stretch is slept here, to the millisecond.
            if wait_s is not None and wait_s <= _REDIS_TICK_S * 1.5:
                self._stop.wait(wait_s)
                continue
            timeout = self._max_sleep_s if wait_s is None else min(self._max_sleep_s, wait_s - _REDIS_TICK_S)
            try:
                self._frontier.queue.wait_for_work(timeout)
            except Exception:
                logger.exception("frontier pump wait failed")
                self._stop.wait(1.0)
