"""The broker Celery's messages go through: Redis (``VCRAWL_REDIS_URL``) or RabbitMQ (``VCRAWL_BROKER_URL``)."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = [
    "AMQP_SCHEMES",
    "RABBITMQ_MAX_PRIORITY",
    "broker_priority",
    "check_broker_url",
    "delayed_delivery_countdown",
    "is_amqp",
    "redacted",
]

AMQP_SCHEMES = ("amqp", "amqps")
# A classic queue's priorities on RabbitMQ: 0..9, 9 served first (Redis's kombu serves 0 first).
RABBITMQ_MAX_PRIORITY = 9


def is_amqp(url: str | None) -> bool:
    """True if ``url`` names a RabbitMQ broker (or several nodes of one, ``;``-separated).

    >>> is_amqp("amqps://u:p@mq:5671/crawl"), is_amqp("redis://r:6379/0"), is_amqp(None)
    (True, False, False)
    """
    return url is not None and urlsplit(url.split(";")[0].strip()).scheme in AMQP_SCHEMES


def redacted(url: str) -> str:
    """``url`` without its passwords, fit for a log or an error.

    >>> redacted("amqp://crawler:s3cret@mq1:5672/vcrawl;amqp://crawler:s3cret@mq2:5672/vcrawl")
    'amqp://crawler:***@mq1:5672/vcrawl;amqp://crawler:***@mq2:5672/vcrawl'
    """
    return ";".join(_redacted_one(part) for part in url.split(";"))


def _redacted_one(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


def check_broker_url(url: str) -> None:
    """Check ``VCRAWL_BROKER_URL``: ``amqp://`` or ``amqps://`` with a host (user, password, port, vhost
    optional), or several such URLs separated by ``;``, the nodes of one cluster (Celery fails over
    between them, in order).

    Raises:
        ValueError: anything else (the message never holds a password).
    """
    for part in (piece.strip() for piece in url.split(";")):
        parts = urlsplit(part)
        if parts.scheme not in AMQP_SCHEMES or not parts.hostname:
            raise ValueError(
                f"must be amqp://[user:password@]host[:port]/[vhost] or amqps://... (several: ';' between "
                f"them), got {redacted(url)!r} (leave it unset to keep Celery's messages on VCRAWL_REDIS_URL)"
            )
        try:
            parts.port  # noqa: B018 - urlsplit checks the port only when asked
        except ValueError:
            raise ValueError(f"has a port that is no number: {redacted(url)!r}") from None


def broker_priority(redis_priority: int, amqp: bool) -> int:
    """A message priority written as Redis's kombu reads it (0 first) in the broker's own terms.

    >>> broker_priority(0, amqp=True), broker_priority(6, amqp=True), broker_priority(6, amqp=False)
    (9, 3, 6)
    """
    return RABBITMQ_MAX_PRIORITY - redis_priority if amqp else redis_priority


def delayed_delivery_countdown(countdown_s: float) -> float:
    """A task's countdown as RabbitMQ's native delayed delivery (quorum queues) can take it: 0, or 1 s and more.

    Celery routes a delayed message through whole-second ``celery_delayed_*`` queues and refuses a
    countdown under a second (``ValueError: countdown must be a positive number``); its ETA header then
    holds the exact time. A wait of a fraction of a second (a host's next slot) becomes one second.

    >>> delayed_delivery_countdown(0.3), delayed_delivery_countdown(2.5), delayed_delivery_countdown(0)
    (1.0, 2.5, 0)
    """
    return max(1.0, countdown_s) if countdown_s > 0 else countdown_s
