"""Cycles of scheduled jobs: each firing of a schedule starts the job's next cycle.

A cycle admits the job's seeds again plus every known URL whose revisit is due; the rest of
what the job learned (per-URL history, hosts' pacing) carries over. Plain functions; the
``vcrawl.start_cycle`` task calls ``start_cycle``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any

from engine.jobs import admit_links, check_job, job_bloom, seed_links
from engine.runtime_cache import RuntimeCache
from fetchers import FetcherRegistry
from frontier import CycleStart, Frontier, History
from vcrawl.errors import InvalidTask
from vcrawl.jobs import JobSpec

__all__ = ["start_cycle"]

logger = logging.getLogger(__name__)


def start_cycle(
    spec: JobSpec,
    *,
    frontier: Frontier,
    runtimes: RuntimeCache,
    fetchers: FetcherRegistry,
    history: History,
    client: Any,
    firing: str,
    overlap: str = "skip",
) -> CycleStart:
    """Start the next cycle of ``spec.id``, or finish starting the current one: a redelivered
    firing, or any firing after a start that died half-way, admits what is left (every step
    carries a token, so nothing is admitted twice).

    Raises:
        InvalidTask: the spec names an unknown analyzer, page type or a bad selector, or its id
            is a one-off job's.
    """
    check_job(spec, fetchers)
    bloom_keys = set(job_bloom(spec, client).keys)
    previous = frontier.jobs.raw_state(spec.id).get("spec")
    if previous:  # the last cycle's filter may have had another size
        bloom_keys.update(job_bloom(JobSpec.from_dict(json.loads(previous)), client).keys)
    started = frontier.jobs.new_cycle(
        spec.id, spec.to_json(), firing=firing, overlap=overlap, bloom_keys=sorted(bloom_keys), strategy=spec.strategy
    )
    if started.status == "one-off":
        raise InvalidTask("id", f"{spec.id!r} is a one-off job's id; a schedule needs a name of its own")
    if started.status == "skipped":
        logger.warning("job %s: cycle %d still running; firing %s skipped", spec.id, started.cycle, firing)
        return started
    runtime = runtimes.get(spec.id, started.cycle)
    if started.status == "resumed" and runtime.spec.to_json() != spec.to_json():
        logger.warning("job %s: finishing the start of cycle %d with its own spec; the changed spec of firing %s "
                       "applies from the next cycle", spec.id, started.cycle, firing)  # fmt: skip
    spec = runtime.spec  # the cycle's spec, also when this firing only finishes a start
    redirects = runtime.limits.max_redirects
    token = f"c{started.cycle}"
    seeds = seed_links(spec, redirects)
    admit_links(runtime, frontier, seeds, done=0, token=f"{token}:seeds", counters=Counter(), seeds=True)
    for index, page in enumerate(history.todo_pages(spec.id)):
        due = [(url, depth, redirects) for url, depth in page]
        admit_links(runtime, frontier, due, done=0, token=f"{token}:due:{index}", counters=Counter(), known=True)
    # Release the hold the cycle started with: from here on it may complete.
    admit_links(runtime, frontier, [], done=1, token=f"{token}:started", counters=Counter())
    frontier.jobs.finish_start(spec.id, started.cycle)
    logger.info("job %s: cycle %d %s, %d known URLs due", spec.id, started.cycle, started.status, started.due)
    return started
