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
from fetchers.identity import IdentityPool
from fetchers.registry import FetcherRegistry
from fetchers.static import StaticFetcher, make_session

__all__ = [
    "RETRYABLE_STATUSES",
    "FetchLimits",
    "FetchRequest",
    "FetchResult",
    "Fetcher",
    "FetcherRegistry",
    "IdentityPool",
    "StaticFetcher",
    "check_status",
    "make_session",
    "parse_retry_after",
]
