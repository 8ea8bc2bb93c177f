"""What happens when a single task's fetch or analysis fails for good: its trail and one alert."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis

from engine.trail import StatusTrail
from telemetry.alerts import Alert, Alerter
from telemetry.log_context import log_context
from vcrawl import redis_keys
from vcrawl.errors import RobotsDisallowed, VcrawlError

__all__ = ["record_stage_failure"]

logger = logging.getLogger(__name__)


def record_stage_failure(
    task_name: str,
    args: Sequence[Any],
    exc: BaseException,
    trail: StatusTrail,
    alerter: Alerter,
    client: redis.Redis,
    alert_ttl_s: int,
) -> str | None:
    """Mark the task's trail failed for the stage that failed; alert once for analyses.

    Returns the trail id, or None when the failed message carries none.
    """
    reason = exc.reason if isinstance(exc, VcrawlError) else "error"
    error = str(exc) if isinstance(exc, VcrawlError) else f"{type(exc).__name__}: {exc}"
    if task_name == "vcrawl.fetch" and len(args) >= 2 and isinstance(args[1], str):
        trail_id = args[1]
        if isinstance(exc, RobotsDisallowed):
            trail.robots_blocked(trail_id, error)
            logger.info("robots.txt disallows %s: %s", trail_id, error)
            return trail_id
        trail.download_failed(trail_id, reason, error, getattr(exc, "http_status", None), task_name)
        url = args[0].get("url") if isinstance(args[0], dict) else None
        with log_context(url=str(url) if url else None):  # a final failure: worth an operator's look
            logger.warning("download failed %s (%s): %s", trail_id, url or "?", error)
        return trail_id
    if task_name == "vcrawl.analyze" and len(args) >= 2 and isinstance(args[1], dict):
        trail_id = str(args[1].get("trail_id"))
        trail.analysis_failed(trail_id, reason, error, task_name)
        # Once per task, even if the handler runs again after a redelivery.
        if client.set(redis_keys.alert_sent(trail_id, "analysis"), 1, nx=True, ex=alert_ttl_s):
            record = trail.get(trail_id) or {}
            alerter.send(
                Alert(
                    subject=f"analysis failed: {record.get('url', trail_id)}",
                    text=f"Analysis of task {trail_id} failed for good after "
                    f"{record.get('analysis_attempts', '?')} attempts: {error}",
                    details={
                        "task_id": trail_id,
                        "url": record.get("url"),
                        "analyzer": record.get("analyzer"),
                        "attempts": record.get("analysis_attempts"),
                        "reason": reason,
                        "error": error,
                        "save_path": record.get("save_path"),
                    },
                )
            )
        return trail_id
    logger.warning("failure of %s with unexpected arguments, nothing recorded: %r", task_name, exc)
    return None
