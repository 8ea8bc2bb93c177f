"""A worker SIGKILLed during a slow download: the task is redelivered to a new worker and completes.

Runs on pytest-celery's ``celery_setup`` (its own redis-server and `celery worker` subprocesses,
tests/celery_setup.py), so the session's in-process worker cannot take the task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pytest_celery import CeleryTestSetup, CeleryTestWorker

from tests.cluster import submit, wait_all, worker_start_with_plugins
from tests.site import Response, TestSite

# Short, so the killed worker is declared down (and its message put back) within seconds; the
# shipped 30 s is tests/faults/test_orphans.py's. The visibility timeout stays at its shipped hour.
NODE_TIMEOUT_S = 4.0

pytestmark = pytest.mark.slow


@pytest.fixture
def celery_worker_overrides() -> dict[str, Any]:
    """Short timeouts, so a killed worker's message comes back within seconds (at once when it is declared down)."""
    return {
        "min_interval_s": 0.0,
        "total_timeout_s": 4.0,
        "read_timeout_s": 3.0,
        "max_retry_after_s": 1.0,
        "node_timeout_s": NODE_TIMEOUT_S,
    }


def test_sigkilled_worker_task_is_redelivered_and_completes(
    celery_setup: CeleryTestSetup,
    celery_worker_env: dict[str, str],
    start_celery_worker: Callable[..., CeleryTestWorker],
) -> None:
    first = celery_setup.worker
    with TestSite() as site:
        url = site.add_response("/slow.html", Response(b"<a href='/next'>next</a>", delay_s=2.5))
        [task_id] = submit(celery_worker_env, [{"url": url}])
        deadline = time.monotonic() + 20
        while not site.requests_to("/slow.html") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert site.requests_to("/slow.html"), "the first worker never started the download"

        first.kill("SIGKILL")  # mid-download: the message is still unacked
        assert first.container.status == "exited"
        second = start_celery_worker("second")

        record = wait_all(celery_worker_env, [task_id], {"analyzed"}, NODE_TIMEOUT_S + 40)[task_id]
        assert record["attempts"] == 2  # the killed attempt and the redelivered one
        assert len(site.requests_to("/slow.html")) == 2
        assert Path(record["save_path"]).read_bytes() == b"<a href='/next'>next</a>"
    second.assert_log_exists(f"Task vcrawl.fetch[{task_id}] succeeded")


def test_worker_with_a_clashing_analyzer_plugin_refuses_to_start(tmp_path: Path) -> None:
    clash_site = Path(__file__).resolve().parents[1] / "plugin_site_clash"
    done = worker_start_with_plugins(tmp_path, clash_site)
    assert done.returncode != 0
    assert "links" in done.stderr and "vcrawl_clash_plugin" in done.stderr
