"""The identity a request is sent with: User-Agent, Referer and proxy, drawn at random."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["IdentityPool"]


@dataclass(frozen=True)
class IdentityPool:
    """Configured lists to draw from; an empty referer or proxy list means none is sent."""

    user_agents: tuple[str, ...]
    referers: tuple[str, ...] = ()
    proxies: tuple[str, ...] = ()
    # True: the cluster's harvested proxies join ``proxies`` when drawn through the proxy bench
    # (fetchers.proxies.ProxyHealth); set for the cluster's own pool when proxy sources are
    # configured, never for a job's own list.
    harvested: bool = False

    def __post_init__(self) -> None:
        if not self.user_agents:
            raise ValueError("IdentityPool needs at least one User-Agent")

    def user_agent(self, rng: random.Random | None = None) -> str:
        """Draw a User-Agent."""
        return _choice(self.user_agents, rng)

    def referer(self, rng: random.Random | None = None) -> str | None:
        """Draw a Referer, or None when the list is empty."""
        return _choice(self.referers, rng) if self.referers else None

    def proxy(self, rng: random.Random | None = None) -> str | None:
        """Draw a proxy URL, or None when the pool is empty."""
        return _choice(self.proxies, rng) if self.proxies else None


def _choice(items: Sequence[str], rng: random.Random | None) -> str:
    return (rng or random).choice(items)
