"""VCRAWL_BROKER_URL: what is accepted, what Celery is told, and what stays on Redis."""

from __future__ import annotations

import pytest

from celeryconfig import celery_settings
from cli.flower import FlowerOptions, flower_env
from vcrawl import live_settings
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings

REDIS = "redis://127.0.0.1:6390/0"


@pytest.mark.parametrize(
    "url",
    ["amqp://guest:guest@127.0.0.1:5672//", "amqps://mq.internal/vcrawl", "amqp://a:5672//;amqp://b:5673//"],
)
def test_amqp_urls_are_accepted(url: str) -> None:
    assert Settings.from_env({"VCRAWL_BROKER_URL": url}).amqp_broker


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://:hunter2@127.0.0.1:6379/0", "must be amqp://"),
        ("amqp://user:hunter2@", "must be amqp://"),
        ("amqp://user:hunter2@mq:port/", "port that is no number"),
        ("amqp://user:hunter2@mq:5672/;http://x", "must be amqp://"),
    ],
)
def test_a_bad_broker_url_is_refused_by_name_without_its_password(url: str, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"VCRAWL_BROKER_URL": url})
    assert str(refused.value).startswith("VCRAWL_BROKER_URL") and words in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_the_password_stays_out_of_repr_and_the_live_listing() -> None:
    settings = Settings(redis_url=REDIS, broker_url="amqp://vcrawl:hunter2@mq:5672/v")
    assert "hunter2" not in repr(settings)
    # a secret in `vcrawl config` listings, and never set live (a process connects with it at start)
    assert "broker_url" in live_settings._SECRETS and "broker_url" in live_settings._REASONS


def test_a_consumer_timeout_shorter_than_the_longest_hold_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"VCRAWL_RABBITMQ_CONSUMER_TIMEOUT_S=900 .*must exceed 1080 s"):
        Settings(broker_url="amqp://mq//", rabbitmq_consumer_timeout_s=900)
    # the same retry wait on Redis's broker is bounded by the visibility timeout instead
    assert Settings(rabbitmq_consumer_timeout_s=900).rabbitmq_consumer_timeout_s == 900
    # a longer harvest needs a longer consumer timeout
    with pytest.raises(ConfigError, match="must exceed 3780 s"):
        Settings(broker_url="amqp://mq//", proxy_harvest_every_s=3600)
    Settings(broker_url="amqp://mq//", proxy_harvest_every_s=3600, rabbitmq_consumer_timeout_s=7200)


def test_celery_is_pointed_at_rabbitmq_and_everything_else_stays_on_redis() -> None:
    conf = celery_settings(Settings(redis_url=REDIS, broker_url="amqp://g:g@127.0.0.1:5672//", node_timeout_s=20))
    assert conf["broker_url"] == "amqp://g:g@127.0.0.1:5672//"
    assert conf["result_backend"] == REDIS and conf["redbeat_redis_url"] == REDIS
    assert conf["broker_transport_options"]["confirm_publish"] is True
    assert "visibility_timeout" not in conf["broker_transport_options"]
    assert conf["broker_heartbeat"] == pytest.approx(20 / 3)  # RabbitMQ notices a partition by the node timeout
    assert conf["broker_use_ssl"] is False
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"] and conf["worker_prefetch_multiplier"] == 1
    queues = {queue.name: queue for queue in conf["task_queues"]}
    assert set(queues) == {"download", "download.dynamic", "analysis"}
    assert all(queue.durable and queue.queue_arguments == {"x-max-priority": 9} for queue in queues.values())
    assert conf["task_queue_max_priority"] == 9  # a ring node's own queue too (created when first used)


def test_quorum_queues_sit_behind_topic_exchanges_for_native_delayed_delivery() -> None:
    conf = celery_settings(Settings(redis_url=REDIS, broker_url="amqp://a//;amqp://b//", rabbitmq_quorum=True))
    assert {queue.queue_arguments["x-queue-type"] for queue in conf["task_queues"]} == {"quorum"}
    assert {queue.exchange.type for queue in conf["task_queues"]} == {"topic"}  # Celery skips direct ones
    assert conf["task_create_missing_queue_type"] == "quorum" and conf["task_default_queue_type"] == "quorum"
    assert conf["task_create_missing_queue_exchange_type"] == "topic"  # a ring node's own queue too
    assert "task_queue_max_priority" not in conf  # quorum queues refuse x-max-priority


def test_classic_queues_keep_direct_exchanges_and_priorities() -> None:
    conf = celery_settings(Settings(redis_url=REDIS, broker_url="amqp://a//"))
    assert {queue.exchange.type for queue in conf["task_queues"]} == {"direct"}
    assert {queue.queue_arguments["x-max-priority"] for queue in conf["task_queues"]} == {9}
    assert conf["worker_enable_prefetch_count_reduction"] is False  # a hung basic.qos after a reconnection


def test_a_task_running_at_a_connection_loss_runs_on_with_rabbitmq_and_is_cancelled_with_redis() -> None:
    # RabbitMQ: a terminated run would leave its batches leased, and the redelivered copy skips them.
    rabbitmq = celery_settings(Settings(redis_url=REDIS, broker_url="amqp://a//"))
    assert rabbitmq["worker_cancel_long_running_tasks_on_connection_loss"] is False
    redis_broker = celery_settings(Settings(redis_url=REDIS))
    assert redis_broker["worker_cancel_long_running_tasks_on_connection_loss"] is True


def test_amqps_verifies_the_server() -> None:
    conf = celery_settings(Settings(redis_url=REDIS, broker_url="amqps://mq.internal:5671/v"))
    options = conf["broker_use_ssl"]
    assert options["cert_reqs"] == 2 and options["ca_certs"]  # ssl.CERT_REQUIRED, the system's CA bundle
    assert "server_hostname" in options and options["server_hostname"] is None  # kombu fills in the URL's host


def test_without_a_broker_url_nothing_changes() -> None:
    conf = celery_settings(Settings(redis_url=REDIS))
    assert conf["broker_url"] == REDIS and "confirm_publish" not in conf["broker_transport_options"]
    assert conf["broker_transport_options"]["visibility_timeout"] == 3600
    assert all(queue.queue_arguments is None for queue in conf["task_queues"])
    assert "broker_heartbeat" not in conf


def test_flower_is_pointed_at_the_broker_and_redis_stays_its_backend() -> None:
    settings = Settings(redis_url=REDIS, broker_url="amqp://g:g@127.0.0.1:5672//")
    env = flower_env({"FLOWER_BASIC_AUTH": "ops:pw"}, settings, FlowerOptions())
    assert env["CELERY_BROKER_URL"] == "amqp://g:g@127.0.0.1:5672//" and env["CELERY_RESULT_BACKEND"] == REDIS
