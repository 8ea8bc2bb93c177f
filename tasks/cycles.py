"""``vcrawl.start_cycle``: what a schedule's firing sends (from Celery beat or ``vcrawl schedule run``)."""

from __future__ import annotations

from typing import Any

from celery import Task
from redis.exceptions import RedisError

from engine import cycles
from tasks import deps
from tasks.app import app
from vcrawl.errors import InvalidTask
from vcrawl.jobs import JobSpec

__all__ = ["start_cycle"]


# Redis trouble during a start is retried (same task id: the start resumes where it stopped).
@app.task(
    name="vcrawl.start_cycle",
    bind=True,
    acks_late=True,
    ignore_result=True,
    throws=(InvalidTask,),
    autoretry_for=(RedisError, OSError),
    max_retries=5,
    retry_backoff=2,
    retry_backoff_max=60,
)
def start_cycle(self: Task, name: str, spec: dict[str, Any], overlap: str = "skip", when: str = "") -> dict[str, Any]:
    """Start the next cycle of the scheduled job ``name``; a redelivered firing resumes its start."""
    parsed = JobSpec.from_dict({**spec, "id": name})
    started = cycles.start_cycle(
        parsed,
        frontier=deps.frontier(),
        runtimes=deps.runtimes(),
        fetchers=deps.fetchers(),
        history=deps.history(),
        client=deps.frontier_client(),
        firing=self.request.id or f"{name}:{when}",
        overlap=overlap,
    )
    return {"job": name, "status": started.status, "cycle": started.cycle, "due": started.due}
