"""vcrawl's queues on a private RabbitMQ node: what ``tasks.broker.amqp`` and ``celeryconfig`` promise there.

Real processes: a RabbitMQ node on loopback (tests/rabbitmq.py), a redis-server, ``celery -A tasks worker``
processes and loopback sites. Celery's messages go through RabbitMQ; everything else stays in Redis.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Queue

from celeryconfig import DOWNLOAD_QUEUE, celery_settings
from cli.local_redis import LocalRedis
from frontier import Frontier
from tasks.broker.amqp import amqp_move_queue, amqp_queue_lengths
from tests.cluster import REPO, cluster_env, start_job, start_worker, stop_worker
from tests.rabbitmq import LocalRabbitMQ
from tests.site import NOT_PAGES, TestSite, link_page
from tests.waiting import wait_until
from vcrawl.settings import Settings
from vcrawl.targets.broker import broker_priority
from views.status import job_status

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq]


@pytest.fixture
def rabbitmq(tmp_path: Path) -> Iterator[LocalRabbitMQ]:
    with LocalRabbitMQ(tmp_path / "rabbitmq") as node:
        yield node


def app_on(settings: Settings) -> Celery:
    app = Celery("vcrawl-test", set_as_current=False)
    app.conf.update(celery_settings(settings))
    return app


def test_a_dead_nodes_queue_moves_onto_the_shared_one_with_its_priorities(rabbitmq: LocalRabbitMQ) -> None:
    settings = Settings(broker_url=rabbitmq.url)
    app = app_on(settings)
    node_queue = "download.node.gone@host"
    with app.connection_for_write() as connection:
        producer = connection.Producer()
        declared = [Queue(name, routing_key=name, queue_arguments={"x-max-priority": 9})
                    for name in (node_queue, DOWNLOAD_QUEUE)]  # fmt: skip
        for index in range(6):  # bulk and paced batches alternate, as a pump sends them
            paced = index % 2 == 1
            producer.publish({"index": index, "paced": paced}, routing_key=node_queue, declare=declared,
                             priority=broker_priority(0 if paced else 6, amqp=True), serializer="json")  # fmt: skip
    assert amqp_queue_lengths(app, [node_queue, DOWNLOAD_QUEUE, "never-declared"]) == {
        node_queue: 6,
        DOWNLOAD_QUEUE: 0,
        "never-declared": 0,
    }

    assert amqp_move_queue(app, node_queue, DOWNLOAD_QUEUE) == 6
    assert amqp_move_queue(app, node_queue, DOWNLOAD_QUEUE) == 0  # nothing left, nothing moved twice
    assert amqp_move_queue(app, "download.node.never-declared", DOWNLOAD_QUEUE) == 0
    assert amqp_queue_lengths(app, [node_queue, DOWNLOAD_QUEUE]) == {node_queue: 0, DOWNLOAD_QUEUE: 6}

    taken = []
    with app.connection_for_read() as connection:
        channel = connection.channel()
        for _ in range(7):  # one more than there are: the queue ends empty
            message = channel.basic_get(DOWNLOAD_QUEUE, no_ack=True)
            if message is not None:
                taken.append(json.loads(message.body))
        channel.close()
    # The paced batches first (RabbitMQ serves its highest priority first), each kind in its order.
    assert [item["index"] for item in taken] == [1, 3, 5, 0, 2, 4]


def sites(stack: ExitStack, count: int, pages: int) -> list[TestSite]:
    made = [stack.enter_context(TestSite(f"127.0.6.{n}")) for n in range(1, count + 1)]
    for site in made:
        site.add_page("/", link_page(*[f"/p{i}" for i in range(pages)]))
        for i in range(pages):
            site.add_page(f"/p{i}", link_page("/"))
    return made


def wait_done(url: str, job_id: str, timeout_s: float) -> dict[str, Any]:
    status: dict[str, Any] = {}

    def done() -> bool:
        status.update(job_status(Frontier(redis.Redis.from_url(url)), job_id) or {})
        return status.get("state") not in (None, "running")

    wait_until(done, timeout_s, f"job {job_id} done")
    return status


def vcrawl(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "cli", *args, "--json"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_ring_node_sigkilled_mid_job_its_queue_moves_and_a_chord_runs_after(
    tmp_path: Path, rabbitmq: LocalRabbitMQ
) -> None:
    """Two ring nodes at the shipped settings; one SIGKILLed mid-job. RabbitMQ hands its unacknowledged
    messages back to its own queue at once; once it is declared down its queue moves onto the shared one
    and the survivor finishes the job. Then a batch analysis (a chord) runs through RabbitMQ too."""
    with ExitStack() as stack:
        hosts = sites(stack, 6, 15)
        server = stack.enter_context(LocalRedis(tmp_path / "redis"))
        base = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data"), broker_url=rabbitmq.url))
        workers: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name in ("steady", "victim"):
                env = {**base, "VCRAWL_NODE_WEIGHT": "100"}
                workers[name] = start_worker(env, name, tmp_path / f"{name}.log", concurrency=4)
            job = {"seeds": [site.url("/") for site in hosts], "politeness": {"min_interval_s": 0.1, "jitter": 0}}
            job_id = start_job(base, job)
            wait_until(lambda: sum(len(site.seen) for site in hosts) >= 30, 60, "30 pages fetched")
            os.kill(workers["victim"].pid, signal.SIGKILL)
            workers["victim"].wait(10)
            killed_at = time.monotonic()
            status = wait_done(server.url, job_id, Settings().node_timeout_s + 60)
            after_kill_s = time.monotonic() - killed_at
            queues = {name: count for name, count in _queues(rabbitmq).items() if name.startswith("download.node.")}
            lengths = queue_lengths(base)  # the API's and dashboard's view, read over AMQP
            # The dead node's replacement ships the fetch-log lines it spooled and never shipped.
            workers["replacement"] = start_worker(base, "replacement", tmp_path / "replacement.log")
            run = vcrawl(base, "analyze", job_id, "--analyzer", "site-report")
            keys = {key.decode() for key in redis.Redis.from_url(server.url).keys("*")}
        finally:
            for process in workers.values():
                stop_worker(process)
    assert status["state"] == "completed", status
    assert status["pages_stored"] == 6 * 16, status
    for site in hosts:  # every page, each fetched at most twice (once more if its worker died holding it)
        seen = [entry.path for entry in site.seen if entry.path not in NOT_PAGES]
        assert set(seen) == {"/", *(f"/p{i}" for i in range(15))}
        assert max(seen.count(path) for path in set(seen)) <= 2
    assert after_kill_s < Settings().node_timeout_s + 30, after_kill_s
    assert queues and all(count == 0 for count in queues.values()), queues  # the dead node's queue moved
    assert any(name.startswith("download.node.victim@") for name in queues), queues
    assert lengths == {"download": 0, "download.dynamic": 0, "analysis": 0}, lengths
    assert json.loads(Path(run["result"]).read_text())["totals"]["pages"] == 6 * 16, run
    # Celery's queues and kombu's unacked notes are on RabbitMQ only: none of them in Redis.
    assert not {"download", "analysis", "unacked", "unacked_index"} & keys, sorted(keys)[:40]
    assert not [key for key in keys if key.startswith("_kombu")], sorted(keys)[:40]


def queue_lengths(env: dict[str, str]) -> dict[str, int]:
    code = "import json, tasks; print(json.dumps(tasks.queue_lengths()))"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _queues(node: LocalRabbitMQ) -> dict[str, int]:
    listing = node.ctl("list_queues", "name", "messages", "--no-table-headers", "-q").stdout.decode()
    rows = (line.split("\t") for line in listing.splitlines() if "\t" in line)
    return {name: int(count) for name, count in rows}
