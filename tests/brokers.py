"""The broker a test's Celery messages go through: Redis (as shipped) or a private RabbitMQ node.

A test or fixture parametrised with ``BROKERS`` runs once per broker; the RabbitMQ run carries the
``rabbitmq`` marker (``make test-rabbitmq``). ``broker_overrides`` starts what the broker needs and
gives the ``Settings`` fields that point Celery's messages at it (nothing for Redis: ``redis_url``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.rabbitmq import LocalRabbitMQ

__all__ = ["BROKERS", "broker_overrides"]

BROKERS = ["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]


@contextmanager
def broker_overrides(kind: str, directory: Path) -> Iterator[dict[str, Any]]:
    """``{}`` for ``redis``; for ``rabbitmq`` a node started in ``directory`` (stopped after) and its URL."""
    if kind == "redis":
        yield {}
        return
    assert kind == "rabbitmq", kind
    with LocalRabbitMQ(directory / "rabbitmq") as node:
        yield {"broker_url": node.url}
