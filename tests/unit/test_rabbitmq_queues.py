"""vcrawl's queues on RabbitMQ as ``celeryconfig`` declares them: classic with priorities, or quorum."""

from __future__ import annotations

from celeryconfig import celery_settings
from vcrawl.settings import Settings

BROKER = "amqp://guest:guest@127.0.0.1:5672//;amqp://guest:guest@127.0.0.2:5672//"


def test_quorum_queues_sit_behind_topic_exchanges_for_native_delayed_delivery() -> None:
    conf = celery_settings(Settings(broker_url=BROKER, rabbitmq_quorum=True))

    assert {queue.queue_arguments["x-queue-type"] for queue in conf["task_queues"]} == {"quorum"}
    assert {queue.exchange.type for queue in conf["task_queues"]} == {"topic"}  # Celery skips direct ones
    assert conf["task_create_missing_queue_type"] == "quorum"  # a ring node's own queue
    assert conf["task_create_missing_queue_exchange_type"] == "topic"
    assert "task_queue_max_priority" not in conf  # quorum queues refuse x-max-priority


def test_classic_queues_keep_direct_exchanges_and_priorities() -> None:
    conf = celery_settings(Settings(broker_url=BROKER))

    assert {queue.exchange.type for queue in conf["task_queues"]} == {"direct"}
    assert {queue.queue_arguments["x-max-priority"] for queue in conf["task_queues"]} == {9}
