"""``vcrawl.fetch_batch`` (download queue) linked to ``vcrawl.analyze_batch`` (analysis queue), and
``vcrawl.fetch_bundle``: paced hosts' batches side by side in one task, sending the analyses of
batches released together as one ``vcrawl.analyze_batches``."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from celery import Task
from celery.exceptions import Ignore, Reject

from celeryconfig import DOWNLOAD_QUEUE, DYNAMIC_QUEUE
from cluster.membership import NODE_QUEUE_PREFIX, pass_on_to
from engine import analyze_batch as analysis_batch
from engine import jobs
from engine.analyze_batch import AnalysisRetry, analysis_task_id
from engine.fetch_batch import BUNDLE_SEPARATOR, fetch_task_id, run_fetch_batch
from engine.fetch_bundle import REFILL_AHEAD_S, AnalysisGatherer, run_fetch_bundle
from engine.fetch_failed import give_back_failed_fetch
from frontier import Batch, BatchRelease
from tasks import deps
from tasks.app import app
from tasks.broker.bundle_ledger import BundleLedger
from vcrawl.errors import ConfigError, InvalidTask, PermanentError, RecordsUnavailable
from vcrawl.targets.broker import broker_priority

__all__ = [
    "analysis_batch_failed",
    "analysis_batches_failed",
    "analyze_batch",
    "analyze_batches",
    "dispatch_batch",
    "dispatch_batches",
    "fetch_batch",
    "fetch_batch_failed",
    "fetch_bundle",
    "ring_node_queue",
    "send_analysis",
]

logger = logging.getLogger(__name__)


# No Celery retries: a batch that dies with its worker keeps its lease, and the frontier
# requeues its URLs when the lease runs out; retries of single URLs go through the frontier.
@app.task(name="vcrawl.fetch_batch", bind=True, acks_late=True, ignore_result=True, throws=(InvalidTask, ConfigError))
def fetch_batch(self: Task, job_id: str, batch: dict) -> dict:
    """Fetch one leased batch of a job's URLs; return the stored pages for analysis.

    A batch whose host belongs to another ring node now (the ring changed while it waited) is
    passed on to that node's queue instead: a host is fetched by its owner only.
    """
    try:
        parsed = Batch.from_dict(batch)
    except ValueError as exc:
        raise InvalidTask("batch", str(exc)) from None
    arrived_on = (self.request.delivery_info or {}).get("routing_key")
    if arrived_on == DOWNLOAD_QUEUE or ring_node_queue(arrived_on):
        owner_queue = pass_on_to(parsed, arrived_on, deps.ring_queue(parsed.host))
        if owner_queue is not None:
            dispatch_batch(job_id, replace(parsed, hops=parsed.hops + 1), queue=owner_queue)
            logger.info("batch %s of %s passed on to %s (its owner now)", parsed.batch_id, parsed.host, owner_queue)
            # Acknowledged, and its linked analysis never sent: the owner's copy, with the same
            # batch id, sends the one analysis whose admission counts.
            raise Ignore()
    try:
        result = run_fetch_batch(deps.crawl_env(), job_id, parsed)
    except ConfigError as exc:  # no retry can mend it: the job fails and says why
        jobs.fail_job(deps.frontier(), job_id, str(exc), deps.alert, batch=parsed)
        raise
    if ring_node_queue(arrived_on):
        deps.node_registry().count_pages(self.request.hostname, len(result.get("pages") or ()))
    return result


@app.task(name="vcrawl.fetch_batch_failed", ignore_result=True)
def fetch_batch_failed(request: Any, exc: BaseException, traceback: str) -> None:
    """Errback: a fetch batch that failed for good hands its lease back now (``engine.fetch_failed``)."""
    job_id, batch = [*(request.args or ()), None, None][:2]
    try:
        parsed = Batch.from_dict(batch) if isinstance(batch, dict) else None
    except ValueError:
        parsed = None
    if not isinstance(job_id, str) or parsed is None:  # refused before any lease was taken: nothing to give back
        logger.error("fetch batch task %s failed for good with no batch to give back: %r", request.id, exc)
        return
    give_back_failed_fetch(deps.crawl_env(), job_id, parsed, f"{type(exc).__name__}: {exc}")


_REFILL_MOST_BATCHES = 32  # batches one refill of a bundle leases at most, when it leases ahead


@app.task(name="vcrawl.fetch_bundle", bind=True, acks_late=True, ignore_result=True, throws=(InvalidTask, ConfigError))
def fetch_bundle(self: Task, job_id: str, batches: list[dict]) -> int:
    """Fetch leased batches of paced hosts side by side (``engine.fetch_bundle``); send each one's
    analysis. A batch whose host belongs to a ring node now goes to that node alone."""
    try:
        parsed = [Batch.from_dict(batch) for batch in batches]
    except ValueError as exc:
        raise InvalidTask("batches", str(exc)) from None
    mine = []
    for batch in parsed:
        owner_queue = pass_on_to(batch, DOWNLOAD_QUEUE, deps.ring_queue(batch.host))
        if owner_queue is not None:
            dispatch_batch(job_id, replace(batch, hops=batch.hops + 1), queue=owner_queue)
        else:
            mine.append(batch)
    env, settings = deps.crawl_env(), deps.settings()
    runtime = env.runtimes.get(job_id, mine[0].cycle if mine else 0)
    interval_ms = runtime.spec.politeness.min_interval_s * 1000
    # An earlier run of this message died (its worker killed): what it leased for itself goes back first.
    ledger = BundleLedger(deps.redis_client(), deps.frontier(), job_id, str(self.request.id),
                          keep_s=jobs.lease_s(runtime) + 60, enabled=settings.amqp_broker)  # fmt: skip
    ledger.take_over(interval_ms, send_analysis)

    static_paced = runtime.spec.politeness.min_interval_s > 0 and not runtime.spec.has_dynamic_rules()

    def refill(owner: str) -> tuple[list[Batch], float | None, bool]:  # more hosts due, while this bundle's wait
        # Leased ahead and started for this bundle only while every batch of the job is one for it:
        # a paced job's static pages and no ring node alive (else batches go on to other queues).
        ahead = static_paced and deps.ring_queue("") is None
        leased = deps.frontier().queue.pump(
            job_id, max_batches=_REFILL_MOST_BATCHES if ahead else 8, batch_size=runtime.batch_size,
            per_host=runtime.spec.politeness.per_host, interval_ms=interval_ms,
            lease_ms=jobs.lease_ms(runtime), cap=settings.frontier_inflight * 32,
            ahead_ms=REFILL_AHEAD_S * 1000 if ahead else 0, owner=owner if ahead else "",
        )  # fmt: skip
        if ahead:
            ledger.note(batch.batch_id for batch in leased.batches)
            return list(leased.batches), leased.next_due_s, True
        kept = []
        for batch in leased.batches:
            if batch.paced and _queue_for(job_id, batch) == DOWNLOAD_QUEUE:
                kept.append(batch)
            else:
                dispatch_batch(job_id, batch)
        ledger.note(batch.batch_id for batch in kept)
        return kept, leased.next_due_s, False

    gathered = AnalysisGatherer(send_gathered)  # a hand-over is kept by its release until analysed
    unfinished: list[Batch] = []
    try:
        results = run_fetch_bundle(env, job_id, mine, budget_s=settings.total_timeout_s, refill=refill,
                                   refill_span_s=jobs.PACED_SPAN_S, finished=gathered.add, unfinished=unfinished,
                                   going_round=gathered.send_due)  # fmt: skip
    except ConfigError as exc:  # no retry can mend it: the job fails and says why; its leases go back
        jobs.fail_job(deps.frontier(), job_id, str(exc), deps.alert, batch=unfinished[0] if unfinished else None)
        for batch in unfinished[1:]:
            deps.frontier().queue.release(job_id, batch, BatchRelease(pause_ms=0, done=0, requeue=batch.entries,
                                                                      fetched=False))  # fmt: skip
        raise
    finally:
        gathered.send_all()
    ledger.close()  # not on an error: a retry or redelivery of this message takes over what is left
    return len(results)


@app.task(name="vcrawl.analyze_batch", bind=True, acks_late=True, ignore_result=True, max_retries=None)
def analyze_batch(self: Task, fetched: dict, carried: dict | None = None) -> dict:
    """Analyse a fetch batch's pages and admit their links; retried, and admitted at most once.

    A failing analyzer is retried like a single task's (``carried``: what earlier attempts found).
    """
    try:
        outcome = analysis_batch.run_analyze_batch(deps.crawl_env(), fetched, carried, deps.analysis_retry())
    except ConfigError as exc:  # no retry can mend it: the job fails and says why
        jobs.fail_job(deps.frontier(), str(fetched.get("job")), str(exc), deps.alert)
        raise
    except PermanentError:
        raise
    except Exception as exc:  # the task edge: Redis or storage trouble is worth a retry
        # Its own budget: the retries a failing analyzer took (``carried``) do not count here.
        analyzer_retries = int((carried or {}).get("attempt", 1)) - 1
        delay_s = _edge_retry_delay(exc, self.request.retries - analyzer_retries + 1)
        if delay_s is None:
            raise
        logger.warning("analysis of batch %s failed, retrying in %.1fs: %r", fetched.get("batch"), delay_s, exc)
        raise self.retry(exc=exc, countdown=delay_s) from exc
    if isinstance(outcome, AnalysisRetry):
        raise self.retry(args=(fetched, outcome.carried.to_dict()), countdown=outcome.delay_s)
    return outcome


@app.task(name="vcrawl.analyze_batches", bind=True, acks_late=True, ignore_result=True, max_retries=None)
def analyze_batches(self: Task, gathered: list[dict]) -> dict:
    """Analyse batches a bundle released together (one job and partition) and admit their links in
    one admission; a batch whose analyzers fail is retried alone (``vcrawl.analyze_batch``)."""
    if not isinstance(gathered, list) or not gathered or not all(isinstance(item, dict) for item in gathered):
        raise InvalidTask("gathered", "must be a non-empty list of fetch batches' hand-overs")
    job_id = str(gathered[0].get("job"))
    try:
        outcome = analysis_batch.run_analyze_batches(deps.crawl_env(), gathered, deps.analysis_retry())
    except ConfigError as exc:  # no retry can mend it: the job fails and says why
        jobs.fail_job(deps.frontier(), job_id, str(exc), deps.alert)
        raise
    except PermanentError:
        raise
    except Exception as exc:  # the task edge: Redis or storage trouble is worth a retry
        delay_s = _edge_retry_delay(exc, self.request.retries + 1)
        if delay_s is None:
            raise
        logger.warning("analysis of %d gathered batches failed, retrying in %.1fs: %r", len(gathered), delay_s, exc)
        raise self.retry(exc=exc, countdown=delay_s) from exc
    for fetched, retry in outcome.retries:  # as analyze_batch's own retry would: its task id, its attempt
        analyze_batch.apply_async((dict(fetched), retry.carried.to_dict()), countdown=retry.delay_s,
                                  task_id=analysis_task_id(job_id, str(fetched["batch"])),
                                  retries=retry.carried.attempt - 1, link_error=[analysis_batch_failed.s()],
                                  priority=_priority(paced=True))  # fmt: skip
    return outcome.summary


def _edge_retry_delay(exc: BaseException, attempt: int) -> float | None:
    """How long an analysis task waits before its ``attempt``-th retry after ``exc``; None: give up.

    A records database out of reach is waited for however long it takes, at the longest backoff:
    giving up would finish the batch's pages without their records.
    """
    policy = deps.batch_analysis_retry()
    delay_s = policy.delay_for(attempt)
    if delay_s is None and isinstance(exc, RecordsUnavailable):
        return policy.backoff_max_s
    return delay_s


def retry_not_sent(exc: BaseException, what: str) -> bool:
    """True when Celery could not send a task's retry (the broker unreachable: it raises ``Reject``).

    The analysis did not fail for good, its message did: what its batches handed on stays in the
    frontier, and the lost-analysis watchdog sends it again (``tasks.broker.lost_analyses``).
    Abandoning it would finish its pages without their links.
    """
    if not isinstance(exc, Reject):
        return False
    logger.warning("the retry of %s could not be sent (%s); the lost-analysis watchdog sends it again", what, exc)
    return True


@app.task(name="vcrawl.analysis_batch_failed", ignore_result=True)
def analysis_batch_failed(request: Any, exc: BaseException, traceback: str) -> None:
    """Errback: count a batch whose analysis failed for good, so its job can still complete."""
    if retry_not_sent(exc, "an analysis"):
        return
    args = list(request.args or ())
    fetched, carried = [*args, None, None][:2]
    if isinstance(fetched, dict):
        carried = carried if isinstance(carried, dict) else None
        analysis_batch.abandon_analysis(deps.crawl_env(), fetched, f"{type(exc).__name__}: {exc}", carried)


@app.task(name="vcrawl.analysis_batches_failed", ignore_result=True)
def analysis_batches_failed(request: Any, exc: BaseException, traceback: str) -> None:
    """Errback: count each gathered batch whose analysis failed for good, so its job can still complete."""
    if retry_not_sent(exc, "an analysis of gathered batches"):
        return
    gathered = list(request.args or ())[:1]
    for fetched in gathered[0] if gathered and isinstance(gathered[0], list) else ():
        if isinstance(fetched, dict):
            analysis_batch.abandon_analysis(deps.crawl_env(), fetched, f"{type(exc).__name__}: {exc}")


# Redis transport priorities: 0 is served first. A paced host's batch (an interval, a
# Crawl-delay) is due at a set time, and every moment it waits behind bulk work is lost to that
# host for good; bulk batches of jobs without politeness only care about throughput. Paced
# work is limited by its delays, so it cannot starve the bulk.
PACED_PRIORITY = 0
BULK_PRIORITY = 6


def _priority(paced: bool) -> int:
    """A batch's message priority in the broker's terms (RabbitMQ serves its highest number first)."""
    return broker_priority(PACED_PRIORITY if paced else BULK_PRIORITY, deps.settings().amqp_broker)


def dispatch_batch(job_id: str, batch: Batch, producer: Any = None, queue: str | None = None) -> None:
    """Send a leased batch to its download queue, linked to its analysis.

    Browser pages go to the dynamic queue; others to the queue of their host's ring node, or to
    the shared download queue while no ring node is alive.
    """
    priority = _priority(batch.paced)
    # Its task id names the job and the batch: a lost analysis message is found and sent again
    # (``tasks.broker.lost_analyses``).
    then_analyze = analyze_batch.s().set(link_error=[analysis_batch_failed.s()], priority=priority,
                                         task_id=analysis_task_id(job_id, batch.batch_id))  # fmt: skip
    if queue is None:
        queue = _queue_for(job_id, batch)
    # No exchange named: Celery then publishes to the queue itself (the anonymous exchange),
    # which spares kombu a lookup of the exchange's bindings in Redis on every publish.
    # Its own task id names the job and the batch too: a lease whose message was lost is handed back
    # (``tasks.broker.lost_fetches``).
    fetch_batch.apply_async((job_id, batch.to_dict()), link=then_analyze, link_error=[fetch_batch_failed.s()],
                            producer=producer, queue=queue, priority=priority,
                            task_id=fetch_task_id(job_id, batch.batch_id))  # fmt: skip


def dispatch_batches(job_id: str, batches: list[Batch], producer: Any = None) -> None:
    """Send a pump call's leased batches: paced hosts' batches of a job paced at an interval, for the
    shared download queue, together as one bundle; every other batch alone (``dispatch_batch``).

    A job without an interval paces only a host whose robots.txt is not read yet or that has a
    Crawl-delay, one URL per batch: such batches go alone, side by side on the workers' threads (a
    bundle fetches one request at a time, so a crawl's first robots.txt reads would queue up in it).
    """
    bundle = []
    interval_paced = bool(batches) and deps.runtimes().get(job_id, batches[0].cycle).spec.politeness.min_interval_s > 0
    for batch in batches:
        queue = _queue_for(job_id, batch)
        if batch.paced and interval_paced and queue == DOWNLOAD_QUEUE:
            bundle.append(batch)
        else:
            dispatch_batch(job_id, batch, producer, queue)
    if bundle:  # even one: a bundle leases more due hosts while its batch waits (engine.fetch_bundle)
        task_id = fetch_task_id(job_id, BUNDLE_SEPARATOR.join(batch.batch_id for batch in bundle))
        fetch_bundle.apply_async((job_id, [batch.to_dict() for batch in bundle]), producer=producer,
                                 queue=DOWNLOAD_QUEUE, priority=_priority(paced=True), task_id=task_id)  # fmt: skip


def _queue_for(job_id: str, batch: Batch) -> str:
    """Browser pages go to the dynamic queue; others to their host's ring node, or the shared queue."""
    spec = deps.runtimes().get(job_id, batch.cycle).spec
    if any(spec.rule_for(entry.url).page_type == "dynamic" for entry in batch.entries):
        return DYNAMIC_QUEUE
    return deps.ring_queue(batch.host) or DOWNLOAD_QUEUE


def send_analysis(fetched: dict) -> None:
    """Send a released batch's analysis again (its message was lost), under its usual task id."""
    analyze_batch.apply_async((fetched,), task_id=analysis_task_id(str(fetched["job"]), str(fetched["batch"])),
                              link_error=[analysis_batch_failed.s()], priority=_priority(paced=True))  # fmt: skip


def send_gathered(gathered: list[dict]) -> None:
    """Send released batches' analyses: one alone as ever, several as one ``vcrawl.analyze_batches``
    whose task id names them all (``tasks.broker.lost_analyses`` finds each)."""
    if len(gathered) == 1:
        send_analysis(gathered[0])
        return
    batch_ids = BUNDLE_SEPARATOR.join(str(fetched["batch"]) for fetched in gathered)
    analyze_batches.apply_async((gathered,), task_id=analysis_task_id(str(gathered[0]["job"]), batch_ids),
                                link_error=[analysis_batches_failed.s()], priority=_priority(paced=True))  # fmt: skip


def ring_node_queue(queue: str | None) -> bool:
    """True for a ring node's own download queue (``cluster.membership.node_queue``)."""
    return bool(queue) and str(queue).startswith(NODE_QUEUE_PREFIX)
