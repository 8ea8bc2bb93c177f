"""The fault report: each fault test notes what happened; `tests/faults/report.py` prints it.

With ``VCRAWL_FAULTS_REPORT=FILE`` set, every test that uses ``fault_report`` appends one JSON
line to FILE: its name, whether it passed, its duration and the figures it noted.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import broker_node
from tests.rabbitmq import LocalRabbitMQ

REPORT_ENV = "VCRAWL_FAULTS_REPORT"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"_vcrawl_{report.when}", report)  # read back by the fixture's teardown
    return report


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> Iterator[Callable[..., None]]:
    """``note(key=value, ...)``: figures for the report line of this test."""
    noted: dict[str, Any] = {}
    started = time.monotonic()
    yield noted.update
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    call = getattr(request.node, "_vcrawl_call", None)
    line = {
        "test": request.node.name,
        "passed": bool(call is not None and call.passed),
        "seconds": round(time.monotonic() - started, 1),
        **noted,
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line, sort_keys=True) + "\n")


@pytest.fixture
def rabbitmq(broker: str, tmp_path: Path) -> Iterator[LocalRabbitMQ | None]:
    """The test's RabbitMQ node when it runs with ``broker`` "rabbitmq" (tests/faults/brokers.py), else None."""
    with broker_node(broker, tmp_path / "rabbitmq") as node:
        yield node
