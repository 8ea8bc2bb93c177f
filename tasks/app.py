"""The Celery application; configuration comes from ``celeryconfig``."""

from __future__ import annotations

from celery import Celery

__all__ = ["app"]

app = Celery(
    "vcrawl",
    include=["tasks.crawl", "tasks.fetch", "tasks.analyze", "tasks.failures", "tasks.batches"],
)
app.config_from_object("celeryconfig")
