"""The private RabbitMQ node of tests/rabbitmq.py: what the broker promises, before vcrawl relies on it.

Real processes: a RabbitMQ node (and its own epmd) on loopback ports; a consumer subprocess SIGKILLed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import kombu
import pytest

from tests.rabbitmq import LocalRabbitMQ, RabbitCluster

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq]


def publish(url: str, queue: str, body: dict) -> None:
    with kombu.Connection(url) as connection:
        producer = connection.Producer()
        target = kombu.Queue(queue, durable=True)
        producer.publish(body, routing_key=queue, declare=[target], delivery_mode=2, serializer="json",
                         confirm_publish=True)  # fmt: skip


def take(url: str, queue: str, timeout_s: float = 5.0) -> dict:
    with kombu.Connection(url) as connection:
        simple = connection.SimpleQueue(kombu.Queue(queue, durable=True))
        message = simple.get(timeout=timeout_s)
        message.ack()
        simple.close()
        return message.payload


def test_a_persistent_message_on_a_durable_queue_survives_a_restart(tmp_path: Path) -> None:
    with LocalRabbitMQ(tmp_path / "rabbit") as broker:
        publish(broker.url, "kept", {"n": 1})
        broker.restart()
        assert take(broker.url, "kept") == {"n": 1}


def test_a_killed_consumers_unacknowledged_message_is_delivered_again_at_once(tmp_path: Path) -> None:
    with LocalRabbitMQ(tmp_path / "rabbit") as broker:
        publish(broker.url, "work", {"n": 2})
        holder = subprocess.Popen([sys.executable, "-c", (
            "import kombu, sys, time\n"
            f"c = kombu.Connection({broker.url!r}); q = c.SimpleQueue(kombu.Queue('work', durable=True))\n"
            "m = q.get(timeout=10); print('taken', flush=True); time.sleep(60)\n")],
            stdout=subprocess.PIPE)  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == b"taken"
            holder.kill()  # SIGKILL: the connection closes with the message unacknowledged
            killed_at = time.monotonic()
            payload = take(broker.url, "work", timeout_s=5.0)
            again_after_s = time.monotonic() - killed_at
        finally:
            if holder.poll() is None:
                holder.kill()
            holder.wait(10)

    assert payload == {"n": 2}
    assert again_after_s < 2.0, again_after_s  # no visibility timeout: the broker requeues on the close


def test_a_quorum_queue_keeps_every_message_when_its_leaders_node_is_sigkilled(tmp_path: Path) -> None:
    with RabbitCluster(tmp_path / "rabbits", size=3) as cluster:
        queue = kombu.Queue("quorum-work", durable=True, queue_arguments={"x-queue-type": "quorum"})
        with kombu.Connection(cluster.urls[0]) as connection:
            producer = connection.Producer()
            for n in range(20):
                producer.publish({"n": n}, routing_key=queue.name, declare=[queue], delivery_mode=2,
                                 serializer="json", confirm_publish=True)  # fmt: skip
        leader = cluster.leader_of(queue.name)
        leader.kill()
        elsewhere = next(node.url for node in cluster.nodes if node is not leader)
        got: list[int] = []
        deadline = time.monotonic() + 60
        with kombu.Connection(elsewhere) as connection:
            channel = connection.default_channel
            while len(got) < 20 and time.monotonic() < deadline:
                try:
                    message = channel.basic_get(queue.name, no_ack=False)
                except Exception:  # the queue has no leader yet: its channel is closed; open another
                    time.sleep(0.5)
                    channel = connection.channel()
                    continue
                if message is None:
                    time.sleep(0.2)
                    continue
                got.append(json.loads(message.body)["n"])
                channel.basic_ack(message.delivery_tag)

    assert sorted(got) == list(range(20))
