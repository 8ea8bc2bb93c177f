"""One fetch batch of a crawl job: URLs of one host leased from the frontier, fetched one after another.

Each URL goes through the one fetch step (``engine.fetch_step.fetch_one``) and comes back as a
frozen outcome; the batch stops early when an outcome says the host needs its pause. The outcomes
are then folded into the release of the lease (``fold_release``), which sets the host's next
allowed time and requeues what must go again, and the stored pages and redirects are handed to the
analysis batch (``engine.analyze_batch``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from engine.crawl_env import CrawlEnv
from engine.fetch_log import log_lines
from engine.fetch_step import (
    Cycle,
    FetchContext,
    FetchItem,
    FetchPolicy,
    FetchServices,
    JobHooks,
    fetch_one,
    stops_batch,
)
from engine.fetch_step.host_trouble import throttle_tail
from engine.jobs import JobRuntime, lease_ms
from engine.origin_holds import hold_origin
from engine.outcomes import Failed, FetchOutcome, Redirected, Retry, RobotsFetched, SitemapRead, Stored
from engine.redis_wait import ride_out
from engine.sitemaps import SitemapSink, unchanged_by_hint
from engine.warc_stage import StagedWarc
from frontier import Batch, BatchRelease, Entry, UrlHistory
from storage import job_page_location
from telemetry.alerts import Alert
from telemetry.log_context import log_context
from vcrawl import names
from vcrawl.errors import VcrawlError
from vcrawl.payloads import FetchedBatch, RedirectLink
from vcrawl.policies import PolitenessPolicy

__all__ = [
    "BUNDLE_SEPARATOR",
    "FETCH_ID_PREFIX",
    "FetchedEntries",
    "StartedFetch",
    "drive",
    "fetch_context",
    "fetch_task_id",
    "finish_fetch",
    "fold_release",
    "run_fetch_batch",
    "start_fetch",
]

FETCH_ID_PREFIX = "vcrawl-fetch:"
BUNDLE_SEPARATOR = "+"
"""Joins a bundle's batch ids in its task id (``tasks.batches.fetch_bundle``): each batch in it is named."""


def fetch_task_id(job_id: str, batch_id: str) -> str:
    """The task id of a leased batch's fetch (also when passed on, or retried): known without asking
    the broker, so a lease whose message was lost can be told (``tasks.broker.lost_fetches``)."""
    return f"{FETCH_ID_PREFIX}{job_id}:{batch_id}"


logger = logging.getLogger(__name__)

_STATE_CHECK_S = 0.2  # a running batch notices a cancel or pause within this (plus one fetch)
UNPACED_SPAN_S = 1.5  # an unpaced batch's last start: a slow host's rest goes back, first in line, shared out


def fetch_context(env: CrawlEnv, runtime: JobRuntime, hooks: JobHooks) -> FetchContext:
    """What ``fetch_one`` needs for a URL of this job: the process's services with the job's own
    fetcher, identities and secrets, the job's policy, and the batch's ``hooks``."""
    politeness = runtime.spec.politeness
    services = FetchServices(
        fetcher=runtime.fetcher,
        robots_fetcher=runtime.robots_fetcher,
        identities=runtime.identities,
        robots=env.robots,
        store=env.storage,
        fetchers=env.fetchers,
        proxies=env.proxies,
        alert=env.alert,
        api_auth=runtime.api_auth,
        clock=env.clock,
        meter=env.meter,
    )
    policy = FetchPolicy(
        retry=runtime.retry,
        networks=runtime.networks or None,
        follow_redirects=False,  # a job follows redirects as links of their own, whatever the page type
        obey_robots=politeness.obey_robots,
        robots_token=politeness.robots_token,
        retry_after=politeness.retry_after,
        pace_after_robots=not runtime.eager,
        robots_retry_s=env.robots_retry_s,
    )
    return FetchContext(services, policy, hooks)


