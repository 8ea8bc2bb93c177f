"""What vcrawl needs from Redis to lose nothing, checked when a worker starts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from vcrawl.redis_replies import text

__all__ = ["check_redis_persistence", "persistence_problems"]

logger = logging.getLogger(__name__)


def persistence_problems(config: Mapping[str, str]) -> list[str]:
    """Ways a Redis with this ``CONFIG GET`` output can lose vcrawl's queues and job state.

    >>> persistence_problems({"appendonly": "yes", "appendfsync": "everysec", "maxmemory": "0",
    ...                       "maxmemory-policy": "noeviction"})
    []
    >>> persistence_problems({"appendonly": "no", "save": "", "maxmemory": "1gb", "maxmemory-policy": "allkeys-lru"})[0]
    'appendonly is no and save is empty: a Redis restart loses every queued message and all job state'
    """
    problems = []
    if config.get("appendonly", "no") != "yes":
        if not config.get("save", "").strip():
            problems.append(
                "appendonly is no and save is empty: a Redis restart loses every queued message and all job state"
            )
        else:
            problems.append(f"appendonly is no: a Redis restart loses what changed since the last snapshot "
                            f"(save {config.get('save')!r}); set appendonly yes")  # fmt: skip
    elif config.get("appendfsync") == "no":
        problems.append("appendfsync is no: a machine crash can lose many seconds of writes; use everysec")
    if config.get("maxmemory", "0") not in ("0", "") and config.get("maxmemory-policy", "noeviction") != "noeviction":
        problems.append(f"maxmemory-policy is {config.get('maxmemory-policy')}: Redis may evict queued messages "
                        "and frontier keys when full; use noeviction")  # fmt: skip
    return problems


def check_redis_persistence(client: Any) -> list[str]:
    """Log a loud warning per problem (or that the check was not possible); return the problems."""
    try:
        config: dict[str, str] = {}
        for name in ("appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy"):
            config.update({text(k): text(v) for k, v in client.config_get(name).items()})
    except Exception as exc:  # CONFIG is often disabled on managed Redis
        logger.warning("vcrawl could not read the Redis configuration (%s); make sure it persists: see "
                       "'Guarantees' in the README", exc)  # fmt: skip
        return []
    problems = persistence_problems(config)
    for problem in problems:
        logger.warning("REDIS CAN LOSE DATA: %s", problem)
    return problems
