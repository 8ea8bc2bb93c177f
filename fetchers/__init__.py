"""Downloading pages: the fetcher interface, the static fetcher and the registry."""

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
from fetchers.identity import IdentityPool
from fetchers.netguard import NetworkPolicy
from fetchers.registry import FetcherRegistry
from fetchers.static import StaticFetcher, make_session

__all__ = [
    "RETRYABLE_STATUSES",
    "BrowserConfig",
    "BrowserFetcher",
    "FetchLimits",
    "FetchRequest",
    "FetchResult",
    "Fetcher",
    "FetcherRegistry",
    "IdentityPool",
    "NetworkPolicy",
    "StaticFetcher",
    "check_status",
    "chromium_processes",
    "make_session",
    "parse_retry_after",
]
