"""A priority job's URL scores: the job's ``priorities`` (pattern -> priority) and the formula (docs/strategies.md).

A URL's score when it is admitted is its first matching pattern's priority (0 for none), plus its
sitemap's ``priority`` (0.5 when none), minus 0.1 per link followed from a seed. The frontier adds
0.1 per link to it found while it waits in its queue, for at most 10 (``vcrawl.names.INLINK_BONUS``,
``INLINK_CAP``: ``frontier/lua/admit.lua`` reads them there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vcrawl.errors import InvalidTask, checked_regex, kind_of

__all__ = [
    "DEPTH_PENALTY",
    "PRIORITY_BOUND",
    "SITEMAP_DEFAULT_PRIORITY",
    "PriorityPatterns",
    "PrioritySpec",
    "compiled_priorities",
    "parse_priorities",
    "url_priority",
]

PRIORITY_BOUND = 100.0
"""The largest priority a job's ``priorities`` may give (and the smallest, negated)."""
SITEMAP_DEFAULT_PRIORITY = 0.5
"""A URL's sitemap part when no sitemap gave it one (the sitemap protocol's default)."""
DEPTH_PENALTY = 0.1
"""What each link followed from a seed takes off a URL's priority."""


@dataclass(frozen=True)
class PrioritySpec:
    """A priority job's pattern -> priority (-100..100): the first pattern that matches a URL gives its part."""

    pattern: str
    priority: float


PriorityPatterns = tuple[tuple[re.Pattern[str], float], ...]
"""A job's priorities with each pattern compiled (``compiled_priorities``)."""


def compiled_priorities(priorities: tuple[PrioritySpec, ...]) -> PriorityPatterns:
    """Each pattern compiled once (a job's runtime keeps them), with its priority."""
    return tuple((re.compile(p.pattern), p.priority) for p in priorities)


def url_priority(patterns: PriorityPatterns, url: str, depth: int, sitemap_priority: float | None = None) -> float:
    """A URL's score when admitted (higher: fetched sooner), to two decimals.

    >>> shop = compiled_priorities((PrioritySpec("/shop/", 10),))
    >>> url_priority(shop, "http://a.test/shop/1", 2), url_priority(shop, "http://a.test/x", 1, 0.9)
    (10.3, 0.8)
    """
    part = next((priority for regex, priority in patterns if regex.search(url)), 0.0)
    sitemap = SITEMAP_DEFAULT_PRIORITY if sitemap_priority is None else sitemap_priority
    return round(part + sitemap - DEPTH_PENALTY * depth, 2)


def parse_priorities(value: Any) -> tuple[PrioritySpec, ...]:
    """A job's ``priorities`` list, validated.

    Raises:
        InvalidTask: ``field`` is the path of the bad key, e.g. ``priorities[1].priority``.
    """
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidTask("priorities", f"must be a list of {{pattern, priority}}, got {kind_of(value)}")
    return tuple(_item(raw, f"priorities[{index}]") for index, raw in enumerate(value))


def _item(raw: Any, where: str) -> PrioritySpec:
    if not isinstance(raw, Mapping):
        raise InvalidTask(where, f"must be a mapping with pattern and priority, got {kind_of(raw)}")
    if unknown := sorted(set(raw) - {"pattern", "priority"}):
        raise InvalidTask(f"{where}.{unknown[0]}", "unknown key; known: pattern, priority")
    pattern, priority = raw.get("pattern"), raw.get("priority")
    if not isinstance(pattern, str) or not pattern:
        raise InvalidTask(f"{where}.pattern", f"must be a non-empty regex, got {pattern!r}")
    checked_regex(pattern, f"{where}.pattern")
    if isinstance(priority, bool) or not isinstance(priority, int | float) or not abs(priority) <= PRIORITY_BOUND:
        raise InvalidTask(f"{where}.priority", f"must be a number from -100 to 100, got {priority!r}")
    return PrioritySpec(pattern, float(priority))