def run_fetch_batch(env: CrawlEnv, job_id: str, batch: Batch, sleep: Callable[[float], None] = time.sleep) -> dict:
    """Fetch a leased batch, store its pages, release the lease; return what analysis needs.

    A paced host's batch keeps the host's pace between its URLs (``sleep`` waits); another starts none
    after ``UNPACED_SPAN_S`` (at 100 ms a batch of 32, 3.5 s, was the crawl's tail).
    """
    with log_context(job=job_id):  # every line logged for the batch names its job
        result, started = start_fetch(env, job_id, batch, float("inf") if batch.paced else env.clock() + UNPACED_SPAN_S)
        if started is None:
            return result
        try:
            return finish_fetch(env, started, drive(started.steps, env.clock, sleep))
        finally:
            started.discard()


@dataclass
class StartedFetch:
    """A batch whose lease is started: its job, its fetches still to run (``steps``), its WARC staging."""

    job_id: str
    runtime: JobRuntime
    batch: Batch
    staged: StagedWarc | None
    steps: Generator[float, None, FetchedEntries]
    wake_pump: bool = True  # its release wakes a pump (not for a bundle's own refills)
    token: str = ""  # the run that started its lease

    def discard(self) -> None:
        """Drop WARC captures not settled (an error before the release: the batch is fetched again)."""
        if self.staged is not None:
            self.staged.discard()


FetchedEntries = tuple[list[FetchOutcome], list[Entry], list[Entry]] | None
"""A batch's fetches: (outcomes, entries handed back untried, retries still waiting); None when another
run took the batch over (it releases it, this one does not)."""


def drive(steps: Generator[float, None, FetchedEntries], clock: Callable[[], float],
          sleep: Callable[[float], None]) -> FetchedEntries:  # fmt: skip
    """Run a batch's fetches to the end, waiting before each what it asks (a paced host's pace)."""
    try:
        while True:
            not_before = next(steps)
            if (wait := not_before - clock()) > 0:
                sleep(wait)
    except StopIteration as done:
        return done.value


def start_fetch(
    env: CrawlEnv,
    job_id: str,
    batch: Batch,
    stop_at: float = float("inf"),
    owner: str = "",
    renew: Callable[[Batch, str], str] | None = None,
) -> tuple[dict[str, Any], StartedFetch | None]:
    """Start a batch's lease: (the result, None) when there is nothing to fetch (a stale or stopped
    batch), else (nothing yet, the started batch, whose ``steps`` start no fetch after ``stop_at``).
    ``owner``: the run the pump already started the lease for (``FrontierQueue.pump``). ``renew``: a
    bundle's renewals (``engine.fetch_bundle``; a batch driven with other hosts' batches, where a URL
    whose robots.txt read took its slot waits in the batch), else each renewal is a call of its own."""
    runtime = env.runtimes.get(job_id, batch.cycle)
    nothing = FetchedBatch(job_id, batch.batch_id, batch.cycle)
    token = owner or uuid.uuid4().hex  # this run's: a second copy of the message neither starts nor renews it
    started = "go" if owner else env.frontier.queue.start_lease(job_id, batch.batch_id, lease_ms(runtime), token,
                                                                host=batch.host)  # fmt: skip
    if started == "taken":  # at-least-once delivery: the copy that started first fetches
        logger.info("job %s: batch %s is being fetched by another copy of its message; skipped", job_id,
                    batch.batch_id)  # fmt: skip
        return nothing.to_dict(), None
    if started == "stale":
        handed_on = env.frontier.queue.handed_on(job_id, batch.batch_id)
        if handed_on is not None:  # released, but its worker died before it sent the analysis
            logger.warning("job %s: batch %s was fetched before; its analysis goes again", job_id, batch.batch_id)
            return handed_on, None
        # Expected after every hand-over (a dead worker's messages put back): not worth a warning.
        logger.info("job %s: batch %s came after its lease was handed back or ran out; skipped", job_id,
                    batch.batch_id)  # fmt: skip
        return nothing.to_dict(), None  # its URLs went back to the queue
    if started in ("stopped", "held"):  # cancelled, or its host held, while the batch waited: give it back
        handed_back = BatchRelease(pause_ms=0, done=0, requeue=batch.entries, fetched=False)
        env.frontier.queue.release(job_id, batch, handed_back)
        return nothing.to_dict(), None
    assert env.warc is not None or not runtime.spec.warc, "a crawl environment for WARC jobs has WARC writers"
    staged = StagedWarc(partial(env.warc, job_id), f"job {job_id} batch {batch.batch_id}") if (
        runtime.spec.warc and env.warc is not None) else None  # fmt: skip
    steps = _fetch_entries(env, runtime, batch, staged, stop_at, token, renew)
    return nothing.to_dict(), StartedFetch(job_id, runtime, batch, staged, steps, wake_pump=not owner, token=token)


