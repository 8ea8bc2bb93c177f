"""One typed settings object, read once from ``VCRAWL_*`` environment variables."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any

from vcrawl.api_rules import AUTH_PREFIX, check_auth_name
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.header_values import header_value_problem
from vcrawl.proxy_sources import ProxySource, dump_proxy_sources
from vcrawl.setting_parsers import FIELD_PARSERS, TYPE_PARSERS, check_network, check_url
from vcrawl.targets.broker import check_broker_url, is_amqp
from vcrawl.targets.records import check_records_url
from vcrawl.targets.redis import celery_redis_url, check_frontier_url, is_sentinel, parse_sentinels
from vcrawl.targets.redis_tls import check_redis_tls

__all__ = [
    "DEFAULT_REFERERS",
    "DEFAULT_USER_AGENTS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "Settings",
    "celery_redis_url",
    "child_environment",
]

# Current desktop and mobile browsers (late 2026); sites treat unknown agents worse.
DEFAULT_USER_AGENTS: tuple[str, ...] = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/142.0.0.0 Safari/537.36",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:145.0) Gecko/20100101 Firefox/145.0",
    "Mozilla/5.0 (X11; Linux x86_64; rv:145.0) Gecko/20100101 Firefox/145.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/26.1 Safari/605.1.15",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/142.0.0.0 Safari/537.36 Edg/142.0.0.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 19_1 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/26.1 Mobile/15E148 Safari/604.1",
)
DEFAULT_REFERERS: tuple[str, ...] = (
    "https://www.google.com/",
    "https://www.bing.com/",
    "https://duckduckgo.com/",
)

_PREFIX = "VCRAWL_"
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_NODE_WEIGHT = 100  # virtual nodes of a ring node: ~10 % spread of its share


@dataclass(frozen=True)
class Settings:
    """Every vcrawl setting with its default; the env variable is ``VCRAWL_<NAME>``."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    # Redis behind Sentinel (VCRAWL_REDIS_URL=sentinel://h1:26379;sentinel://h2:26379/0): the primary's name.
    redis_sentinel_master: str = ""
    redis_password: str = field(default="", repr=False)  # the Redis servers' (AUTH); never in the URL
    redis_sentinel_password: str = field(default="", repr=False)  # the Sentinels' own
    # TLS (vcrawl.targets.redis_tls): rediss:// for one server; behind Sentinel, to the servers and to the Sentinels.
    redis_tls: bool = False
    redis_sentinel_tls: bool = False
    redis_tls_ca_file: str | None = None  # CA bundle that verifies the servers (the system's without it)
    redis_tls_cert_file: str | None = None  # client certificate, for `tls-auth-clients yes`
    redis_tls_key_file: str | None = None
    redis_tls_verify: bool = True  # false: no verification, logged as a warning by every client built
    # Admissions and releases wait at most this long for a replica to have them (WAIT), while the
    # primary has one: a failover then loses no acknowledged work (frontier.scripts.ReplicaWait). 0: never.
    redis_replica_wait_ms: int = 100
    # The frontier's own Redis or Redis Cluster (job queues, leases, politeness, Bloom filters, robots); the
    # broker and the cluster's keeping stay on redis_url. Unset: it shares redis_url. Same password, TLS.
    frontier_url: str | None = None
    # RabbitMQ for Celery's messages (amqp:// or amqps://, docs/cluster.md "Which broker"); unset: they go
    # through redis_url. Everything else stays in Redis either way. May hold a password: never in a repr.
    broker_url: str | None = field(default=None, repr=False)
    rabbitmq_quorum: bool = False  # vcrawl's queues as quorum queues (a RabbitMQ cluster), else classic
    # The RabbitMQ server's consumer_timeout (rabbitmq.conf; 30 min by default): every task, with its
    # longest retry wait, must be acknowledged well within it, or RabbitMQ closes the channel and redelivers.
    rabbitmq_consumer_timeout_s: float = 1800.0
    data: str = "./crawl-data"
    user_agents: tuple[str, ...] = DEFAULT_USER_AGENTS
    referers: tuple[str, ...] = DEFAULT_REFERERS
    proxies: tuple[str, ...] = ()
    proxy_cooloff_s: float = 60.0  # a failing proxy is benched this long; doubled if it fails again at once
    proxy_cooloff_max_s: float = 900.0
    # Proxy harvesting (fetchers/proxy_check.py, docs/proxies.md): the operator's proxy sources (a JSON
    # array or a JSON/YAML file), the check URL each candidate must answer through, how slow it may be,
    # how many harvested proxies the pool keeps (the fastest), how often beat harvests, how many checks
    # run at once and how many candidates one run checks at most.
    proxy_sources: tuple[ProxySource, ...] = ()
    proxy_check_url: str | None = None
    proxy_max_latency_s: float = 5.0
    proxy_pool_max: int = 50
    proxy_harvest_every_s: float = 900.0
    proxy_check_concurrency: int = 16
    proxy_candidates_max: int = 1000
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 15.0
    total_timeout_s: float = 60.0
    min_rate_bytes_s: float = 1024.0  # bytes/s a head or body must keep over slow_window_s (else slow_head, too_slow)
    slow_window_s: float = 5.0
    max_body_bytes: int = 10 * 1024 * 1024
    max_redirects: int = 5
    fetch_retries: int = 2  # as Scrapy's RETRY_TIMES: each retry of a 503 waits its Retry-After
    fetch_backoff_s: float = 1.0
    fetch_backoff_max_s: float = 60.0
    max_retry_after_s: float = 600.0
    min_interval_s: float = 0.25
    interval_jitter: float = 0.5
    analysis_retries: int = 3
    analysis_backoff_s: float = 1.0
    # A job's analysis batch whose storage or Redis keeps failing: retried this often (backoff 1 s doubling
    # to 60 s: about 5 minutes, enough to outlast a Redis restart), then its errback finishes its pages.
    batch_analysis_retries: int = 10
    analyzer_programs: str | None = None  # a YAML/JSON file of external-program analyzers (docs/analyzer-programs.md)
    alert_webhook_url: str | None = None
    alert_email_to: tuple[str, ...] = ()
    alert_email_from: str = "vcrawl@localhost"
    smtp_host: str | None = None
    smtp_port: int = 25
    smtp_user: str | None = None
    smtp_password: str | None = field(default=None, repr=False)  # secrets stay out of logs and tracebacks
    smtp_starttls: bool = False
    chromium_path: str = "/usr/bin/chromium"
    chromedriver_path: str = "/usr/bin/chromedriver"
    browser_page_timeout_s: float = 20.0
    browser_lazy_timeout_s: float = 10.0
    browser_max_pages: int = 50
    hdfs_user: str | None = None
    hdfs_namenodes: tuple[str, ...] = ()
    hdfs_kerberos: bool = False
    warc_file_bytes: int = 1024 * 1024 * 1024
    warc_spool_dir: str | None = None
    records_part_bytes: int = 64 * 1024 * 1024
    records_flush_s: float = 60.0
    records_spool_dir: str | None = None
    # A job's records upserted into PostgreSQL instead of JSON Lines parts (storage.postgres_records):
    # postgresql://user[:password]@host:port/db. May hold a password, so never in a repr or a log.
    records_url: str | None = field(default=None, repr=False)
    records_connect_timeout_s: float = 5.0
    records_statement_timeout_s: float = 30.0  # one batch's upsert, or one page of an export's read
    pump: bool = True
    # The host ring (docs/cluster.md): a worker joins when VCRAWL_RING is on or it has a weight
    # (virtual nodes on the ring; its share of the hosts is its weight over the total).
    ring: bool = False
    node_weight: int | None = None
    node_timeout_s: float = 30.0  # a node silent this long is out; its hosts and batches move
    frontier_batch: int = 32  # URLs per fetch task at most (politeness off); a short queue is shared out
    frontier_inflight: int = 128
    robots_ttl_s: float = 86400.0
    robots_error_ttl_s: float = 600.0
    visibility_timeout_s: float = 3600.0
    status_ttl_s: int = 7 * 24 * 3600
    task_events: bool = True
    schedules_file: str | None = None
    beat_lock_timeout_s: float = 15.0
    stats_retention_s: int = 3 * 86400
    stats_retention_days: int = 90  # per-day job and host statistics
    api_token: str | None = field(default=None, repr=False)
    monitor_clusters: tuple[str, ...] = field(default=(), repr=False)  # NAME=URL: more clusters for `vcrawl serve`
    alert_window_s: float = 3600.0
    alert_host_failure_rate: float = 0.5
    alert_host_min_fetches: int = 20
    alert_stuck_s: float = 900.0
    # Non-public networks workers may fetch from (CIDRs); empty: public addresses only (SSRF guard).
    allowed_networks: tuple[str, ...] = ()
    # Per-process DNS cache (fetchers.dns_cache): names kept (0: none), how long an answer and a
    # failure are kept. Fixed times: getaddrinfo, the system's resolver, reports no TTL.
    dns_cache_size: int = 4096
    dns_ttl_s: float = 60.0
    dns_negative_ttl_s: float = 5.0
    # Secrets of api pages by auth name: VCRAWL_API_AUTH_<NAME>, one variable each (docs/api-mode.md).
    # A job names one (``auth: NAME``); its value never travels in a message.
    api_auth: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False)
    # Logs (docs/logs.md): the format of a process's own log lines, and the cluster log stream in
    # Redis: its default level (per logger, changed live with ``vcrawl log-level``), its length,
    # the lines a process holds while Redis is slow or away (more are dropped, and counted).
    log_format: str = "text"
    log_stream: bool = True
    log_stream_level: str = "WARNING"
    log_maxlen: int = 100_000
    log_queue_size: int = 10_000
    log_levels_poll_s: float = 2.0
    # Not a variable: the fields ``from_env`` found set, for the few defaults that depend on it
    # (no VCRAWL_REDIS_URL: ``vcrawl crawl`` runs a private Redis). Not compared: where a value
    # came from does not change the settings.
    given: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, secret in self.api_auth.items():
            try:
                check_auth_name(name)
            except InvalidTask as exc:
                raise ConfigError(f"{AUTH_PREFIX}{name}: the name after {AUTH_PREFIX} {exc.problem}") from None
            if not secret.strip():
                raise ConfigError(f"{AUTH_PREFIX}{name} is set but empty")
        for network in self.allowed_networks:
            check_network("VCRAWL_ALLOWED_NETWORKS", network)
        if is_sentinel(self.redis_url):
            try:
                parse_sentinels(self.redis_url)
            except ValueError as exc:
                raise ConfigError(f"VCRAWL_REDIS_URL: {exc}") from None  # no echo: it may hold a password
            if not self.redis_sentinel_master:
                raise ConfigError("VCRAWL_REDIS_URL names Sentinels: set VCRAWL_REDIS_SENTINEL_MASTER to the "
                                  "primary's name (their `sentinel monitor <name> ...`)")  # fmt: skip
        else:
            check_url("VCRAWL_REDIS_URL", self.redis_url, ("redis", "rediss", "unix"))
            if self.redis_sentinel_master:
                raise ConfigError("VCRAWL_REDIS_SENTINEL_MASTER is set, but VCRAWL_REDIS_URL is not a "
                                  f"sentinel:// URL: {self.redis_url!r}")  # fmt: skip
        if self.frontier_url is not None:
            try:
                check_frontier_url(self.frontier_url)
            except ValueError as exc:
                raise ConfigError(f"VCRAWL_FRONTIER_URL: {exc}") from None  # no echo: it may hold a password
        if self.broker_url is not None:
            try:
                check_broker_url(self.broker_url)
            except ValueError as exc:
                raise ConfigError(f"VCRAWL_BROKER_URL {exc}") from None
        check_redis_tls(self)
        self._check_records_target()
        if self.redis_replica_wait_ms < 0:
            raise ConfigError(f"VCRAWL_REDIS_REPLICA_WAIT_MS must be 0 or more, got {self.redis_replica_wait_ms}")
        if not self.user_agents:
            raise ConfigError("VCRAWL_USER_AGENTS must list at least one User-Agent")
        for proxy in self.proxies:
            check_url("VCRAWL_PROXIES", proxy, ("http", "https"))
        self._check_header_values()
        self._check_proxy_harvest()
        if self.proxy_cooloff_max_s < self.proxy_cooloff_s:
            raise ConfigError(
                f"VCRAWL_PROXY_COOLOFF_MAX_S={self.proxy_cooloff_max_s:g} must be at least "
                f"VCRAWL_PROXY_COOLOFF_S={self.proxy_cooloff_s:g}"
            )
        if self.alert_webhook_url is not None:
            check_url("VCRAWL_ALERT_WEBHOOK_URL", self.alert_webhook_url, ("http", "https"))
        if self.alert_email_to and self.smtp_host is None:
            raise ConfigError("VCRAWL_ALERT_EMAIL_TO is set but VCRAWL_SMTP_HOST is not")
        if not 1 <= self.frontier_batch <= 1000:
            raise ConfigError(f"VCRAWL_FRONTIER_BATCH must be in [1, 1000], got {self.frontier_batch}")
        if self.stats_retention_days < 1:
            raise ConfigError(f"VCRAWL_STATS_RETENTION_DAYS must be at least 1, got {self.stats_retention_days}")
        if self.frontier_inflight < 1:
            raise ConfigError(f"VCRAWL_FRONTIER_INFLIGHT must be at least 1, got {self.frontier_inflight}")
        if self.min_rate_bytes_s < 0 or self.slow_window_s <= 0:
            raise ConfigError(
                f"VCRAWL_MIN_RATE_BYTES_S must be at least 0 and VCRAWL_SLOW_WINDOW_S above 0, got "
                f"{self.min_rate_bytes_s:g} and {self.slow_window_s:g}"
            )
        if not 0 <= self.interval_jitter <= 10:
            raise ConfigError(f"VCRAWL_INTERVAL_JITTER must be in [0, 10], got {self.interval_jitter}")
        if not 0 < self.alert_host_failure_rate <= 1:
            raise ConfigError(f"VCRAWL_ALERT_HOST_FAILURE_RATE must be in (0, 1], got {self.alert_host_failure_rate}")
        if self.node_weight is not None and not 0 <= self.node_weight <= 10_000:
            raise ConfigError(f"VCRAWL_NODE_WEIGHT must be in [0, 10000], got {self.node_weight}")
        if self.node_timeout_s < 2:  # a node beats every second or two
            raise ConfigError(f"VCRAWL_NODE_TIMEOUT_S must be at least 2, got {self.node_timeout_s:g}")
        if not 0 <= self.batch_analysis_retries <= 50:
            raise ConfigError(f"VCRAWL_BATCH_ANALYSIS_RETRIES must be in [0, 50], got {self.batch_analysis_retries}")
        if not 1 <= self.dns_ttl_s <= 3600:  # longer, a site that moved is fetched at its old address
            raise ConfigError(f"VCRAWL_DNS_TTL_S must be in [1, 3600], got {self.dns_ttl_s:g}")
        if self.dns_negative_ttl_s > self.dns_ttl_s:
            raise ConfigError(
                f"VCRAWL_DNS_NEGATIVE_TTL_S={self.dns_negative_ttl_s:g} must not exceed "
                f"VCRAWL_DNS_TTL_S={self.dns_ttl_s:g}"
            )
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"VCRAWL_LOG_FORMAT must be one of {'/'.join(LOG_FORMATS)}, got {self.log_format!r}")
        if self.log_stream_level not in LOG_LEVELS:
            raise ConfigError(
                f"VCRAWL_LOG_STREAM_LEVEL must be one of {'/'.join(LOG_LEVELS)}, got {self.log_stream_level!r}"
            )
        if self.log_maxlen < 100:
            raise ConfigError(f"VCRAWL_LOG_MAXLEN must be at least 100, got {self.log_maxlen}")
        if self.log_queue_size < 1:
            raise ConfigError(f"VCRAWL_LOG_QUEUE_SIZE must be at least 1, got {self.log_queue_size}")
        if not 0.1 <= self.log_levels_poll_s <= 60:
            raise ConfigError(f"VCRAWL_LOG_LEVELS_POLL_S must be in [0.1, 60], got {self.log_levels_poll_s:g}")
        if self.beat_lock_timeout_s < 5:  # beat renews its lock every tick (at most 3 s apart)
            raise ConfigError(f"VCRAWL_BEAT_LOCK_TIMEOUT_S must be at least 5, got {self.beat_lock_timeout_s:g}")
        # A task (with its longest retry wait) outliving the visibility timeout runs twice.
        longest_task_s = self.max_retry_after_s + self.total_timeout_s
        if self.visibility_timeout_s <= longest_task_s:
            raise ConfigError(
                f"VCRAWL_VISIBILITY_TIMEOUT_S={self.visibility_timeout_s:g} must exceed "
                f"VCRAWL_MAX_RETRY_AFTER_S + VCRAWL_TOTAL_TIMEOUT_S = {longest_task_s:g}"
            )
        # On RabbitMQ the bound is its consumer timeout: a message held past it is delivered twice. Held
        # longest: a retry's wait, then the task up to its time limit; or a proxy harvest up to its own.
        held_s = max(self.max_retry_after_s + self.total_timeout_s * 2 + 60, self.proxy_harvest_every_s + 120)
        if self.amqp_broker and self.rabbitmq_consumer_timeout_s <= held_s + 60:
            raise ConfigError(
                f"VCRAWL_RABBITMQ_CONSUMER_TIMEOUT_S={self.rabbitmq_consumer_timeout_s:g} (RabbitMQ's "
                f"consumer_timeout) must exceed {held_s + 60:g} s, the longest a task holds its message "
                "plus a minute: raise consumer_timeout in rabbitmq.conf, then this setting"
            )

    def _check_header_values(self) -> None:
        # Sent as HTTP header values (User-Agent, Referer, Proxy-Authorization, an api page's auth):
        # a CR or LF would fail every fetch later, so refuse them at start-up.
        pools = (("VCRAWL_USER_AGENTS", self.user_agents), ("VCRAWL_REFERERS", self.referers),
                 ("VCRAWL_PROXIES", self.proxies))  # fmt: skip
        for variable, values in pools:
            for index, value in enumerate(values):
                if (problem := header_value_problem(value)) is not None:
                    raise ConfigError(f"{variable}[{index}] {problem}")  # no echo: a proxy URL may hold a password
        for name, secret in self.api_auth.items():
            if (problem := header_value_problem(secret.strip())) is not None:
                raise ConfigError(f"{AUTH_PREFIX}{name} {problem}")

    def _check_records_target(self) -> None:
        if self.records_url is not None:
            try:
                check_records_url(self.records_url)
            except ValueError as exc:
                raise ConfigError(f"VCRAWL_RECORDS_URL {exc}") from None  # the message hides the password
        if not 1 <= self.records_connect_timeout_s <= 300 or not 1 <= self.records_statement_timeout_s <= 3600:
            raise ConfigError(f"VCRAWL_RECORDS_CONNECT_TIMEOUT_S must be in [1, 300] and VCRAWL_RECORDS_STATEMENT_"
                              f"TIMEOUT_S in [1, 3600], got {self.records_connect_timeout_s:g} and "
                              f"{self.records_statement_timeout_s:g}")  # fmt: skip

    def _check_proxy_harvest(self) -> None:
        if self.proxy_check_url is not None:
            check_url("VCRAWL_PROXY_CHECK_URL", self.proxy_check_url, ("http", "https"))
        if self.proxy_sources and self.proxy_check_url is None:
            raise ConfigError("VCRAWL_PROXY_SOURCES is set but VCRAWL_PROXY_CHECK_URL is not: every harvested "
                              "proxy is checked against it before it joins the pool")  # fmt: skip
        if self.proxy_max_latency_s <= 0:
            raise ConfigError(f"VCRAWL_PROXY_MAX_LATENCY_S must be above 0, got {self.proxy_max_latency_s:g}")
        if self.proxy_pool_max < 1 or self.proxy_candidates_max < 1:
            raise ConfigError(f"VCRAWL_PROXY_POOL_MAX and VCRAWL_PROXY_CANDIDATES_MAX must be at least 1, got "
                              f"{self.proxy_pool_max} and {self.proxy_candidates_max}")  # fmt: skip
        if not 1 <= self.proxy_check_concurrency <= 256:
            raise ConfigError(f"VCRAWL_PROXY_CHECK_CONCURRENCY must be in [1, 256], got {self.proxy_check_concurrency}")
        if self.proxy_harvest_every_s < 1:
            raise ConfigError(f"VCRAWL_PROXY_HARVEST_EVERY_S must be at least 1, got {self.proxy_harvest_every_s:g}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``VCRAWL_*`` variables; unset ones keep their defaults.

        Raises:
            ConfigError: a variable is malformed (the message names it and its value).
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for spec in _variables(cls):
            name = _PREFIX + spec.name.upper()
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                continue
            parse = FIELD_PARSERS.get(spec.name) or TYPE_PARSERS[str(spec.type)]
            values[spec.name] = parse(name, raw.strip())
        secrets = {name.removeprefix(AUTH_PREFIX): raw for name, raw in env.items() if name.startswith(AUTH_PREFIX)}
        if secrets:
            values["api_auth"] = secrets
        return cls(**values, given=frozenset(values))

    def frontier_target(self) -> Settings:
        """These settings aimed at the frontier's one server (``redis_url`` := ``frontier_url``), or themselves."""
        if self.frontier_url is None:
            return self
        return replace(self, redis_url=self.frontier_url, redis_sentinel_master="", frontier_url=None)

    def is_given(self, name: str) -> bool:
        """True if the field ``name`` was set by its variable (``from_env``), not left at its default.

        >>> Settings.from_env({"VCRAWL_REDIS_URL": "redis://r:6379/0"}).is_given("redis_url")
        True
        >>> Settings.from_env({}).is_given("redis_url")
        False
        """
        return name in self.given

    @property
    def amqp_broker(self) -> bool:
        """True if Celery's messages go through RabbitMQ (``VCRAWL_BROKER_URL``), not Redis.

        >>> Settings(broker_url="amqp://127.0.0.1:5672//").amqp_broker, Settings().amqp_broker
        (True, False)
        """
        return is_amqp(self.broker_url)

    @property
    def ring_weight(self) -> int:
        """This worker's weight on the host ring; 0: not on the ring.

        >>> Settings(node_weight=150).ring_weight, Settings(ring=True).ring_weight, Settings().ring_weight
        (150, 100, 0)
        """
        if self.node_weight is not None:
            return self.node_weight
        return DEFAULT_NODE_WEIGHT if self.ring else 0

    def to_env(self) -> dict[str, str]:
        """Return the ``VCRAWL_*`` variables that reproduce these settings in a child process."""
        env: dict[str, str] = {}
        for spec in _variables(self):
            value = getattr(self, spec.name)
            if value is None:
                continue
            if spec.name == "proxy_sources":
                text = dump_proxy_sources(value)
            elif isinstance(value, tuple):
                text = json.dumps(list(value))
            elif isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = str(value)
            env[_PREFIX + spec.name.upper()] = text
        env.update({AUTH_PREFIX + name: secret for name, secret in self.api_auth.items()})
        return env


def child_environment(settings: Settings | None = None) -> dict[str, str]:
    """A copy of this process's environment for a child process, with ``settings`` as its ``VCRAWL_*``
    variables when given (the one place outside ``Settings.from_env`` that reads ``os.environ``)."""
    env = dict(os.environ)
    if settings is not None:
        env.update(settings.to_env())
    return env


def _variables(settings: Settings | type[Settings]) -> list[Field[Any]]:
    """The fields that have a ``VCRAWL_*`` variable of their own (all but ``given``; ``api_auth`` has many)."""
    return [spec for spec in fields(settings) if spec.name not in ("given", "api_auth")]
