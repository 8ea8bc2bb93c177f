"""The worker pool vcrawl ships (``-P threads``), resizable while it runs; and ``vcrawl_resize``, the
remote control command that sets a node's pool size (``vcrawl nodes resize``).

Celery 5.7's ``threads`` pool (``celery.concurrency.thread.TaskPool``) runs on a
``ThreadPoolExecutor`` and has no ``grow`` or ``shrink``: Celery's ``pool_grow`` / ``pool_shrink``
remote control commands and ``--autoscale`` call them and fail on it. ``ResizableThreadPool`` is that
pool on ``cluster.threads.ResizableThreads``, with both; ``tasks.app`` makes the ``threads`` alias
name it, so ``celery -A tasks worker -P threads`` (and every worker vcrawl starts) runs it. Prefork
workers keep Celery's own pool, which grows and shrinks by itself.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.concurrency.base import apply_target
from celery.concurrency.thread import ApplyResult
from celery.concurrency.thread import TaskPool as CeleryThreadPool
from celery.worker.control import control_command

from cluster.threads import ResizableThreads

__all__ = ["MAX_CONCURRENCY", "ResizableThreadPool", "vcrawl_resize"]

logger = logging.getLogger(__name__)

MAX_CONCURRENCY = 1024  # task slots one worker may be resized to


class ResizableThreadPool(CeleryThreadPool):
    """Celery's thread pool, on threads that ``grow`` and ``shrink`` while the worker runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(CeleryThreadPool, self).__init__(*args, **kwargs)  # BasePool's: no executor of Celery's own
        self.executor = ResizableThreads(self.limit)

    def on_apply(self, target: Any, args: Any = None, kwargs: Any = None, callback: Any = None,
                 accept_callback: Any = None, **_: Any) -> ApplyResult:  # fmt: skip
        return ApplyResult(self.executor.submit(apply_target, target, args, kwargs, callback, accept_callback))

    def grow(self, n: int = 1) -> None:
        """Run ``n`` more tasks at once."""
        self.resize(self.limit + n)

    def shrink(self, n: int = 1) -> None:
        """Run ``n`` fewer tasks at once (threads go as their task in hand ends).

        Raises:
            ValueError: fewer than one slot would be left (Celery's autoscaler expects it).
        """
        self.resize(self.limit - n)

    def resize(self, size: int) -> None:
        """Run ``size`` tasks at once.

        Raises:
            ValueError: ``size`` is below 1 or above ``MAX_CONCURRENCY``.
        """
        if not 1 <= size <= MAX_CONCURRENCY:
            raise ValueError(f"a worker's pool size must be 1 to {MAX_CONCURRENCY}, got {size}")
        self.executor.resize(size)
        self.limit = size

    def _get_info(self) -> dict[str, Any]:
        info = super(CeleryThreadPool, self)._get_info()
        info.update({"max-concurrency": self.limit, "threads": self.executor.threads})
        return info


@control_command(args=[("n", int)], signature="N")
def vcrawl_resize(state: Any, n: int, **_: Any) -> dict[str, Any]:
    """Set this worker's pool to ``n`` slots (threads, or prefork processes); its prefetch follows."""
    consumer = state.consumer
    if consumer.controller.autoscaler:
        return {"error": "this worker autoscales: change its range with `celery control autoscale MAX MIN`"}
    pool = consumer.pool
    if not 1 <= n <= MAX_CONCURRENCY:
        return {"error": f"the pool size must be 1 to {MAX_CONCURRENCY}, got {n}"}
    before = int(pool.num_processes)
    if not hasattr(pool, "grow"):
        return {"error": f"the {type(pool).__module__} pool of this worker cannot be resized"}
    try:
        if n > before:
            pool.grow(n - before)
        elif n < before:
            pool.shrink(before - n)
    except ValueError as exc:  # prefork: "all processes busy"
        return {"error": f"the pool could not be resized: {exc}"}
    consumer._update_prefetch_count(n - before)  # as Celery's pool_grow / pool_shrink do
    logger.warning("pool resized from %d to %d by remote control", before, n)
    return {"ok": f"pool resized from {before} to {n}", "before": before, "concurrency": n}
