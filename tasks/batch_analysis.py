"""Batch analysis and replay as a Celery chord on the ``analysis`` queue.

``vcrawl.batch_map`` (one per chunk) -> ``vcrawl.batch_reduce`` (the chord's body). A map that
fails is retried alone, with backoff, up to the analysis retries (3); then the run fails and the
admin alert goes out. Both tasks acknowledge late and store their output under fixed names, so
a worker killed mid-chord loses nothing: its message comes back and runs again. A map message lost
outright (taken off the queue by a worker killed before it noted it) is found by the watchdog
(``watch_runs``, rules in ``batch_analysis.lookout``) and sent again within the node timeout.
``vcrawl.start_batch_analysis`` plans and starts a run from a worker (a job's own batch
analyzers, when it or a cycle completes).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from celery import Task, chord

from batch_analysis import steps as batch_analysis
from batch_analysis.lookout import LookPolicy
from batch_analysis.runs import AnalysisRuns
from celeryconfig import ANALYSIS_QUEUE, queue_lists
from cluster.periodic import Periodic
from tasks import deps
from tasks.app import app
from tasks.broker.lost_analyses import ids_present, watch_analyses
from tasks.broker.lost_fetches import watch_fetches
from telemetry.alerts import Alert
from vcrawl import names, redis_keys
from vcrawl.errors import InvalidTask, PermanentError

__all__ = [
    "batch_failed",
    "batch_map",
    "batch_reduce",
    "launch",
    "map_task_id",
    "maps_present",
    "message_exists",
    "recover_run",
    "run_watchdog",
    "start_batch_analysis",
    "unshipped_log_parts",
    "watch_runs",
]

logger = logging.getLogger(__name__)

_LOG_WAIT_POLL_S = 1.0
WATCH_EVERY_S = 5.0  # how often some worker looks for stalled runs
LOOKS = LookPolicy()  # when a run that stopped moving is looked at (first 10 s after its last progress)
REDUCE_DUE_S = LOOKS.reduce_due_s
_UNACKED = "unacked"  # kombu's Redis transport: delivery tag -> message, until acknowledged
_REDUCE_AGAIN = "{run}.reduce.again"  # the task id of a reduce sent outside the chord
# A map message's own id in its headers (kombu writes JSON with ", " and ": "), see ``map_task_id``.
_MAP_ID = re.compile(r'"id": "([^"]+\.map\.\d+)"')


def runs() -> AnalysisRuns:
    """The runs' state in this process's Redis."""
    return AnalysisRuns(deps.redis_client())


@app.task(name="vcrawl.batch_map", bind=True, acks_late=True, max_retries=None, throws=(PermanentError,))
def batch_map(self: Task, job_id: str, run_id: str, index: int) -> str:
    """Map one chunk of a run; return where its partial is stored."""
    try:
        location = batch_analysis.map_chunk(deps.storage(), runs(), job_id, run_id, index, _rules_for(job_id))
    except PermanentError as exc:  # the run's files are gone, an unknown analyzer: no retry can help
        _give_up(job_id, run_id, f"chunk {index}: {type(exc).__name__}: {exc}", 1)
        raise
    except Exception as exc:  # the task edge: an analyzer's bug or storage trouble is retried, alone
        attempt = self.request.retries + 1
        delay_s = deps.analysis_retry().delay_for(attempt)
        if delay_s is None:
            _give_up(job_id, run_id, f"chunk {index}: {type(exc).__name__}: {exc}", attempt)
            raise
        logger.warning("run %s: chunk %d failed (attempt %d), retrying in %.1fs: %r", run_id, index, attempt, delay_s,
                       exc)  # fmt: skip
        raise self.retry(exc=exc, countdown=delay_s) from exc
    reduce_if_resent(job_id, run_id)
    return location


@app.task(name="vcrawl.batch_reduce", bind=True, acks_late=True, max_retries=None, throws=(PermanentError,))
def batch_reduce(self: Task, partials: list[str], job_id: str, run_id: str) -> str:
    """Fold a run's partials into its result; return the result's location."""
    run = runs().get(job_id, run_id)
    if run is not None and run.get("state") != names.RUN_RUNNING:  # a late duplicate: the run has ended
        logger.info("run %s is %s already: this reduce has nothing to do", run_id, run.get("state"))
        return str(run.get("result") or "")
    try:
        return batch_analysis.reduce_run(deps.storage(), runs(), job_id, run_id, list(partials))
    except PermanentError as exc:
        _give_up(job_id, run_id, f"reduce: {type(exc).__name__}: {exc}", 1)
        raise
    except Exception as exc:
        attempt = self.request.retries + 1
        delay_s = deps.analysis_retry().delay_for(attempt)
        if delay_s is None:
            _give_up(job_id, run_id, f"reduce: {type(exc).__name__}: {exc}", attempt)
            raise
        raise self.retry(exc=exc, countdown=delay_s) from exc


@app.task(name="vcrawl.batch_failed", ignore_result=True)
def batch_failed(request: Any, exc: BaseException, traceback: str, job_id: str = "", run_id: str = "") -> None:
    """Errback of the chord's body: a map that failed for good fails the run (if the map has not said so)."""
    run = runs().get(job_id, run_id)
    if run is not None and run.get("state") == names.RUN_RUNNING:
        _give_up(job_id, run_id, f"{type(exc).__name__}: {exc}", 0)


