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

__all__ = ["BROKERS", "broker_overrides", "rabbitmq_queues"]

BROKERS = ["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]
_NODES: dict[str, LocalRabbitMQ] = {}  # the running nodes by URL, for rabbitmq_queues


@contextmanager
def broker_overrides(kind: str, directory: Path) -> Iterator[dict[str, Any]]:
    """``{}`` for ``redis``; for ``rabbitmq`` a node started in ``directory`` (stopped after) and its URL."""
    if kind == "redis":
        yield {}
        return
    assert kind == "rabbitmq", kind
    with LocalRabbitMQ(directory / "rabbitmq") as node:
        _NODES[node.url] = node
        try:
            yield {"broker_url": node.url}
        finally:
            _NODES.pop(node.url, None)


def rabbitmq_queues(overrides: dict[str, Any]) -> dict[str, int]:
    """The queues on the RabbitMQ node of ``overrides`` (``broker_overrides``), with their ready messages."""
    listing = _NODES[overrides["broker_url"]].ctl("list_queues", "name", "messages", "--no-table-headers", "-q")
    rows = (line.split("\t") for line in listing.stdout.decode().splitlines() if "\t" in line)
    return {name: int(count) for name, count in rows}
