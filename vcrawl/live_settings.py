"""Cluster settings changed without restarts: which ``VCRAWL_*`` settings may be set live, and how.

``vcrawl config set NAME VALUE`` (or the API) stores a value in Redis for the whole cluster; every
worker reads the cluster's values within seconds (``tasks.deps.live``) and builds its settings anew:
its environment's, with the cluster's values on top, checked together as at start. Only settings
whose every reader builds again from the new values are live; the rest are refused with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.setting_parsers import FIELD_PARSERS, TYPE_PARSERS
from vcrawl.settings import Settings
from vcrawl.targets.clusters import shown_url

__all__ = ["LIVE_SETTINGS", "apply_overrides", "describe", "live_value", "not_live_reason", "setting_field"]

_PREFIX = "VCRAWL_"
MAX_VALUE_CHARS = 64 * 1024

LIVE_SETTINGS: Mapping[str, str] = {
    # Rates and retries: single tasks' pause; every job's retries (jobs set their own pause).
    "min_interval_s": "rates", "interval_jitter": "rates", "fetch_retries": "rates", "fetch_backoff_s": "rates",
    "fetch_backoff_max_s": "rates",
    # Timeouts of a request (the total is not: Celery's task time limit is derived from it at start).
    "connect_timeout_s": "timeouts", "read_timeout_s": "timeouts", "min_rate_bytes_s": "timeouts",
    "slow_window_s": "timeouts", "max_redirects": "timeouts",
    # Who a request says it is, and what it goes through.
    "user_agents": "identity", "referers": "identity", "proxies": "proxies", "proxy_sources": "proxies",
    "proxy_check_url": "proxies", "proxy_max_latency_s": "proxies", "proxy_pool_max": "proxies",
    "proxy_candidates_max": "proxies", "proxy_check_concurrency": "proxies",
    # Logs: the stream's default level (a logger's own level is live already: vcrawl logs --set-level).
    "log_stream_level": "logs",
    # Alert targets and thresholds.
    "alert_webhook_url": "alerts", "alert_email_to": "alerts", "alert_email_from": "alerts", "smtp_host": "alerts",
    "smtp_port": "alerts", "smtp_starttls": "alerts", "alert_window_s": "alerts", "alert_host_failure_rate": "alerts",
    "alert_host_min_fetches": "alerts",
}  # fmt: skip

_SECRETS = frozenset({"redis_password", "redis_sentinel_password", "smtp_password", "smtp_user", "api_token",
                      "records_url", "broker_url"})  # fmt: skip
_REASONS: Mapping[str, str] = {
    **dict.fromkeys(("redis_url", "redis_sentinel_master", "frontier_url", "redis_tls", "redis_sentinel_tls",
                     "redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file", "redis_tls_verify", "data",
                     "hdfs_user", "hdfs_namenodes", "hdfs_kerberos", "records_url", "broker_url"),
                    "where a process connects or stores: set it in each node's environment and restart"),
    **dict.fromkeys(("total_timeout_s", "visibility_timeout_s", "task_events", "max_retry_after_s",
                     "rabbitmq_quorum", "rabbitmq_consumer_timeout_s"),
                    "Celery's configuration is derived from it when a worker starts: restart to change it"),
    **dict.fromkeys(("pump", "ring", "node_weight", "node_timeout_s", "frontier_batch", "frontier_inflight",
                     "schedules_file", "beat_lock_timeout_s", "proxy_harvest_every_s"),
                    "it shapes the cluster itself (the pump, the ring, beat): restart the nodes to change it"),
    **dict.fromkeys(("chromium_path", "chromedriver_path", "browser_page_timeout_s", "browser_lazy_timeout_s",
                     "browser_max_pages", "max_body_bytes"),
                    "a running browser keeps it: restart the workers to change it"),
}  # fmt: skip
_URL_TOKENS = frozenset({"alert_webhook_url"})  # URLs whose path may be a secret token
_DEFAULT_REASON = "read once when a process starts: set it in the environment and restart"


def setting_field(name: str) -> str:
    """The settings field of ``VCRAWL_READ_TIMEOUT_S`` or ``read_timeout_s`` (any case).

    Raises:
        InvalidTask: no such setting.
    """
    field = name.strip().upper().removeprefix(_PREFIX).lower()
    if field not in _FIELDS:
        raise InvalidTask("name", f"no setting {name!r}; see docs/configuration.md")
    return field


def not_live_reason(field: str) -> str | None:
    """Why ``field`` cannot be set live, or None if it can."""
    if field in LIVE_SETTINGS:
        return None
    if field in _SECRETS:
        return "a secret: it stays in each node's environment, never in Redis"
    return _REASONS.get(field, _DEFAULT_REASON)


def live_value(name: str, raw: str, base: Settings) -> tuple[str, Any]:
    """Check a value set live: the field it sets and the value parsed, valid together with ``base``.

    Raises:
        InvalidTask: not a live setting (with why), or a value that does not parse or does not hold with
            the other settings (the message names the variable).
    """
    field = setting_field(name)
    if (reason := not_live_reason(field)) is not None:
        raise InvalidTask("name", f"{_PREFIX}{field.upper()} cannot be set live: {reason}")
    if not isinstance(raw, str) or len(raw) > MAX_VALUE_CHARS:
        raise InvalidTask("value", f"must be a string of at most {MAX_VALUE_CHARS} characters")
    try:
        value = _parse(field, raw)
        dataclasses.replace(base, **{field: value})  # checked with the rest, as at start
    except ConfigError as exc:
        raise InvalidTask("value", str(exc)) from None
    return field, value


def apply_overrides(base: Settings, raw: Mapping[str, str]) -> tuple[Settings, dict[str, str]]:
    """``base`` with the cluster's live values on top; returns it and the values left out, with why.

    A value this node cannot take (its environment differs, a value stored by a newer version) is left
    out and reported, never a reason for a worker to stop.
    """
    values: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for field, text in sorted(raw.items()):
        try:
            if not_live_reason(field) is not None:
                raise ConfigError("not a live setting")
            values[field] = _parse(field, text)
            dataclasses.replace(base, **values)
        except (ConfigError, InvalidTask, KeyError) as exc:
            values.pop(field, None)
            skipped[field] = str(exc)
    if not values:
        return base, skipped
    return dataclasses.replace(base, **values, given=base.given | frozenset(values)), skipped


def describe(base: Settings, raw: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every setting: its value, where it comes from (default, environment, cluster) and whether it is live.

    Secrets show only whether they are set.
    """
    current, skipped = apply_overrides(base, raw)
    applied = set(raw) - set(skipped)
    rows = []
    for field in _FIELDS:
        value = getattr(current, field)
        source = "cluster" if field in applied else "environment" if field in base.given else "default"
        shown: Any = ("(set)" if value else "(not set)") if field in _SECRETS else _plain(value, field)
        reason = not_live_reason(field)
        rows.append({"name": _PREFIX + field.upper(), "value": shown, "source": source, "live": reason is None,
                     **({"why_not_live": reason} if reason else {})})  # fmt: skip
    return rows


def _parse(field: str, raw: str) -> Any:
    parse = FIELD_PARSERS.get(field) or TYPE_PARSERS[str(_TYPES[field])]
    return parse(_PREFIX + field.upper(), raw.strip())


def _plain(value: Any, field: str) -> Any:
    if isinstance(value, tuple):
        return [_plain(item, field) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, str) and "://" in value:
        shown = shown_url(value)  # never a password, in the address or a password= parameter
        if field in _URL_TOKENS:  # of a webhook, only where it goes: its path is often its token
            parts = urlsplit(shown)
            return f"{parts.scheme}://{parts.netloc}/…"
        return shown
    return value


_TYPES = {spec.name: spec.type for spec in dataclasses.fields(Settings) if spec.name not in ("given", "api_auth")}
_FIELDS = tuple(_TYPES)
