"""Redis over TLS only (``--port 0 --tls-port``, client certificates required), certificates made at
test time (tests/tls_files.py): vcrawl's client, a Celery app and a worker process (broker and
result backend), RedBeat and Flower's broker client all get through with the CA; without it the
server's certificate is refused. The same clients through three Sentinels that speak TLS only, to a
primary and a replica that do too (tests/sentinel_cluster.py with ``tls=``)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from flower.utils.broker import Broker
from redbeat.schedulers import get_redis

from celeryconfig import DOWNLOAD_QUEUE, celery_settings
from frontier import Frontier
from tasks.redis_clients import make_redis_client
from tests.cluster import cluster_env, start_job, stop_worker
from tests.ports import free_port
from tests.sentinel_cluster import SentinelCluster, start_sentinel_worker
from tests.site import TestSite, link_page
from tests.tls_files import TlsFiles, make_tls_files
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = pytest.mark.redis_ha


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> Iterator[int]:
    """A redis-server that speaks TLS only and wants a client certificate; yields its port."""
    directory = tmp_path_factory.mktemp("tls-redis")
    port = free_port()
    with open(directory / "log", "ab") as log:
        server = subprocess.Popen(
            ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(directory), "--daemonize", "no", *tls_files.server_args()],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=port, ssl=True, socket_timeout=1, **tls_files.client_options()) as client:
                    client.ping()
                break
            except redis.ConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"TLS redis-server did not start: {(directory / 'log').read_text()}") from None
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(10)


def tls_settings(port: int, files: TlsFiles, **values: Any) -> Settings:
    return Settings(redis_url=f"rediss://127.0.0.1:{port}/0", redis_tls_ca_file=str(files.ca),
                    redis_tls_cert_file=str(files.cert), redis_tls_key_file=str(files.key), **values)  # fmt: skip


def celery_round_trip(settings: Settings, log: Path) -> Any:
    """A task sent by a Celery app configured by ``celery_settings``, run by a worker process
    (``celery -A tasks worker``, given only the environment), its result read back from the backend.

    ``celery.accumulate`` is one of Celery's built-in tasks: it returns its arguments.
    """
    worker = start_sentinel_worker(cluster_env(settings), log.stem, log, concurrency=1, queues=DOWNLOAD_QUEUE)
    try:
        app = Celery(log.stem, set_as_current=False)
        app.config_from_object(celery_settings(settings))
        result = app.send_task("celery.accumulate", args=(5,), queue=DOWNLOAD_QUEUE)
        # The flag an earlier in-process worker of the suite left set is for tasks; this is no task.
        return result.get(timeout=20, disable_sync_subtasks=False)
    finally:
        stop_worker(worker)


def beat_and_flower_answer(settings: Settings, name: str) -> None:
    """RedBeat's client and the one Flower builds for its queue lengths reach Redis."""
    app = Celery(name, set_as_current=False)
    app.config_from_object(celery_settings(settings))
    assert get_redis(app).ping()  # RedBeat
    with app.connection() as connection:
        url = connection.as_uri(include_password=True)  # what Flower gives its Broker
    flower = Broker(url, broker_use_ssl=app.conf.broker_use_ssl, broker_options=app.conf.broker_transport_options)
    [queue] = asyncio.run(flower.queues([DOWNLOAD_QUEUE]))
    assert queue == {"name": DOWNLOAD_QUEUE, "messages": 0}


def test_every_client_round_trips_over_verified_tls(tmp_path: Path, tls_redis: int, tls_files: TlsFiles) -> None:
    settings = tls_settings(tls_redis, tls_files)
    client = make_redis_client(settings)
    client.set("tls:probe", "over TLS")
    assert client.get("tls:probe") == "over TLS"
    assert isinstance(client.connection_pool.get_connection(), redis.SSLConnection)
    assert celery_round_trip(settings, tmp_path / "tls-one-server.log") == [5]  # kombu's broker, Celery's backend
    beat_and_flower_answer(settings, "tls-one-server-beat")


