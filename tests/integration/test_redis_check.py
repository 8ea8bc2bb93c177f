"""A worker on a Redis that can lose data says so loudly at start-up, and still starts."""

from __future__ import annotations

import pytest
from pytest_celery import CeleryTestSetup

pytestmark = pytest.mark.slow

CARELESS_REDIS = {"appendonly": "no", "save": "", "maxmemory": "100mb", "maxmemory-policy": "allkeys-lru"}


@pytest.mark.parametrize("celery_redis_config", [CARELESS_REDIS], ids=["careless-redis"])
def test_a_worker_warns_when_redis_can_lose_data(celery_setup: CeleryTestSetup) -> None:
    assert celery_setup.ready(control=True, docker=True)  # it still starts: a warning, not a refusal
    celery_setup.worker.assert_log_exists("REDIS CAN LOSE DATA: appendonly is no and save is empty")
    celery_setup.worker.assert_log_exists("REDIS CAN LOSE DATA: maxmemory-policy is allkeys-lru")


def test_a_worker_on_a_persistent_redis_does_not_warn(celery_setup: CeleryTestSetup) -> None:
    # The setup's Redis has AOF on and noeviction: what the README asks for. The check runs at
    # worker_init, before the worker answered the ping that made it ready.
    celery_setup.worker.assert_log_exists(f"{celery_setup.worker.hostname()} ready.")
    celery_setup.worker.assert_log_does_not_exist("REDIS CAN LOSE DATA")