@app.task(name="vcrawl.start_batch_analysis", bind=True, acks_late=True, max_retries=None, ignore_result=True)
def start_batch_analysis(self: Task, job_id: str, analyzer: str, cycle: int | None = None, since: float = 0.0) -> None:
    """Plan and start a run of ``analyzer`` over a job (or cycle) that completed, from a worker."""
    since = since or time.time()
    if unshipped_log_parts(job_id) and time.time() - since < _log_wait_s():
        raise self.retry(countdown=_LOG_WAIT_POLL_S, kwargs={"job_id": job_id, "analyzer": analyzer,
                                                             "cycle": cycle, "since": since})  # fmt: skip
    try:
        launch(job_id, analyzer, cycle=cycle)
    except InvalidTask as exc:  # nothing stored in this cycle, ...: nothing to analyse
        logger.warning("job %s: batch analyzer %s not run: %s", job_id, analyzer, exc)


def launch(
    job_id: str,
    analyzer: str,
    *,
    kind: str = "batch",
    cycle: int | None = None,
    chunk: int = batch_analysis.DEFAULT_CHUNK,
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Plan a run and send its chord; return the run's state (``run``, ``chunks``, ``urls``, ...)."""
    plan = batch_analysis.plan_run(
        deps.storage(), runs(), job_id, analyzer, kind=kind, cycle=cycle, chunk_size=chunk, fields=fields
    )
    body = batch_reduce.s(job_id, plan.run).set(link_error=[batch_failed.s(job_id=job_id, run_id=plan.run)])
    chord(batch_map.s(job_id, plan.run, i).set(task_id=map_task_id(plan.run, i)) for i in range(plan.chunks))(body)
    runs().sent(job_id, plan.run, time.time())  # from now on a run that stops moving is looked at soon
    state = runs().get(job_id, plan.run)
    assert state is not None, "a planned run is recorded"
    return state


def map_task_id(run_id: str, index: int) -> str:
    """The task id of a run's map of chunk ``index``: known without asking the broker."""
    return f"{run_id}.map.{index:05d}"


def recover_run(
    job_id: str, run_id: str, now: float | None = None, present: Callable[[], set[str]] | None = None
) -> int:
    """Send again what a run that stopped moving lost; return how many tasks were sent.

    kombu's Redis transport takes a message off its queue (BRPOP) before it notes it as
    unacknowledged: a worker killed between the two loses it, and the chord waits for ever. A map
    whose message is neither queued nor unacknowledged (``present``: the map task ids found in one
    pass, ``maps_present``) is sent again, outside the chord, under its task id; the reduce then
    follows the last map (``reduce_if_resent``). Once every chunk is mapped and no reduce began,
    the reduce is sent with the partials' fixed locations. Both are idempotent, so a message that
    was only late costs a repeat, never a wrong result.
    """
    now = time.time() if now is None else now
    run = runs().get(job_id, run_id)
    if run is None or run.get("state") != names.RUN_RUNNING:
        return 0
    client = deps.redis_client()
    chunks = int(run.get("chunks") or 0)
    done = {int(index) for index in client.smembers(redis_keys.analysis_chunks_done(job_id, run_id))}
    missing = [index for index in range(chunks) if index not in done]
    if not missing:
        runs().touched(job_id, run_id, now)  # the next look waits a whole reduce delay again
        if message_exists(client, ANALYSIS_QUEUE, _REDUCE_AGAIN.format(run=run_id)):  # sent, waits its turn
            return 0
        _send_reduce(job_id, run_id, chunks)
        logger.warning("run %s: every chunk mapped but no reduce came: reduce sent again", run_id)
        return 1
    found = present() if present is not None else maps_present(client)
    lost = [index for index in missing if map_task_id(run_id, index) not in found]
    if lost:
        runs().resending(job_id, run_id, now)  # before the maps: the last of them sends the reduce
    for index in lost:
        batch_map.apply_async((job_id, run_id, index), task_id=map_task_id(run_id, index))
    runs().looked(job_id, run_id, now, LOOKS.next_every(run.get("look_every"), len(lost), _backlog(client)))
    if lost:
        logger.warning("run %s: the messages of chunks %s were lost; sent again", run_id, lost)
    else:
        logger.debug("run %s: chunks %s not mapped yet, their messages wait their turn", run_id, missing[:20])
    return len(lost)


def reduce_if_resent(job_id: str, run_id: str) -> bool:
    """After a map: send the reduce of a run whose maps were sent again outside the chord (the chord's
    own reduce may never come), once every chunk is mapped; True if this call sent it."""
    run = runs().get(job_id, run_id)
    if run is None or run.get("state") != names.RUN_RUNNING or not run.get("resent_at"):
        return False
    chunks = int(run.get("chunks") or 0)
    if run["chunks_done"] != chunks or not runs().claim_reduce(job_id, run_id, time.time()):
        return False
    _send_reduce(job_id, run_id, chunks)
    logger.info("run %s: every chunk mapped after maps were sent again: reduce sent", run_id)
    return True


def maps_present(client: Any) -> set[str]:
    """The task ids of every batch map message on the analysis queue (any priority) or unacknowledged."""
    return ids_present(client, queue_lists(ANALYSIS_QUEUE), _MAP_ID)


def watch_runs(now: float | None = None) -> int:
    """One look at every unfinished run, by one worker at a time: recover the runs that stopped moving
    (``LOOKS``), with one pass over the queue for all of them. Returns how many tasks were sent again.
    """
    client = deps.redis_client()
    if not client.set(redis_keys.analyses_watch(), "1", nx=True, ex=int(WATCH_EVERY_S)):
        return 0  # another worker looked a moment ago
    now = time.time() if now is None else now
    found: list[set[str]] = []

    def present() -> set[str]:
        if not found:
            found.append(maps_present(client))
        return found[0]

    return sum(recover_run(job_id, run_id, now, present) for job_id, run_id in runs().due(now, LOOKS))


def run_watchdog() -> Periodic:
    """A worker's thread that calls ``watch_runs``, ``watch_analyses`` and ``watch_fetches`` every
    ``WATCH_EVERY_S`` (every worker runs one; a lock in Redis lets one look at a time)."""

    def look() -> None:
        watch_runs()
        watch_analyses()
        watch_fetches()

    return Periodic("vcrawl-analysis-watch", WATCH_EVERY_S, look)


def message_exists(client: Any, queue: str, task_id: str) -> bool:
    """True if a message of ``task_id`` waits on ``queue`` (any priority) or is unacknowledged."""

    # Payloads are str from vcrawl's client (it decodes replies), bytes from a raw one.
    def holds(payload: bytes | str) -> bool:
        return task_id in (payload.decode(errors="replace") if isinstance(payload, bytes) else payload)

    for key in queue_lists(queue):
        for start in range(0, client.llen(key), 1000):
            if any(holds(payload) for payload in client.lrange(key, start, start + 999)):
                return True
    return any(holds(payload) for payload in client.hvals(_UNACKED))


def unshipped_log_parts(job_id: str) -> int:
    """Fetch log parts that live workers opened and have not shipped yet (they ship within the flush age)."""
    now = time.time()
    opened = deps.redis_client().hvals(redis_keys.job_log_writers(job_id))
    return sum(1 for at in opened if now - float(at) < _log_wait_s())


def _log_wait_s() -> float:
    # An open part ships VCRAWL_RECORDS_FLUSH_S after its first line; older entries are dead writers'
    # (their spools ship when a worker starts on their machine).
    return deps.settings().records_flush_s + 10.0


def _send_reduce(job_id: str, run_id: str, chunks: int) -> None:
    partials = [f"{batch_analysis.run_folder(job_id, run_id)}/part-{index:05d}.json" for index in range(chunks)]
    batch_reduce.apply_async((partials, job_id, run_id), task_id=_REDUCE_AGAIN.format(run=run_id),
                             link_error=[batch_failed.s(job_id=job_id, run_id=run_id)])  # fmt: skip


def _backlog(client: Any) -> int:
    """Messages a pass over the analysis queue and ``unacked`` reads."""
    pipe = client.pipeline(transaction=False)
    for key in queue_lists(ANALYSIS_QUEUE):
        pipe.llen(key)
    pipe.hlen(_UNACKED)
    return sum(int(count) for count in pipe.execute())


def _rules_for(job_id: str) -> Any:
    def rules(url: str) -> Any:
        return deps.runtimes().get(job_id, 0).spec.rule_for(url).fields

    return rules


def _give_up(job_id: str, run_id: str, error: str, attempts: int) -> None:
    """Fail the run and alert the admins (once per run and alert window)."""
    runs().fail(job_id, run_id, error, time.time())
    tries = f" after {attempts} attempt(s)" if attempts else ""
    deps.alert(
        f"{job_id}:analysis:{run_id}",
        Alert(
            subject=f"batch analysis {run_id} of job {job_id} failed",
            text=f"Run {run_id} of job {job_id} failed{tries}: {error}",
            details={"job": job_id, "run": run_id, "error": error, "attempts": attempts},
        ),
    )
    logger.error("job %s: analysis run %s failed: %s", job_id, run_id, error)
