"""The cluster's live settings in Redis, and the thread that brings them into a worker process.

``LiveSettingsStore`` writes and reads the values ``vcrawl config set`` gives (one hash, and a revision
counter bumped with each change, in one transaction). ``LiveSettingsKeeper`` polls the counter (one GET
every ``poll_s``); when it moved, it reads the hash, builds the process's settings anew (its own base,
the cluster's values on top: ``vcrawl.live_settings.apply_overrides``) and hands them to ``apply``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

from cluster.periodic import Periodic
from vcrawl import redis_keys
from vcrawl.live_settings import apply_overrides, describe, live_value, setting_field
from vcrawl.redis_replies import text
from vcrawl.settings import Settings

__all__ = ["POLL_S", "LiveSettingsKeeper", "LiveSettingsStore"]

POLL_S = 2.0  # a change reaches every worker process within this (plus one Redis round trip)

logger = logging.getLogger(__name__)


class LiveSettingsStore:
    """The cluster's live values, checked against ``base`` (the settings of the process that sets them)."""

    def __init__(self, client: Any, base: Settings) -> None:
        self._client, self._base = client, base

    def set(self, name: str, value: str) -> str:
        """Set ``name`` for the whole cluster; return its ``VCRAWL_*`` name.

        Raises:
            InvalidTask: not a live setting (with why), or a bad value (naming the variable).
        """
        current, _ = apply_overrides(self._base, self.values())
        field, _ = live_value(name, value, current)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(redis_keys.live_settings(), field, value.strip())
            pipe.incr(redis_keys.live_settings_rev())
            pipe.execute()
        return f"VCRAWL_{field.upper()}"

    def unset(self, name: str) -> bool:
        """Drop the cluster's value of ``name`` (each node's environment or default applies again).

        Raises:
            InvalidTask: no such setting.
        """
        field = setting_field(name)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.hdel(redis_keys.live_settings(), field)
            pipe.incr(redis_keys.live_settings_rev())
            removed, _ = pipe.execute()
        return bool(removed)

    def values(self) -> dict[str, str]:
        """Field -> the value set live."""
        return {text(k): text(v) for k, v in self._client.hgetall(redis_keys.live_settings()).items()}

    def listing(self) -> list[dict[str, Any]]:
        """Every setting with its value and where it comes from (``vcrawl.live_settings.describe``)."""
        return describe(self._base, self.values())


class LiveSettingsKeeper:
    """Brings the cluster's live settings into this process within ``poll_s`` seconds of a change."""

    def __init__(
        self,
        client: Callable[[], Any],
        base: Settings,
        apply: Callable[[Settings], None],
        poll_s: float = POLL_S,
    ) -> None:
        self._client, self._base, self._apply = client, base, apply
        self._rev: bytes | str | None = None
        self._periodic = Periodic("vcrawl-live-settings", poll_s, self.poll)
        self._started = False
        self._skipped: dict[str, str] = {}

    def start(self) -> LiveSettingsKeeper:
        """Read the cluster's values now, then keep polling in a daemon thread."""
        self.poll()
        if not self._started:
            self._started = True
            self._periodic.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop polling."""
        self._periodic.stop(timeout_s)

    def poll(self) -> bool:
        """Take up a change, if the revision moved; return True if the settings were built anew."""
        try:
            client = self._client()
            rev = client.get(redis_keys.live_settings_rev())
            if rev == self._rev:
                return False
            raw = {text(k): text(v) for k, v in client.hgetall(redis_keys.live_settings()).items()}
        except redis.RedisError as exc:  # Redis away: the settings stay as they are; the next poll tries again
            logger.debug("live settings: could not read them: %r", exc)
            return False
        settings, skipped = apply_overrides(self._base, raw)
        if skipped != self._skipped:
            for field, why in skipped.items():
                logger.warning("live setting VCRAWL_%s not taken up by this process: %s", field.upper(), why)
            self._skipped = skipped
        try:
            self._apply(settings)
        except Exception:  # a reader's bug must not end the thread: the next change tries again
            logger.exception("live settings: taking them up failed")
            return False
        if self._rev is not None:
            logger.info("live settings taken up: %s", ", ".join(f"VCRAWL_{f.upper()}" for f in sorted(raw)) or "none")
        self._rev = rev
        return True