def finish_fetch(env: CrawlEnv, started: StartedFetch, fetched: FetchedEntries) -> dict[str, Any]:
    """Release a started batch's lease with what its fetches came to; return what analysis needs."""
    runtime, job_id, batch, staged = started.runtime, started.job_id, started.batch, started.staged
    nothing = FetchedBatch(job_id, batch.batch_id, batch.cycle)
    if fetched is None:
        return nothing.to_dict()
    outcomes, handed_back, waiting = fetched
    politeness = runtime.spec.politeness
    release = fold_release(outcomes, handed_back, waiting, runtime.politeness, politeness.obey_robots, env.clock)
    fetched_batch = FetchedBatch(
        job_id,
        batch.batch_id,
        batch.cycle,
        pages=tuple(outcome.page for outcome in outcomes if isinstance(outcome, Stored)),
        redirects=tuple(_redirect_link(outcome) for outcome in outcomes if isinstance(outcome, Redirected)),
    )
    result = fetched_batch.to_dict()
    handed_on = json.dumps(result, separators=(",", ":")) if fetched_batch.done else ""
    now = round(env.clock(), 3)
    if env.fetch_log is not None:  # before the release: a line is never missing, at worst written twice
        log = env.fetch_log(job_id)
        for line in log_lines(outcomes, batch.cycle, now):
            log.append(line.to_json())
    failures = [(outcome.entry.url, outcome.reason) for outcome in outcomes if isinstance(outcome, Failed)]
    if staged is not None:  # right before the release, so a batch taken over is not archived twice
        _settle_warc(env, job_id, batch, staged)
    final = replace(
        release,
        failures=tuple({"url": url, "reason": reason, "at": now} for url, reason in failures),
        # The host's totals count its pages: a sitemap read is done, but no page of the host.
        host_done=release.done + fetched_batch.done - sum(isinstance(outcome, SitemapRead) for outcome in outcomes),
        handed_on=handed_on,
    )
    # Waits out a Redis restart or failover: a release refused there costs every page of the batch again.
    released = ride_out(partial(env.frontier.queue.release, job_id, batch, final, started.wake_pump),
                        f"release of batch {batch.batch_id}")  # fmt: skip
    if released is None:  # reclaimed meanwhile: its URLs are queued again, this run does not count
        return nothing.to_dict()
    if released and env.on_completed is not None:
        env.on_completed(job_id, batch.cycle)
    if failures:
        _check_host(env, runtime, batch.host, failures)
    return result


def _settle_warc(env: CrawlEnv, job_id: str, batch: Batch, staged: StagedWarc) -> None:
    """Archive the batch's captures if it still holds its lease (a WARC failure is logged, not fatal)."""
    try:
        staged.settle(env.frontier.queue.holds_lease(job_id, batch.batch_id))
    except (VcrawlError, OSError, ValueError) as exc:
        logger.warning("job %s: WARC captures of batch %s not archived: %r", job_id, batch.batch_id, exc)


