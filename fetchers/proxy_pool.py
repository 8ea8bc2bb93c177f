"""The harvested proxies in Redis: the pool fetches draw from besides ``VCRAWL_PROXIES``.

Two keys (``redis_keys.proxy_pool``, ``proxy_pool_info``): a sorted set of proxy URLs by their
latency at the last check (ms), and a hash of each one's last check. A harvest replaces both at
once (MULTI), so fetches never see half a pool, and in the same MULTI clears the bench records
(``redis_keys.proxy_health``) of the proxies it dropped; ``ProxyHealth`` reads the set with its bench.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from fetchers.proxies import _name
from vcrawl import redis_keys
from vcrawl.redis_replies import text

__all__ = ["HarvestedProxy", "read_pool", "write_pool"]


@dataclass(frozen=True)
class HarvestedProxy:
    """A proxy in the harvested pool and its last check."""

    proxy: str
    latency_s: float
    anonymity: str = ""
    source: str = ""  # the proxy source that listed it first
    checked_at: float = 0.0  # unix time of its last check

    def to_dict(self) -> dict[str, Any]:
        """The JSON form kept in Redis."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HarvestedProxy:
        """Read back ``to_dict``'s form (unknown keys ignored: written by a newer version)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def read_pool(client: Any) -> list[HarvestedProxy]:
    """The harvested pool, fastest first."""
    pipe = client.pipeline(transaction=False)
    pipe.zrange(redis_keys.proxy_pool(), 0, -1, withscores=True)
    pipe.hgetall(redis_keys.proxy_pool_info())
    ranked, info = pipe.execute()
    info = {text(key): text(value) for key, value in info.items()}
    pool = []
    for member, score in ranked:
        proxy = text(member)
        try:
            record = HarvestedProxy.from_dict(json.loads(info[proxy]))
        except (KeyError, ValueError, TypeError):  # no record: what the set says is enough
            record = HarvestedProxy(proxy, score / 1000)
        pool.append(record)
    return pool


def write_pool(client: Any, pool: Sequence[HarvestedProxy], forget: Iterable[str] = ()) -> None:
    """Replace the harvested pool with ``pool``, and drop the bench records of the proxies in
    ``forget`` (ones that left the pool), in one transaction.

    A bench record goes only when its proxy succeeds again or the whole bench expires: a proxy that
    left the pool is drawn no more, so without this its record would stay while others are marked.
    """
    names = sorted({_name(proxy) for proxy in forget})  # the bench's fields (fetchers.proxies)
    pipe = client.pipeline(transaction=True)
    pipe.delete(redis_keys.proxy_pool(), redis_keys.proxy_pool_info())
    if names:
        pipe.hdel(redis_keys.proxy_health(), *names)
    if pool:
        pipe.zadd(redis_keys.proxy_pool(), {entry.proxy: round(entry.latency_s * 1000, 1) for entry in pool})
        pipe.hset(redis_keys.proxy_pool_info(), mapping={entry.proxy: json.dumps(entry.to_dict()) for entry in pool})
    pipe.execute()
