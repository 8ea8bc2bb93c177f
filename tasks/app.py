"""The Celery application: its configuration is built from ``vcrawl.settings`` when first needed.

``celeryconfig.celery_settings`` turns this process's ``Settings`` into Celery's settings; they are
read from the environment when the app first needs its configuration (a worker starting, a task
sent), never at import. ``include`` lists what every worker imports at start: the task modules and
``tasks.boot``, the worker's boot (its signals), which nothing else imports.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from celeryconfig import celery_settings
from tasks.broker.guard import guard_redis_qos, reconnect_at_transport_pace, reuse_redis_clients
from vcrawl.settings import Settings

__all__ = ["app"]

_TASK_MODULES = (
    "tasks.crawl",
    "tasks.fetch",
    "tasks.analyze",
    "tasks.failures",
    "tasks.batches",
    "tasks.proxy_harvest",
)
app = Celery("vcrawl", include=[*_TASK_MODULES, "tasks.boot"])
app.add_defaults(lambda: celery_settings(Settings.from_env()))


@app.on_after_configure.connect
def _patch_kombu(**_: Any) -> None:
    # When the app first reads its configuration: before a worker consumes or a producer publishes,
    # since both need it to connect, and never at import. Every patch is idempotent.
    guard_redis_qos()  # workers must survive a Redis restart (see tasks/broker/guard.py)
    reuse_redis_clients()  # one kombu client per channel, not one per publish and ack
    reconnect_at_transport_pace()  # a worker back on Redis within a second or two of its return
