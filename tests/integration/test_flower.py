"""``vcrawl flower`` on a private redis-server with a real worker: it sees the worker and its tasks, behind auth."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from cli.local_redis import LocalRedis
from tests.brokers import BROKERS, broker_overrides
from tests.cluster import REPO, cluster_env, start_worker, stop_worker, submit, wait_all
from tests.ports import free_port
from tests.site import TestSite
from vcrawl.settings import Settings

pytestmark = pytest.mark.slow

USER, PASSWORD = "ops", "s3cret:with-a-colon"
WORKER = "flowertest"


@dataclass
class Flower:
    """A running ``vcrawl flower`` and what the test needs to talk to it."""

    url: str
    pid: int
    env: dict[str, str]
    site: TestSite
    log: Path


def _session(auth: tuple[str, str] | None = None) -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # loopback only: never through a proxy from the environment
    session.auth = auth
    return session


def _poll(what: str, check: Callable[[], Any], timeout_s: float, log: Path) -> Any:
    """Call ``check`` until it returns something truthy; fail with Flower's log after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if result := check():
                return result
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise AssertionError(f"{what}: not within {timeout_s}s; flower log:\n{tail}")
        time.sleep(0.2)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process we started (by PID), SIGKILL after 10 s, and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(params=BROKERS)
def flower(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Flower]:
    """A private redis-server, a local site, a `celery worker` and `vcrawl flower` on a free port; Celery's
    messages (and so Flower's events) on Redis or on a private RabbitMQ."""
    with (
        LocalRedis(tmp_path / "redis") as server,
        TestSite() as site,
        broker_overrides(request.param, tmp_path) as broker,
    ):
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data"), min_interval_s=0.0, **broker))
        env.pop("FLOWER_BASIC_AUTH", None)
        worker = start_worker(env, WORKER, tmp_path / "worker.log")
        try:
            port = free_port()
            log = tmp_path / "flower.log"
            with open(log, "ab") as out:
                process = subprocess.Popen(
                    [sys.executable, "-m", "cli", "flower", "--port", str(port)],
                    env={**env, "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}"},
                    cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                )  # fmt: skip
            try:
                url = f"http://127.0.0.1:{port}"
                with _session() as http:

                    def healthy() -> bool:
                        if process.poll() is not None:
                            raise AssertionError(f"flower exited with {process.returncode}:\n{log.read_text()[-3000:]}")
                        return http.get(f"{url}/healthcheck", timeout=2).text == "OK"

                    _poll("flower answers /healthcheck", healthy, 20, log)
                yield Flower(url, process.pid, env, site, log)
            finally:
                _stop(process)
        finally:
            stop_worker(worker)


def test_flower_sees_the_worker_and_a_finished_fetch_behind_basic_auth(flower: Flower) -> None:
    cmdline = Path(f"/proc/{flower.pid}/cmdline").read_bytes().split(b"\0")
    assert b"flower" in cmdline and b"--address=127.0.0.1" in cmdline  # exec'd: the PID is Flower itself
    assert not any(PASSWORD.encode() in arg for arg in cmdline)  # credentials came through the environment

    with _session() as anonymous, _session((USER, "wrong")) as wrong, _session((USER, PASSWORD)) as http:
        assert anonymous.get(f"{flower.url}/api/workers", timeout=5).status_code == 401
        refused = anonymous.get(f"{flower.url}/workers", timeout=5)  # the web UI too
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic")
        assert wrong.get(f"{flower.url}/api/workers", timeout=5).status_code == 401

        def worker_listed() -> list[str]:
            answer = http.get(f"{flower.url}/api/workers", params={"refresh": "1"}, timeout=10)
            assert answer.status_code == 200, answer.text
            return [name for name in answer.json() if name.startswith(f"{WORKER}@")]

        [worker_name] = _poll("the worker in /api/workers", worker_listed, 15, flower.log)

        # Flower only sees events sent after its receiver is bound: a heartbeat in /metrics proves it is.
        # /metrics answers without credentials (as /healthcheck does): keep Flower on loopback.
        online = f'flower_worker_online{{worker="{worker_name}"}} 1.0'

        def heartbeat_seen() -> bool:
            return online in anonymous.get(f"{flower.url}/metrics", timeout=5).text

        _poll("a worker heartbeat in /metrics", heartbeat_seen, 15, flower.log)

        page = flower.site.add_page("/flower.html", "<a href='/elsewhere.html'>x</a>")
        [task_id] = submit(flower.env, [{"url": page}])
        wait_all(flower.env, [task_id], {"analyzed"}, 30)

        def both_succeeded() -> tuple[dict[str, Any], dict[str, Any]] | None:
            answer = http.get(f"{flower.url}/api/tasks", params={"state": "SUCCESS"}, timeout=5)
            assert answer.status_code == 200, answer.text
            done = answer.json()
            analyses = [task for task in done.values() if task["name"] == "vcrawl.analyze"]
            return (done[task_id], analyses[0]) if task_id in done and analyses else None

        fetch, analysis = _poll("fetch and analysis as SUCCESS in /api/tasks", both_succeeded, 15, flower.log)
        assert fetch["name"] == "vcrawl.fetch" and fetch["state"] == "SUCCESS"
        assert fetch["worker"] == analysis["worker"] == worker_name
        # Which queue each went through (from task-sent events): download vs analysis throughput.
        assert (fetch["routing_key"], analysis["routing_key"]) == ("download", "analysis")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "FLOWER_BASIC_AUTH is not set"),
        (("--insecure-local", "--address", "0.0.0.0"), "only allowed on a loopback address"),
    ],
)
def test_flower_refuses_to_start_without_credentials(args: tuple[str, ...], message: str) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("VCRAWL_", "FLOWER_"))}
    done = subprocess.run(
        [sys.executable, "-m", "cli", "flower", "--port", str(free_port()), *args],
        env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr and done.stdout == ""
