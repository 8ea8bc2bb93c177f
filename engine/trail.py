"""The status trail: one Redis hash per submitted task, from ``queued`` to its end.

States: queued -> downloading -> downloaded | download_failed | robots_blocked -> analyzing ->
analyzed | analysis_failed. A retry puts a task back to ``queued`` (download) or
``downloaded`` (analysis) with ``last_error`` and ``retry_at``. Each state also
stamps ``<state>_at`` (Unix seconds), so the hash is the whole history.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import redis

from frontier.url_ids import url_id
from vcrawl import names, redis_keys
from vcrawl.lua import script_text
from vcrawl.payloads import DownloadTask, FetchedPage

__all__ = ["STATES", "TERMINAL_STATES", "StatusTrail"]

STATES = names.TASK_STATES
TERMINAL_STATES = frozenset(names.TASK_FINAL_STATES)
_INT_FIELDS = frozenset({"http_status", "bytes", "attempts", "analysis_attempts", "result_bytes", "items"})
_FLOAT_FIELDS = frozenset({"retry_at", "elapsed_s"} | {f"{state}_at" for state in STATES})


class StatusTrail:
    """Writes and reads the status hashes; every write is one pipelined round trip."""

    def __init__(self, client: redis.Redis, ttl_s: int, clock: Callable[[], float] = time.time) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._clock = clock
        self._transition = client.register_script(script_text(resources.files("engine") / "lua", "trail_transition"))

    def queued(self, trail_id: str, task: DownloadTask) -> None:
        """Record a newly submitted task."""
        self._write(
            trail_id,
            names.TASK_QUEUED,
            url=task.url,
            url_id=url_id(task.url),
            page_type=task.page_type,
            analyzer=task.analyzer,
            job=task.job,
            save_path=task.save_path,
            result_path=task.result_path,
        )

    def downloading(self, trail_id: str) -> int:
        """Record the start of a download attempt; return its number (1 for the first)."""
        return self._start_attempt(trail_id, names.TASK_DOWNLOADING, "attempts")

    def downloaded(self, trail_id: str, page: FetchedPage, stored_at: str) -> None:
        """Record a stored page and where it is (absolute path or URL)."""
        self._write(
            trail_id,
            names.TASK_DOWNLOADED,
            http_status=page.http_status,
            bytes=page.bytes,
            final_url=page.final_url,
            content_type=page.content_type,
            save_path=stored_at,
            elapsed_s=round(page.elapsed_s, 4),
            ip=page.ip or None,  # the server's address; left out when unknown
        )

    def download_failed(
        self, trail_id: str, reason: str, error: str, http_status: int | None, failed_task: str
    ) -> None:
        """Record a download that ended for good (``failed_task``: the task name that failed)."""
        self._write(
            trail_id,
            names.TASK_DOWNLOAD_FAILED,
            reason=reason,
            error=error,
            http_status=http_status,
            failed_task=failed_task,
        )

    def robots_blocked(self, trail_id: str, error: str) -> None:
        """Record a task whose URL robots.txt disallows: it ends without a request for the page."""
        self._write(
            trail_id, names.TASK_ROBOTS_BLOCKED, reason="robots_blocked", error=error, failed_task="vcrawl.fetch"
        )

    def analyzing(self, trail_id: str) -> int:
        """Record the start of an analysis attempt; return its number."""
        return self._start_attempt(trail_id, names.TASK_ANALYZING, "analysis_attempts")

    def analyzed(self, trail_id: str, result_path: str, result_bytes: int, items: int) -> None:
        """Record a written analysis result."""
        self._write(trail_id, names.TASK_ANALYZED, result_path=result_path, result_bytes=result_bytes, items=items)

    def analysis_failed(self, trail_id: str, reason: str, error: str, failed_task: str) -> None:
        """Record an analysis that ended for good."""
        self._write(trail_id, names.TASK_ANALYSIS_FAILED, reason=reason, error=error, failed_task=failed_task)

    def will_retry(self, trail_id: str, stage: str, error: str, delay_s: float) -> None:
        """Record a failed attempt that will be tried again in ``delay_s`` seconds."""
        waiting_state, interrupted = (
            (names.TASK_QUEUED, names.TASK_DOWNLOADING)
            if stage == "download"
            else (names.TASK_DOWNLOADED, names.TASK_ANALYZING)
        )
        retry_at = round(self._clock() + delay_s, 3)
        self._apply(trail_id, waiting_state, retry_from=interrupted, last_error=error, retry_at=retry_at)

    def get(self, trail_id: str) -> dict[str, Any] | None:
        """Return the trail of ``trail_id`` (numbers decoded), or None if unknown or expired."""
        raw = self._redis.hgetall(redis_keys.task_status(trail_id))
        if not raw:
            return None
        return decode(trail_id, raw)

    def get_many(self, trail_ids: list[str]) -> dict[str, dict[str, Any] | None]:
        """Return several trails in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for trail_id in trail_ids:
            pipe.hgetall(redis_keys.task_status(trail_id))
        return {
            trail_id: decode(trail_id, raw) if raw else None
            for trail_id, raw in zip(trail_ids, pipe.execute(), strict=True)
        }

    def _start_attempt(self, trail_id: str, state: str, counter: str) -> int:
        return self._apply(trail_id, state, counter=counter)

    def _write(self, trail_id: str, state: str, **values: Any) -> None:
        self._apply(trail_id, state, **values)

    def _apply(self, trail_id: str, state: str, counter: str = "", retry_from: str = "", **values: Any) -> int:
        """Move to ``state`` unless that would go back; return the new value of ``counter``."""
        pairs: list[Any] = []
        for name, value in values.items():
            if value is not None:
                pairs.extend((name, value))
        _, count = self._transition(
            keys=[redis_keys.task_status(trail_id)],
            args=[state, self._ttl_s, round(self._clock(), 3), counter, retry_from, *pairs],
        )
        return int(count)


def decode(trail_id: str, raw: Mapping[str, str]) -> dict[str, Any]:
    """Turn a raw status hash into a dict with numbers and the always-present keys."""
    record: dict[str, Any] = {
        "id": trail_id,
        "state": None,
        "http_status": None,
        "save_path": None,
        "result_path": None,
        "attempts": 0,
        "analysis_attempts": 0,
        "error": None,
    }
    for name, value in raw.items():
        if name in _INT_FIELDS:
            record[name] = int(value)
        elif name in _FLOAT_FIELDS:
            record[name] = float(value)
        else:
            record[name] = value
    return record
