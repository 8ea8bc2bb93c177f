"""The broker a fault test runs on: Redis, as ever, or a private RabbitMQ node (``VCRAWL_BROKER_URL``).

A test parametrised with ``BROKERS`` runs twice: ``[redis]`` (``make test-faults``) and ``[rabbitmq]``
(marker ``rabbitmq``: ``make test-rabbitmq``), where Celery's messages go through RabbitMQ and everything
else (frontier, results, membership) stays on the test's Redis. The ``rabbitmq`` fixture of
tests/faults/conftest.py starts the node for the latter.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from tests.rabbitmq import LocalRabbitMQ
from vcrawl.settings import Settings

__all__ = ["BROKERS", "broker_node", "on_broker"]

BROKERS = [pytest.param("redis", id="redis"), pytest.param("rabbitmq", id="rabbitmq", marks=pytest.mark.rabbitmq)]


@contextmanager
def broker_node(broker: str, directory: Path, listen_also: Sequence[str] = ()) -> Iterator[LocalRabbitMQ | None]:
    """A started RabbitMQ node in ``directory`` for ``broker`` "rabbitmq" (stopped after), None for "redis"."""
    if broker == "redis":
        yield None
        return
    assert broker == "rabbitmq", f"no broker {broker!r}; known: redis, rabbitmq"
    with LocalRabbitMQ(directory, name="vcrawl-faults", listen_also=listen_also) as node:
        yield node


def on_broker(settings: Settings, node: LocalRabbitMQ | None, address: str = "127.0.0.1") -> Settings:
    """``settings`` with Celery's messages through ``node`` (reached at ``address``), or as they are."""
    return settings if node is None else replace(settings, broker_url=node.url_on(address))
