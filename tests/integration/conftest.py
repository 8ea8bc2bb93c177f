"""Real parts for integration tests: redis-server, an SMTP server, a webhook receiver, a worker,
and pytest-celery's test setup on local processes (``celery_setup``)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
from aiosmtpd.controller import Controller
from celery import Celery
from pytest_celery import (
    CeleryBackendCluster,
    CeleryBrokerCluster,
    CeleryTestBackend,
    CeleryTestBroker,
    CeleryTestSetup,
    CeleryTestWorker,
)

import tasks
from cli.local_redis import LocalRedis
from fetchers import BrowserConfig
from tasks.embedded import EmbeddedWorker
from tests.celery_setup import LocalRedisProcess, LocalWorkerProcess, VcrawlTestSetup
from tests.cluster import cluster_env
from tests.conftest import TEST_ALLOWED_NETWORKS
from tests.ports import free_port
from tests.site import TestSite
from tests.waiting import wait_until
from vcrawl import redis_keys
from vcrawl.settings import Settings

TEST_USER_AGENTS = tuple(f"vcrawl-test-agent/{n}.0 (+loopback)" for n in range(1, 6))
TEST_REFERERS = tuple(f"http://referer-{n}.test/" for n in range(1, 5))
MAX_BODY_BYTES = 256 * 1024
TEST_API_SECRET = "Bearer api-secret-5e7f9a1c3b"  # a stand-in, sent only to the test sites on loopback


@dataclass
class AlertSinks:
    """What the local SMTP server and webhook receiver got."""

    emails: list[Message] = field(default_factory=list)
    webhooks: list[dict[str, Any]] = field(default_factory=list)
    smtp_port: int = 0
    webhook_url: str = ""

    def received(
        self, webhook: Callable[[dict[str, Any]], bool], email: Callable[[Message], bool], timeout_s: float = 5.0
    ) -> tuple[list[dict[str, Any]], list[Message]]:
        """The webhook posts and emails that match, once both kinds came (within ``timeout_s``), and
        0.5 s more in which a duplicate would arrive. Alerts go out after the state that causes them
        is written, from the worker, over SMTP and HTTP: a test polls for them, never sleeps a guess."""

        def matching() -> tuple[list[dict[str, Any]], list[Message]]:
            return [w for w in self.webhooks if webhook(w)], [m for m in self.emails if email(m)]

        deadline = time.monotonic() + timeout_s
        while not all(matching()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        return matching()


class _SmtpHandler:
    def __init__(self, sinks: AlertSinks) -> None:
        self._sinks = sinks

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd API
        self._sinks.emails.append(message_from_bytes(envelope.content))
        return "250 OK"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    """A real redis-server on a free loopback port for the whole session."""
    with LocalRedis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def alert_sinks() -> Iterator[AlertSinks]:
    """A real SMTP server (aiosmtpd) and an HTTP webhook receiver on loopback."""
    sinks = AlertSinks()
    sinks.smtp_port = free_port()  # aiosmtpd checks readiness by connecting, so port 0 won't do
    smtp = Controller(_SmtpHandler(sinks), hostname="127.0.0.1", port=sinks.smtp_port)
    smtp.start()

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            sinks.webhooks.append(json.loads(self.rfile.read(length)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    sinks.webhook_url = f"http://127.0.0.1:{receiver.server_address[1]}/alerts"
    yield sinks
    receiver.shutdown()
    receiver.server_close()
    smtp.stop()


@pytest.fixture(scope="session")
def vcrawl_settings(
    redis_server: LocalRedis, alert_sinks: AlertSinks, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    """Settings for the session: fast backoff, small body cap, known header lists, alert sinks."""
    # VCRAWL_TEST_SPLIT_FRONTIER=1: the frontier in another database of the session's server, so a
    # frontier key read or written through the broker's client (or the other way) is not found.
    split = os.environ.get("VCRAWL_TEST_SPLIT_FRONTIER") == "1"
    settings = Settings(
        redis_url=redis_server.url,
        frontier_url=redis_server.url.rsplit("/", 1)[0] + "/3" if split else None,
        data=str(tmp_path_factory.mktemp("crawl-data")),
        user_agents=TEST_USER_AGENTS,
        referers=TEST_REFERERS,
        connect_timeout_s=2.0,
        read_timeout_s=3.0,
        total_timeout_s=10.0,
        max_body_bytes=MAX_BODY_BYTES,
        fetch_backoff_s=0.05,
        fetch_backoff_max_s=1.0,
        max_retry_after_s=5.0,
        min_interval_s=0.0,
        analysis_backoff_s=0.05,
        alert_webhook_url=alert_sinks.webhook_url,
        alert_email_to=("ops@example.test",),
        smtp_host="127.0.0.1",
        smtp_port=alert_sinks.smtp_port,
        visibility_timeout_s=120.0,
        robots_error_ttl_s=1.0,
        browser_page_timeout_s=5.0,
        browser_lazy_timeout_s=5.0,
        allowed_networks=TEST_ALLOWED_NETWORKS,  # the test sites are on loopback
        api_auth={"TEST": TEST_API_SECRET},  # the worker's VCRAWL_API_AUTH_TEST (test_api_mode)
    )
    tasks.configure(settings)
    return settings


def redis_env(settings: Settings) -> dict[str, str]:
    """The variables that point a CLI subprocess at ``settings``' Redis: the broker's, and the frontier's if its own."""
    env = {"VCRAWL_REDIS_URL": settings.redis_url}
    if settings.frontier_url is not None:
        env["VCRAWL_FRONTIER_URL"] = settings.frontier_url
    return env