def _fetch_entries(
    env: CrawlEnv,
    runtime: JobRuntime,
    batch: Batch,
    staged: StagedWarc | None = None,
    stop_at: float = float("inf"),
    token: str = "",
    renew: Callable[[Batch, str], str] | None = None,
) -> Generator[float, None, FetchedEntries]:
    """Fetch the batch's URLs in order: (outcomes, entries handed back untried, retries still waiting).

    A generator: before each request to a paced host after the first, it yields the time (``env.clock``)
    not to start it before, its previous request's end plus the host's pause (the job's interval
    with jitter); whoever drives it waits, or fetches another host's batch meanwhile. No URL starts
    after ``stop_at``: the rest is handed back, first in line. ``token``: the run that started the lease.
    """
    outcomes: list[FetchOutcome] = []
    sitemaps = SitemapSink(runtime, env.frontier, batch.batch_id)
    hooks = JobHooks(
        job_id=runtime.job_id,
        host_throttle=partial(_host_throttle, env, runtime.job_id, outcomes),
        host_slowness=partial(_host_slowness, env, runtime.job_id, outcomes),
        sitemaps=sitemaps,
        cycle=Cycle(runtime.cycle, runtime.cycle_started_s, runtime.spec.revisit) if runtime.cycle else None,
        warc=staged.stage if staged is not None else None,  # staged: the job archives (``warc: true``)
    )
    ctx = fetch_context(env, runtime, hooks)
    known, unchanged = _history(env, runtime, batch, sitemaps)
    handed_back: list[Entry] = []
    waiting: list[Entry] = []
    checked_at = env.clock()
    last_request: float | None = None  # when the previous request to the host ended
    entries = list(batch.entries)  # a URL whose robots.txt read took its slot comes again, a pause later
    robots_in_batch = renew is not None and batch.paced and runtime.spec.politeness.min_interval_s > 0  # bundled
    for index, entry in enumerate(entries):
        if batch.paced and last_request is not None and (pause := runtime.politeness.pause_s()) > 0:
            yield last_request + pause
        # Cancel or pause stops the batch before its next URL; asked at most every _STATE_CHECK_S,
        # which spares a Redis round trip per URL when the host answers fast. A paced batch asks
        # before every further request (below): its lease too, since it spans seconds.
        if index > 0 and not batch.paced and env.clock() - checked_at >= _STATE_CHECK_S:
            checked_at = env.clock()
            if not env.frontier.jobs.is_running(runtime.job_id, batch.cycle):  # hand the rest back
                handed_back.extend(entries[index:])
                break
        if index > 0 and env.clock() >= stop_at:  # the task's time is up: the rest goes again
            handed_back.extend(entries[index:])
            break
        if entry.not_before_s > env.clock():  # a retry still in its Retry-After: the host's other URLs go first
            waiting.append(entry)
            continue
        if batch.paced and index > 0:
            # A lease lost since (a failover took its last write, a Redis restart, a hand-over to
            # another worker): its URLs are queued again, and another worker may fetch this host now.
            held = renew(batch, token) if renew is not None else ride_out(
                partial(env.frontier.queue.renew_lease, runtime.job_id, batch.batch_id, batch.cycle, token),
                f"batch {batch.batch_id}")  # fmt: skip
            if held == "stale":
                logger.info("job %s: batch %s lost its lease; it fetches no more", runtime.job_id, batch.batch_id)
                break
            if held == "taken":
                logger.info("job %s: batch %s was taken over by another copy of its message", runtime.job_id,
                            batch.batch_id)  # fmt: skip
                return None
            if held == "stopped":
                handed_back.extend(entries[index:])
                break
        if env.holds is not None and env.holds.left_s(runtime.job_id, batch.host) > 0:  # (a dict lookup)
            logger.info("job %s: %s is held (it asked for no request); batch %s hands its rest back", runtime.job_id,
                        batch.host, batch.batch_id)  # fmt: skip
            handed_back.extend(entries[index:])
            break
        rule = runtime.spec.rule_for(entry.url)
        save_path = job_page_location(runtime.job_id, runtime.cycle, entry.url)
        item = FetchItem(entry, rule, save_path, known.get(entry.url), unchanged_by_sitemap=entry.url in unchanged)
        outcome = fetch_one(ctx, item)
        if isinstance(outcome, RobotsFetched) and robots_in_batch and not outcome.visit.crawl_delay_s and (
                entry not in entries[index + 1 :]):  # fmt: skip
            outcome = replace(outcome, again_in_batch=True)  # no Crawl-delay: the URL goes at the job's pace
            entries.insert(index + 1, entry)
        outcomes.append(outcome)
        if outcome.visit.host_wait_s > 0:  # the host asked for no request that long: every worker holds it now
            hold_origin(env, runtime.job_id, batch.host, outcome.visit.host_wait_s)
        if outcome.visit.requested:  # counted from its end, as the host gate does: never early on the wire
            last_request = env.clock()
        if stops_batch(outcome, runtime.spec.politeness.obey_robots):
            handed_back.extend(entries[index + 1 :])
            break
    return outcomes, handed_back, waiting


