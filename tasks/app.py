"""The Celery application: its configuration is built from ``vcrawl.settings`` when first needed.

``celeryconfig.celery_settings`` turns this process's ``Settings`` into Celery's settings; they are
read from the environment when the app first needs its configuration (a worker starting, a task
sent), never at import (``_EnvironmentSettings``). ``include`` lists what every worker imports at
start: the task modules and ``tasks.boot``, the worker's boot (its signals), which nothing else imports.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from celery import Celery, concurrency

from celeryconfig import celery_settings
from tasks.broker.guard import guard_redis_qos, reconnect_at_transport_pace, reuse_redis_clients
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings
from vcrawl.targets.broker import delayed_delivery_countdown

__all__ = ["app"]

_TASK_MODULES = (
    "tasks.crawl",
    "tasks.fetch",
    "tasks.analyze",
    "tasks.failures",
    "tasks.batches",
    "tasks.proxy_harvest",
)


class _EnvironmentSettings(Mapping[str, Any]):
    """Celery's settings for this process's ``VCRAWL_*`` environment, built on first read, never at import.

    A config source (not ``add_defaults``): Celery reads it before it swaps the settings into
    ``app.conf``, so another thread never sees the bare defaults (no broker) in between. A bad
    variable stops the process naming it, as ``tasks.boot`` does for a worker's other checks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: dict[str, Any] | None = None

    def _settings(self) -> dict[str, Any]:
        with self._lock:
            if self._built is None:
                try:
                    self._built = celery_settings(Settings.from_env())
                except ConfigError as exc:
                    raise SystemExit(f"vcrawl: configuration error: {exc}") from exc
            return self._built

    def __getitem__(self, key: str) -> Any:
        return self._settings()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._settings())

    def __len__(self) -> int:
        return len(self._settings())


class _VcrawlCelery(Celery):
    """Celery whose countdowns suit RabbitMQ's native delayed delivery when vcrawl's queues are quorum queues."""

    def send_task(self, name: str, *args: Any, **options: Any) -> Any:
        # Every retry and countdown of vcrawl's tasks comes through here (apply_async, Task.retry).
        countdown = options.get("countdown")
        if countdown and self.conf.task_default_queue_type == "quorum":
            options["countdown"] = delayed_delivery_countdown(float(countdown))
        return super().send_task(name, *args, **options)


app = _VcrawlCelery("vcrawl", include=[*_TASK_MODULES, "tasks.boot"])
# Celery's ``threads`` pool can neither grow nor shrink; every worker of this app (``-P threads``, the
# pool vcrawl ships) runs vcrawl's, which can (``tasks.pool``). A name, not an import: Celery imports
# it when a worker starts, so importing the app imports no pool.
concurrency.ALIASES["threads"] = "tasks.pool:ResizableThreadPool"
app.config_from_object(_EnvironmentSettings())


@app.on_after_configure.connect
def _patch_kombu(**_: Any) -> None:
    # When the app first reads its configuration: before a worker consumes or a producer publishes,
    # since both need it to connect, and never at import. Every patch is idempotent.
    guard_redis_qos()  # workers must survive a Redis restart (see tasks/broker/guard.py)
    reuse_redis_clients()  # one kombu client per channel, not one per publish and ack
    reconnect_at_transport_pace()  # a worker back on Redis within a second or two of its return