@pytest.fixture(scope="session")
def worker(vcrawl_settings: Settings) -> Iterator[EmbeddedWorker]:
    """A real Celery worker (thread pool) consuming both queues, in this process."""
    with EmbeddedWorker(concurrency=8, hostname="pytest@localhost", loglevel="WARNING") as running:
        yield running


@pytest.fixture(autouse=True)
def _no_robots_rules_from_earlier_tests(request: pytest.FixtureRequest) -> None:
    """Tests on the session's worker start with no robots.txt rules cached, in Redis or in this process.

    Ports are reused within a session, on 127.0.0.1 and on the other loopback hosts alike: rules an
    earlier test's site left for ``host:port`` (kept a day) must not decide this test's crawl.
    """
    if "worker" not in request.fixturenames:
        return  # a test with its own Redis and workers: nothing of the session's is in its way
    request.getfixturevalue("worker")  # the session's Redis and settings are up
    tasks.deps.robots().forget_local()
    client = tasks.deps.frontier_client()
    stale = list(client.scan_iter(match=redis_keys.robots("*"), count=1000))
    if stale:
        client.delete(*stale)


@pytest.fixture(autouse=True)
def _no_proxy_marks_from_earlier_tests(request: pytest.FixtureRequest) -> None:
    """Tests on the session's worker start with no proxy benched, in Redis or in this process.

    The worker's bench keeps its own marks (60 s by default) whatever Redis says: a proxy an earlier
    test benched must not keep a later test's proxy on the same reused port out of its pool.
    """
    if "worker" not in request.fixturenames:
        return  # a test with its own Redis and workers: nothing of the session's is in its way
    request.getfixturevalue("worker")
    tasks.deps.redis_client().delete(redis_keys.proxy_health())
    tasks.deps.proxy_health().forget_local()


@pytest.fixture
def site() -> Iterator[TestSite]:
    """A fresh local web site per test, with nothing remembered about its origin.

    Ports are reused within a session: a robots.txt or Crawl-delay cached for an earlier test's
    site on the same port must not decide this one's crawl.
    """
    with TestSite() as running:
        forget_origin(running.base)
        yield running


def forget_origin(base: str) -> None:
    """Delete the session Redis's keys about ``base`` (robots cache, host pacing), if it is up, and
    the in-process robots rules the embedded worker may still hold for it."""
    host = base.split("//", 1)[1]
    tasks.deps.robots().forget_local(base.rstrip("/"))
    try:
        client = tasks.deps.frontier_client()  # robots rules and host gates are the frontier's
        stale = [key for key in client.scan_iter(match=f"*{host}*", count=1000) if b"{job-" not in _raw(key)]
        if stale:
            client.delete(*stale)
    except redis.RedisError:
        pass  # no session Redis in this test: nothing remembered either


def _raw(key: Any) -> bytes:
    return key if isinstance(key, bytes) else str(key).encode()


