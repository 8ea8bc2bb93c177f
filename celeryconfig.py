"""Celery settings for vcrawl, built when asked (``celery_settings``); every value comes from ``vcrawl.settings``.

``tasks/app.py`` asks for them with the environment's ``Settings`` when the app first needs its
configuration; the embedded runner (``vcrawl demo`` / ``vcrawl crawl``) and tests ask with their
own. Importing this module reads nothing.
"""

from __future__ import annotations

import ssl
from typing import Any

from kombu import Exchange, Queue

from vcrawl import schedules
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.redis_keys import SCHEDULE_PREFIX
from vcrawl.settings import Settings
from vcrawl.targets.broker import RABBITMQ_MAX_PRIORITY
from vcrawl.targets.redis import celery_redis_url, is_sentinel, parse_sentinels
from vcrawl.targets.redis_tls import RedisTls

DOWNLOAD_QUEUE = "download"
BROKER_POLL_S = 0.2
DYNAMIC_QUEUE = "download.dynamic"  # browser work, on its own machines and concurrency
ANALYSIS_QUEUE = "analysis"
PROXY_HARVEST_TASK = "vcrawl.harvest_proxies"  # fired by beat when VCRAWL_PROXY_SOURCES is set
# kombu's Redis transport keeps a queue as one list per priority step: 'name', 'name\x06\x163', ...
_PRIORITY_LISTS = ("", "\x06\x163", "\x06\x166", "\x06\x169")


def queue_lists(queue: str) -> list[str]:
    """The Redis lists that hold ``queue``'s messages, one per priority step (0 first)."""
    return [queue + step for step in _PRIORITY_LISTS]


def sentinel_kwargs(settings: Settings, tls: RedisTls | None = None) -> dict[str, Any]:
    """Options for the connections to the Sentinels themselves: their password, short timeouts, TLS."""
    options: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
    if settings.redis_sentinel_password:
        options["password"] = settings.redis_sentinel_password
    return {**options, **(tls or RedisTls.from_settings(settings)).sentinel_options()}


def _tls(tls: RedisTls) -> dict[str, Any]:
    """TLS to the Redis servers for kombu (Flower reads it too), Celery's backend and RedBeat.

    kombu would take a bare ``rediss://`` without ``broker_use_ssl`` and verify nothing
    (``ssl_cert_reqs=CERT_NONE``); Celery's backend refuses it. Behind Sentinel, each picks its
    Sentinel-managed TLS connection class from these.
    """
    if not tls.servers:
        return {}
    options = tls.server_options()
    return {"broker_use_ssl": options, "redis_backend_use_ssl": options, "redbeat_redis_use_ssl": options}


def _redbeat_redis(settings: Settings, tls: RedisTls) -> dict[str, Any]:
    """RedBeat's Redis: the same server, or the primary the same Sentinels name."""
    if not is_sentinel(settings.redis_url):
        url = celery_redis_url(settings.redis_url, settings.redis_password)
        return {"redbeat_redis_url": url if not url.startswith("redis+socket") else settings.redis_url}
    found = parse_sentinels(settings.redis_url)
    options: dict[str, Any] = {
        "sentinels": [list(address) for address in found.sentinels],
        "service_name": settings.redis_sentinel_master,
        "db": found.db,
        "socket_timeout": 5.0,
        "sentinel_kwargs": sentinel_kwargs(settings, tls),
        "retry_period": 120,  # beat waits out a failover instead of dying (seconds)
    }
    if settings.redis_password:
        options["password"] = settings.redis_password
    host, port = found.sentinels[0]
    return {"redbeat_redis_url": f"redis-sentinel://{host}:{port}/{found.db}", "redbeat_redis_options": options}