def _history(
    env: CrawlEnv, runtime: JobRuntime, batch: Batch, sitemaps: SitemapSink
) -> tuple[dict[str, UrlHistory], set[str]]:
    """A scheduled job's batch: its URLs' history, and those this cycle's sitemap says are unchanged."""
    if not runtime.cycle:
        return {}, set()
    assert env.history is not None, "a crawl environment for scheduled jobs keeps URL history"
    known = env.history.load(runtime.job_id, [entry.url for entry in batch.entries])
    hints = sitemaps.hints([url for url, record in known.items() if record.fetched])
    unchanged = {
        url for url, hint in hints.items() if unchanged_by_hint(hint, runtime.cycle, known[url].fetched_cycle_s)
    }
    return known, unchanged


def _host_slowness(env: CrawlEnv, job_id: str, batch_so_far: Sequence[FetchOutcome], host: str) -> tuple[int, int]:
    """A host's (requests given up for time, responses): released batches' and this batch's so far."""
    slow, answered = env.frontier.stats.host_slowness(job_id, host)
    for outcome in batch_so_far:
        slow += outcome.visit.counts.get(names.COUNTER_SLOW, 0)
        answered += outcome.visit.counts.get(names.COUNTER_FETCHED, 0)
    return slow, answered


def _host_throttle(env: CrawlEnv, job_id: str, batch_so_far: Sequence[FetchOutcome], host: str) -> int:
    """The host's 429/503 answers in a row: this batch's so far, after released batches' streak."""
    answered, tail = throttle_tail(batch_so_far)
    return tail if answered else env.frontier.stats.host_throttle(job_id, host) + tail


def fold_release(
    outcomes: Sequence[FetchOutcome],
    handed_back: Sequence[Entry],
    waiting: Sequence[Entry],
    politeness: PolitenessPolicy,
    obey_robots: bool = True,
    clock: Callable[[], float] = time.time,
) -> BatchRelease:
    """Fold a batch's outcomes into the release of its lease.

    Stored pages and redirects are finished by the analysis; every other final outcome is ``done``
    now. Retries of a struggling host and a URL whose robots.txt read took the slot go first again;
    a URL's own retries go behind the host's other URLs. The host's next request waits its pause
    (the job's interval or the Crawl-delay, counted from now) or the longest wait an outcome asked for.
    """
    now = clock()
    tally = _tally(outcomes, waiting, now)
    requeue, requeue_back, host_delay_until = [*tally.requeue, *handed_back], tally.requeue_back, tally.host_delay_until
    # A retry still waiting for its Retry-After goes behind the host's other URLs even when the
    # batch hands its rest back (cancel, pause, a host pause): at the front it would hold the host.
    requeue_back.extend(entry for entry in requeue if entry.not_before_s > now)
    requeue = [entry for entry in requeue if entry.not_before_s <= now]
    if not tally.fetched and requeue_back:
        # Only waiting retries were leased: the host has nothing due before the first of them.
        host_delay_until = max(host_delay_until, min(entry.not_before_s for entry in requeue_back))
    pause = politeness.pause_s()
    if tally.crawl_delay_s is not None and obey_robots:
        pause = max(pause, tally.crawl_delay_s)
    host_delay_s = max(0.0, host_delay_until - clock())
    if pause > 0 and tally.fetched:
        # Counted from the release (Redis time, after the last response ended), the next request
        # to the host can never come early, however late in its slot this batch's request went out.
        host_delay_s = max(host_delay_s, pause)
    answered, tail = throttle_tail(outcomes)
    return BatchRelease(
        throttle=f"={tail}" if answered else (f"+{tail}" if tail else ""),
        pause_ms=pause * 1000,
        host_delay_ms=host_delay_s * 1000,
        done=tally.done,
        requeue=tuple(requeue),
        requeue_back=tuple(requeue_back),
        counters=tally.counters,
        crawl_delay_s=tally.crawl_delay_s if obey_robots else None,
        history=tally.history,
        fetched=tally.fetched,  # else its Crawl-delay (or unknown robots.txt) still holds
    )


