"""``vcrawl.record_failure``: the ``link_error`` handler of every fetch and analysis."""

from __future__ import annotations

from typing import Any

from engine.failures import record_stage_failure
from tasks import deps
from tasks.app import app

__all__ = ["record_failure"]


@app.task(name="vcrawl.record_failure", ignore_result=True)
def record_failure(request: Any, exc: BaseException, traceback: str) -> None:
    """Errback: Celery calls it inline with the failed task's request after its last retry."""
    record_stage_failure(
        request.task,
        list(request.args or ()),
        exc,
        deps.trail(),
        deps.alerter(),
        deps.redis_client(),
        deps.settings().status_ttl_s,
    )
