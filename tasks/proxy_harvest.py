"""``vcrawl.harvest_proxies``: what beat fires every ``VCRAWL_PROXY_HARVEST_EVERY_S`` when proxy sources are set."""

from __future__ import annotations

from typing import Any

from celeryconfig import PROXY_HARVEST_TASK
from fetchers.proxy_harvest import harvest_with_settings
from tasks import deps
from tasks.app import app

__all__ = ["harvest_proxies"]


# No arguments: the sources come from the operator's settings only, never from a message. Not
# retried: a run that fails leaves the pool as it was, and the next firing harvests again.
@app.task(name=PROXY_HARVEST_TASK, acks_late=True, ignore_result=True)
def harvest_proxies() -> dict[str, Any]:
    """Harvest the configured proxy sources into the pool (fetchers.proxy_harvest)."""
    return harvest_with_settings(deps.settings(), deps.redis_client()).to_dict()