@dataclass
class _Tally:
    """What a batch's outcomes add up to (``fold_release``), before the host's pause is set."""

    counters: Counter[str] = field(default_factory=Counter)
    requeue: list[Entry] = field(default_factory=list)  # first again
    requeue_back: list[Entry] = field(default_factory=list)  # behind the host's other URLs
    history: dict[str, UrlHistory] = field(default_factory=dict)
    done: int = 0
    host_delay_until: float = 0.0
    crawl_delay_s: float | None = None
    fetched: bool = False


def _tally(outcomes: Sequence[FetchOutcome], waiting: Sequence[Entry], now: float) -> _Tally:
    """Count the outcomes, sort their entries into first again and behind, note the longest wait asked for."""
    tally = _Tally(requeue_back=list(waiting))
    for outcome in outcomes:
        tally.counters.update(outcome.visit.counts)
        tally.fetched = tally.fetched or outcome.visit.requested
        if outcome.visit.host_wait_s > 0:  # a Retry-After, an API's spent rate limit: the host waits for it
            tally.host_delay_until = max(tally.host_delay_until, now + outcome.visit.host_wait_s)
        if outcome.visit.crawl_delay_s is not None:
            tally.crawl_delay_s = outcome.visit.crawl_delay_s
        if outcome.visit.revisit is not None:
            tally.history[outcome.entry.url] = outcome.visit.revisit
        match outcome:
            case Stored() | Redirected():
                pass
            case RobotsFetched(again_in_batch=False):
                tally.requeue.append(outcome.entry)
            case RobotsFetched():  # fetched again in this batch
                pass
            case Retry(scope="host"):
                tally.requeue.append(outcome.entry)
                tally.host_delay_until = max(tally.host_delay_until, now + outcome.delay_s)
            case Retry():
                tally.requeue_back.append(outcome.entry)
            case Failed():
                tally.done += 1
                tally.host_delay_until = max(tally.host_delay_until, now + outcome.host_wait_s)
            case _:  # Unchanged, RobotsBlocked
                tally.done += 1
    return tally


def _redirect_link(outcome: Redirected) -> RedirectLink:
    entry = outcome.entry
    return RedirectLink(entry.url, outcome.target, entry.depth, entry.redirects_left - 1)


def _check_host(env: CrawlEnv, runtime: JobRuntime, host: str, failures: list[tuple[str, str]]) -> None:
    """Alert (once per window) when most of a host's URLs fail: the site is down or blocking us."""
    rate, at_least = env.host_alert
    done, failed = env.frontier.stats.host_totals(runtime.job_id, host)
    if done < at_least or failed < rate * done:
        return
    reasons = Counter(reason for _, reason in failures)
    env.alert(
        f"{runtime.job_id}:host:{host}",
        Alert(
            subject=f"host {host} failing in job {runtime.job_id}",
            text=f"{failed} of {done} URLs of {host} failed for good (recent reasons: {dict(reasons)}). "
            f"Further alerts for this host in this job are held back for the alert window.",
            details={
                "job": runtime.job_id,
                "host": host,
                "done": done,
                "failed": failed,
                "example": failures[-1][0],
                "reasons": dict(reasons),
            },
        ),
    )