def celery_settings(settings: Settings) -> dict[str, Any]:
    """Return Celery's configuration for ``settings``."""
    redis_url = celery_redis_url(settings.redis_url, settings.redis_password)
    tls = RedisTls.from_settings(settings)
    transport_options: dict[str, Any] = {
        # Longer than any task including its longest retry wait (checked in Settings).
        "visibility_timeout": settings.visibility_timeout_s,
        # Without these, a dead worker's unacked messages wait far past the timeout.
        "unacked_restore_interval": max(1.0, min(30.0, settings.visibility_timeout_s / 4)),
        "unacked_restore_throttle": 1,
        # Reconnect at once, then every 0.5-2 s (kombu: 2 s, +2 s, up to 30 s): workers are back
        # within 2 s of Redis, or of Sentinel naming the new primary (tasks/broker/guard.py).
        "interval_start": 0,
        "interval_step": 0.5,
        "interval_max": 2,
        # A worker's BRPOP returns at least this often (kombu's default: every second). A warm
        # shutdown waits for the one in flight, so a local run's workers stopped a second after its
        # job ended; five empty BRPOPs a second of an idle worker cost Redis nothing to speak of.
        "polling_interval": BROKER_POLL_S,
    }
    backend_options: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout_s}
    if is_sentinel(settings.redis_url):  # kombu and Celery's backend ask the Sentinels for the primary
        for options in (transport_options, backend_options):
            options.update(master_name=settings.redis_sentinel_master, sentinel_kwargs=sentinel_kwargs(settings, tls))
    return {
        "broker_url": redis_url,
        "result_backend": redis_url,
        "broker_transport_options": transport_options,
        "result_backend_transport_options": backend_options,
        **_tls(tls),
        "task_queues": _queues(),
        "broker_connection_retry_on_startup": True,
        # Retry for as long as Redis is away (Celery's default gives up after 100 tries): a worker
        # outlives any Redis outage and goes on by itself when it is back.
        "broker_connection_max_retries": None,
        # A Redis made a replica under a worker (Sentinel demoting an old primary) ends its BRPOP
        # with UNBLOCKED and its writes with READONLY, both channel errors to kombu: reconnect
        # (through the Sentinels, to the new primary) rather than stop the worker for good.
        "broker_channel_error_retry": True,
        # JSON only: any richer serializer would let a message from the broker run code.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # The status trail in Redis is the record of outcomes; results only linger briefly.
        "result_expires": 3600,
        "task_default_queue": DOWNLOAD_QUEUE,
        "task_default_exchange": DOWNLOAD_QUEUE,
        "task_default_routing_key": DOWNLOAD_QUEUE,
        "task_routes": {
            "vcrawl.crawl": {"queue": DOWNLOAD_QUEUE, "routing_key": DOWNLOAD_QUEUE},
            "vcrawl.fetch": {"queue": DOWNLOAD_QUEUE, "routing_key": DOWNLOAD_QUEUE},
            "vcrawl.analyze": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.record_failure": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.fetch_batch": {"queue": DOWNLOAD_QUEUE, "routing_key": DOWNLOAD_QUEUE},
            "vcrawl.analyze_batch": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.analysis_batch_failed": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.analyze_batches": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.analysis_batches_failed": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.start_cycle": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.batch_map": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.batch_reduce": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.batch_failed": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            "vcrawl.start_batch_analysis": {"queue": ANALYSIS_QUEUE, "routing_key": ANALYSIS_QUEUE},
            PROXY_HARVEST_TASK: {"queue": DOWNLOAD_QUEUE, "routing_key": DOWNLOAD_QUEUE},
        },
        # A harvest checks proxies for up to VCRAWL_PROXY_HARVEST_EVERY_S (fetchers/proxy_harvest.py).
        "task_annotations": {PROXY_HARVEST_TASK: {"time_limit": int(settings.proxy_harvest_every_s + 120)}},
        # Beat: schedules live in Redis (RedBeat), so they survive restarts, can change while
        # beat runs, and a lock lets only one beat fire when several are started.
        "beat_scheduler": "tasks.beat:BeatScheduler",  # RedBeat that outlives a Redis failover or restart
        **_redbeat_redis(settings, tls),
        "redbeat_key_prefix": SCHEDULE_PREFIX,
        # Another beat takes over this long after the lock holder dies (RedBeat's default: 25 min).
        "redbeat_lock_timeout": int(settings.beat_lock_timeout_s),
        "beat_max_loop_interval": 3,
        "beat_schedule": {**_beat_schedule(settings.schedules_file), **_harvest_schedule(settings)},
        # A publish that finds Redis gone (restarting) is retried for about two minutes instead of
        # 0.4 s: otherwise the analysis linked to a finished fetch was given up and its pages never
        # finished (seen in tests/faults). Also holds for the pump's dispatch and for crawl.delay.
        "task_publish_retry_policy": {
            "max_retries": 60,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 2.0,
        },
        # A killed worker's tasks are redelivered, never dropped.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # On Redis's broker a task running when the connection drops is cancelled (its lost-fetch watchdog
        # hands its batches back); not on RabbitMQ's (_rabbitmq).
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # Prefetch multiplier is per worker; 1 keeps downloads spread over the cluster.
        "worker_prefetch_multiplier": 1,
        "task_time_limit": int(settings.total_timeout_s * 2 + 60),
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        **(_rabbitmq(settings) if settings.amqp_broker else {}),  # last: RabbitMQ's settings win
    }


