"""The Celery application; configuration comes from ``celeryconfig``."""

from __future__ import annotations

from typing import Any

from celery import Celery

from tasks.broker.guard import guard_redis_qos, reconnect_at_transport_pace, reuse_redis_clients

__all__ = ["app"]

app = Celery(
    "vcrawl",
    include=["tasks.crawl", "tasks.fetch", "tasks.analyze", "tasks.failures", "tasks.batches", "tasks.proxy_harvest"],
)
app.config_from_object("celeryconfig")


@app.on_after_configure.connect
def _patch_kombu(**_: Any) -> None:
    # When the app first reads its configuration: before a worker consumes or a producer publishes,
    # since both need it to connect, and never at import. Every patch is idempotent.
    guard_redis_qos()  # workers must survive a Redis restart (see tasks/broker/guard.py)
    reuse_redis_clients()  # one kombu client per channel, not one per publish and ack
    reconnect_at_transport_pace()  # a worker back on Redis within a second or two of its return