@pytest.mark.slow
def test_a_job_runs_on_a_worker_process_over_tls(tmp_path: Path, tls_redis: int, tls_files: TlsFiles) -> None:
    """The whole worker (``celery -A tasks worker``: its checks at start, the pump, fetch and analysis
    tasks) and a producer process, given only the environment."""
    settings = tls_settings(tls_redis, tls_files, data=str(tmp_path / "data"))
    env = cluster_env(settings)
    with TestSite() as site:
        site.add_page("/", link_page("/a"))
        site.add_page("/a", link_page())
        # Readiness from the worker's log: the base class's ping would go without the TLS options.
        worker = start_sentinel_worker(env, "tls-worker", tmp_path / "worker.log")
        try:
            job_id = start_job(env, {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}})
            frontier = Frontier(make_redis_client(settings))
            deadline = time.monotonic() + 30
            while (status := job_status(frontier, job_id))["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            stop_worker(worker)
    assert status["state"] == "completed" and status["pages_stored"] == 2, status
    assert "certificate" not in (tmp_path / "worker.log").read_text().lower()


@pytest.mark.slow
def test_every_client_reaches_the_primary_through_tls_sentinels(tmp_path: Path, tls_files: TlsFiles) -> None:
    with SentinelCluster(tmp_path / "ha", tls=tls_files) as cluster:
        settings = Settings(redis_url=cluster.url, redis_sentinel_master=cluster.master_name, redis_tls=True,
                            redis_sentinel_tls=True, redis_tls_ca_file=str(tls_files.ca),
                            redis_tls_cert_file=str(tls_files.cert), redis_tls_key_file=str(tls_files.key))  # fmt: skip
        client = make_redis_client(settings)
        client.set("tls:probe", "through Sentinel")
        connection = client.connection_pool.get_connection()
        assert isinstance(connection, redis.SSLConnection) and connection.port == cluster.primary_port()
        for sentinel in client.connection_pool.sentinel_manager.sentinels:
            assert isinstance(sentinel.connection_pool.get_connection(), redis.SSLConnection)
        assert cluster.master_client(decode_responses=True).get("tls:probe") == "through Sentinel"
        assert celery_round_trip(settings, tmp_path / "tls-sentinel.log") == [5]
        beat_and_flower_answer(settings, "tls-sentinel-beat")


def test_without_the_ca_the_servers_certificate_is_refused(tls_redis: int, tls_files: TlsFiles) -> None:
    settings = Settings(redis_url=f"rediss://127.0.0.1:{tls_redis}/0", redis_tls_cert_file=str(tls_files.cert),
                        redis_tls_key_file=str(tls_files.key))  # fmt: skip
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        make_redis_client(settings).ping()
    app = Celery("tls-no-ca", set_as_current=False)
    app.config_from_object(celery_settings(settings))
    with pytest.raises(Exception, match="certificate verify failed"), app.connection() as connection:
        connection.ensure_connection(max_retries=1)


def test_without_a_client_certificate_the_server_refuses(tls_redis: int, tls_files: TlsFiles) -> None:
    settings = Settings(redis_url=f"rediss://127.0.0.1:{tls_redis}/0", redis_tls_ca_file=str(tls_files.ca))
    with pytest.raises(redis.ConnectionError):
        make_redis_client(settings).ping()


def test_verification_off_connects_and_says_so(
    tls_redis: int, tls_files: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(redis_url=f"rediss://127.0.0.1:{tls_redis}/0", redis_tls_verify=False,
                        redis_tls_cert_file=str(tls_files.cert), redis_tls_key_file=str(tls_files.key))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="vcrawl.targets.redis_tls"):
        assert make_redis_client(settings).ping()
    assert any("NOT verified" in record.getMessage() for record in caplog.records)