def run_job(
    job: Mapping[str, Any], timeout_s: float = 30.0, during: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Start ``job`` on the session's worker and wait until it stops running; ``during(job_id)``
    runs right after the start. Returns its status."""
    job_id = tasks.start_job(job)
    if during is not None:
        during(job_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = tasks.job_status(job_id)
        assert status is not None
        if status["state"] != "running":
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still running after {timeout_s}s: {tasks.job_status(job_id)}")


def wait_for_batches_released(job_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Poll the job's status until no batch of it is leased (the fetches in flight at a cancel or
    pause are done and counted); return that status."""
    return wait_until(
        lambda: (status := tasks.job_status(job_id, with_outputs=False))["in_flight_batches"] == 0 and status,
        timeout_s,
        f"job {job_id}'s batches released",
    )


def wait_for_end(task_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll the status trail until the task reaches a final state; return the trail."""
    deadline = time.monotonic() + timeout_s
    record: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        record = tasks.status(task_id)
        if record is not None and record["state"] in tasks.TERMINAL_STATES:
            return record
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} did not finish within {timeout_s}s; last status: {record}")


def wait_for_state(task_id: str, state: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll the status trail until the task is in ``state``; return the trail."""
    deadline = time.monotonic() + timeout_s
    record: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        record = tasks.status(task_id)
        if record is not None and record["state"] == state:
            return record
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} not {state} within {timeout_s}s; last status: {record}")


@contextmanager
def api_server(token: str | None) -> Iterator[str]:
    """The job API and dashboard over this process's configured cluster, on a free loopback port."""
    from api import make_server, real_api

    server = make_server(real_api(token), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, name="job-api", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# pytest-celery's setup on local processes (tests/celery_setup.py). The plugin's own fixtures
# assemble it (celery_setup from celery_setup_cls, celery_setup_app, celery_worker_cluster and the
# broker and backend clusters' configs); the fixtures below replace the ones that start containers.


@pytest.fixture
def celery_setup_cls() -> type[CeleryTestSetup]:
    """The setup class of ``celery_setup``: its app speaks vcrawl's queues and serializers."""
    return VcrawlTestSetup


@pytest.fixture
def celery_redis_config() -> dict[str, str]:
    """``CONFIG SET`` values for the setup's Redis, applied before any worker starts; override per test."""
    return {}


@pytest.fixture
def celery_redis(tmp_path: Path, celery_redis_config: dict[str, str]) -> Iterator[LocalRedisProcess]:
    """A private redis-server per test: the setup's broker and result backend."""
    server = LocalRedisProcess(tmp_path / "redis").start()
    try:
        with server.client as client:
            for name, value in celery_redis_config.items():
                client.config_set(name, value)
        yield server
    finally:
        server.teardown()


@pytest.fixture
def celery_broker_cluster(celery_redis: LocalRedisProcess) -> CeleryBrokerCluster:
    """The setup's broker: the private Redis."""
    return CeleryBrokerCluster(CeleryTestBroker(celery_redis))


@pytest.fixture
def celery_backend_cluster(celery_redis: LocalRedisProcess) -> CeleryBackendCluster:
    """The setup's result backend: the same Redis, as in vcrawl's own configuration.

    A plain ``CeleryTestBackend``: the Redis vendor's ``RedisTestBackend.teardown`` detaches every
    ``AsyncResult`` alive in this process, the session's too.
    """
    return CeleryBackendCluster(CeleryTestBackend(celery_redis))


@pytest.fixture
def celery_worker_overrides() -> dict[str, Any]:
    """``Settings`` fields of the setup's workers beyond their Redis and data directory; a module overrides this."""
    return {}


@pytest.fixture
def celery_worker_env(
    celery_redis: LocalRedisProcess, celery_worker_overrides: dict[str, Any], tmp_path: Path
) -> dict[str, str]:
    """The environment of the setup's workers and of producers in other processes (``submit``)."""
    settings = Settings(redis_url=celery_redis.url, data=str(tmp_path / "data"), **celery_worker_overrides)
    return cluster_env(settings)


@pytest.fixture
def start_celery_worker(
    celery_worker_env: dict[str, str], celery_setup_app: Celery, tmp_path: Path
) -> Iterator[Callable[..., CeleryTestWorker]]:
    """``start_celery_worker(name, **options)``: one more vcrawl worker subprocess on the setup's Redis.

    Options are ``LocalWorkerProcess``'s (``concurrency``, ``loglevel``, ``queues``); every worker
    started is killed (by PID) after the test.
    """
    started: list[CeleryTestWorker] = []

    def start(name: str, **options: Any) -> CeleryTestWorker:
        process = LocalWorkerProcess(celery_worker_env, tmp_path / f"{name}.log", name=name, **options)
        node = CeleryTestWorker(process, app=celery_setup_app)
        started.append(node)
        process.start()
        return node

    yield start
    for node in started:
        node.teardown()


@pytest.fixture
def celery_worker(start_celery_worker: Callable[..., CeleryTestWorker]) -> CeleryTestWorker:
    """The setup's first worker: ``celery -A tasks worker`` on vcrawl's three queues."""
    return start_celery_worker("vcrawl")


_SPARE_DB = 7  # a database of the session's server that no worker consumes


@pytest.fixture
def spare_broker(redis_server: LocalRedis) -> Iterator[str]:
    """The URL of an empty database of the session's Redis, for messages no worker may take; emptied after."""
    url = redis_server.url.rsplit("/", 1)[0] + f"/{_SPARE_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()


@pytest.fixture(scope="module")
def browser_installed() -> None:
    shipped = BrowserConfig()
    missing = [p for p in (shipped.chromium_path, shipped.chromedriver_path) if not os.access(p, os.X_OK)]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"headless Chromium is required in CI; missing: {missing}")
        pytest.skip(f"no browser here ({missing}); `apt-get install chromium chromium-driver`")
