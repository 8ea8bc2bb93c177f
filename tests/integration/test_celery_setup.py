"""pytest-celery's ``celery_setup`` on local processes: a private Redis and a ``celery -A tasks worker``.

The node and setup API is pytest-celery's (readiness, control ping, log waits); the processes
come from tests/celery_setup.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_celery import CeleryTestSetup

from tests.cluster import submit, wait_all
from tests.site import TestSite

pytestmark = pytest.mark.slow


def test_the_setup_is_a_local_redis_and_a_vcrawl_worker_on_its_queues(celery_setup: CeleryTestSetup) -> None:
    assert celery_setup.ready(control=True, docker=True)  # every node up; every worker answers a ping
    worker = celery_setup.worker
    assert worker.worker_name == "vcrawl"
    assert celery_setup.broker.config()["host_url"] == celery_setup.app.conf.broker_url
    assert celery_setup.backend.config()["host_url"] == celery_setup.app.conf.result_backend
    queues = celery_setup.app.control.inspect([worker.hostname()], timeout=2).active_queues()
    assert sorted(q["name"] for q in queues[worker.hostname()]) == ["analysis", "download", "download.dynamic"]
    worker.assert_log_exists(f"{worker.hostname()} ready.")


def test_crawl_delay_runs_end_to_end_on_the_setup_worker(
    celery_setup: CeleryTestSetup, celery_worker_env: dict[str, str]
) -> None:
    with TestSite() as site:
        site.add_page("/", '<a href="/a">a</a> <a href="/b">b</a>')
        [task_id] = submit(celery_worker_env, [{"url": site.url("/")}])  # crawl.delay in another process
        record = wait_all(celery_worker_env, [task_id], {"analyzed"}, timeout_s=30)[task_id]
    assert record["http_status"] == 200
    assert Path(record["save_path"]).read_bytes().startswith(b'<a href="/a">')
    # The worker received the download and then the analysis the link chained to it.
    celery_setup.worker.assert_log_exists(f"Task vcrawl.fetch[{task_id}] succeeded")
    celery_setup.worker.assert_log_exists("Task vcrawl.analyze[")


def test_a_task_sent_by_the_setup_app_is_crawled(
    celery_setup: CeleryTestSetup, celery_worker_env: dict[str, str]
) -> None:
    with TestSite() as site:
        site.add_page("/", "hello")
        # The setup app is a producer that is not vcrawl: its crawl message runs the task's body.
        result = celery_setup.app.send_task("vcrawl.crawl", args=[{"url": site.url("/")}])
        record = wait_all(celery_worker_env, [result.id], {"analyzed"}, timeout_s=30)[result.id]
    assert Path(record["save_path"]).read_bytes() == b"hello"
    celery_setup.worker.assert_log_exists(f"Task vcrawl.crawl[{result.id}] received")
