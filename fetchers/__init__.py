"""Downloading pages: the fetcher interface, the static and browser fetchers, the registry, and
what fetching needs around them (limits, the network guard, identities, proxies and their harvest)."""

from __future__ import annotations

from fetchers.base import (
    RETRYABLE_STATUSES,
    Fetcher,
    FetchLimits,
    FetchRequest,
    FetchResult,
    check_status,
    parse_retry_after,
)
from fetchers.browser import BrowserConfig, BrowserFetcher, chromium_processes
from fetchers.dns_cache import DnsCache, DnsCacheStats
from fetchers.identity import IdentityPool
from fetchers.netguard import NetworkPolicy
from fetchers.proxies import PROXY_FAULTS, ProxyHealth, fetch_through, is_proxy_fault, proxy_counter, proxy_stats
from fetchers.registry import BUILTIN_FETCHERS, FetcherContext, FetcherFactory, FetcherRegistry
from fetchers.static import StaticFetcher, make_session

__all__ = [
    "BUILTIN_FETCHERS",
    "PROXY_FAULTS",
    "RETRYABLE_STATUSES",
    "BrowserConfig",
    "BrowserFetcher",
    "DnsCache",
    "DnsCacheStats",
    "FetchLimits",
    "FetchRequest",
    "FetchResult",
    "Fetcher",
    "FetcherContext",
    "FetcherFactory",
    "FetcherRegistry",
    "IdentityPool",
    "NetworkPolicy",
    "ProxyHealth",
    "StaticFetcher",
    "check_status",
    "chromium_processes",
    "fetch_through",
    "is_proxy_fault",
    "make_session",
    "parse_retry_after",
    "proxy_counter",
    "proxy_stats",
]
