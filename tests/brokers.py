"""The broker a test's Celery messages go through: Redis (as shipped) or a private RabbitMQ node.

A test or fixture parametrised with ``BROKERS`` runs twice: ``[redis]`` and ``[rabbitmq]`` (marker
``rabbitmq``: ``make test-rabbitmq``), where Celery's messages go through RabbitMQ and everything else
(frontier, results, membership) stays on the test's Redis. ``broker_node`` starts the node;
``on_broker`` and ``broker_overrides`` give the settings that point Celery at it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.rabbitmq import LocalRabbitMQ
from vcrawl.settings import Settings

__all__ = ["BROKERS", "broker_node", "broker_overrides", "on_broker", "rabbitmq_queues"]

BROKERS = [pytest.param("redis", id="redis"), pytest.param("rabbitmq", id="rabbitmq", marks=pytest.mark.rabbitmq)]
_NODES: dict[str, LocalRabbitMQ] = {}  # the running nodes by URL, for rabbitmq_queues


@contextmanager
def broker_node(broker: str, directory: Path, listen_also: Sequence[str] = ()) -> Iterator[LocalRabbitMQ | None]:
    """A started RabbitMQ node in ``directory`` for ``broker`` "rabbitmq" (stopped after), None for "redis"."""
    if broker == "redis":
        yield None
        return
    assert broker == "rabbitmq", f"no broker {broker!r}; known: redis, rabbitmq"
    with LocalRabbitMQ(directory, name="vcrawl-test", listen_also=listen_also) as node:
        _NODES[node.url] = node
        try:
            yield node
        finally:
            _NODES.pop(node.url, None)


def on_broker(settings: Settings, node: LocalRabbitMQ | None, address: str = "127.0.0.1") -> Settings:
    """``settings`` with Celery's messages through ``node`` (reached at ``address``), or as they are."""
    return settings if node is None else replace(settings, broker_url=node.url_on(address))


@contextmanager
def broker_overrides(broker: str, directory: Path) -> Iterator[dict[str, Any]]:
    """``{}`` for "redis"; for "rabbitmq" a node started in ``directory``/rabbitmq (stopped after) and its URL,
    as ``Settings`` fields."""
    with broker_node(broker, directory / "rabbitmq") as node:
        yield {} if node is None else {"broker_url": node.url}


def rabbitmq_queues(overrides: dict[str, Any]) -> dict[str, int]:
    """The queues on the RabbitMQ node of ``overrides`` (``broker_overrides``), with their ready messages."""
    listing = _NODES[overrides["broker_url"]].ctl("list_queues", "name", "messages", "--no-table-headers", "-q")
    rows = (line.split("\t") for line in listing.stdout.decode().splitlines() if "\t" in line)
    return {name: int(count) for name, count in rows}