def _queues(arguments: dict[str, Any] | None = None, exchange_type: str = "direct") -> list[Queue]:
    return [Queue(name, Exchange(name, type=exchange_type), routing_key=name, queue_arguments=arguments)
            for name in (DOWNLOAD_QUEUE, DYNAMIC_QUEUE, ANALYSIS_QUEUE)]  # fmt: skip


def _rabbitmq(settings: Settings) -> dict[str, Any]:
    """Celery's messages through RabbitMQ (``VCRAWL_BROKER_URL``); the results, beat and the rest stay in Redis.

    Queues are durable and messages persistent (Celery's defaults), and every publish waits for the
    broker's confirm: a message is on disk (on a quorum of nodes) before ``crawl.delay`` or the pump
    goes on. A dead worker's unacknowledged messages go back the moment its connection closes.
    """
    if settings.rabbitmq_quorum:  # replicated (Raft); no priorities before RabbitMQ 4 (then two levels)
        arguments: dict[str, Any] = {"x-queue-type": "quorum"}
        # Topic exchanges: Celery's native delayed delivery (the only way to a countdown on quorum queues,
        # which have no per-queue prefetch for ETA messages held by a worker) routes only through them.
        exchange_type = "topic"
        kinds = {
            "task_default_queue_type": "quorum",
            "task_create_missing_queue_type": "quorum",
            "task_default_exchange_type": "topic",
            "task_create_missing_queue_exchange_type": "topic",
        }
    else:  # paced batches are served before bulk ones (tasks/batches.py), as on Redis
        arguments, kinds = {"x-max-priority": RABBITMQ_MAX_PRIORITY}, {"task_queue_max_priority": RABBITMQ_MAX_PRIORITY}
        exchange_type = "direct"
    return {
        "broker_url": settings.broker_url,
        "broker_transport_options": {
            "confirm_publish": True,
            # Reconnect at once, then every 0.5-2 s, as on Redis: workers are back soon after the broker.
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 2,
        },
        # A worker cut off by a partition: RabbitMQ closes its connection, and hands its messages back, 2 to 3
        # heartbeat intervals after its last word: 20-30 s at a third of the node timeout, about when the
        # ring declares it down (~31 s). A message RabbitMQ had delivered into the dead connection was in
        # none of its words: at the node timeout itself it waited 60-90 s (tests/faults/test_partition.py).
        # Back sooner is safe: a copy of a fetch the cut worker started finds it "taken" and skips it (the
        # hand-over at the down gives its URLs back), one it never started is fetched at once.
        "broker_heartbeat": max(2.0, settings.node_timeout_s / 3),
        "broker_use_ssl": _amqps(settings.broker_url),
        # After a reconnection Celery 5.5+ lowers the prefetch to the tasks still running and raises it
        # again, one basic.qos per task that ends. One of those calls waited for ever for its answer after
        # a RabbitMQ restart (the worker took nothing until RabbitMQ dropped it, 90 s later: seen in
        # tests/faults). With a prefetch of one per pool slot there is nothing to lower.
        "worker_enable_prefetch_count_reduction": False,
        # A task running when the connection drops runs on: prefork would SIGTERM it. RabbitMQ has requeued its
        # message; the redelivered copy skips the batches this run holds ("being fetched by another copy") and
        # this run releases them. A terminated run released nothing: its batches waited out their leases,
        # 9 minutes at the shipped limits (a RabbitMQ restart under prefork workers, tests/faults).
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "task_queues": _queues(arguments, exchange_type),
        **kinds,
    }


def _amqps(url: str | None) -> Any:
    # amqps:// verifies the server's certificate and name against the system's CAs (py-amqp's own
    # context loads no CA at all; server_hostname None: kombu names the URL's host for the check).
    if url is None or not url.startswith("amqps://"):
        return False
    paths = ssl.get_default_verify_paths()
    return {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": paths.cafile or paths.openssl_cafile, "server_hostname": None}


def _harvest_schedule(settings: Settings) -> dict[str, Any]:
    """Beat's entry for the proxy harvest: always, since sources may be set live (a harvest without any
    returns at once)."""
    return {PROXY_HARVEST_TASK: {"task": PROXY_HARVEST_TASK, "schedule": settings.proxy_harvest_every_s}}


def _beat_schedule(path: str | None) -> dict[str, Any]:
    try:
        return schedules.beat_schedule(path)  # not a bare name: globals().update below sets beat_schedule
    except InvalidTask as exc:
        raise ConfigError(f"VCRAWL_SCHEDULES_FILE={path}: {exc}") from None
