"""A fetcher's limits: from a job's resolved limits, or the cluster's ``VCRAWL_*`` settings for a job that sets none."""

from __future__ import annotations

from fetchers.base import FetchLimits
from vcrawl.jobs import LimitsSpec
from vcrawl.settings import Settings

__all__ = ["cluster_limits", "fetch_limits"]


def fetch_limits(limits: LimitsSpec) -> FetchLimits:
    """A fetcher's limits from resolved job limits (every field set)."""
    assert limits.connect_timeout_s is not None and limits.read_timeout_s is not None
    assert limits.total_timeout_s is not None and limits.max_body_bytes is not None
    assert limits.max_redirects is not None and limits.min_rate_bytes_s is not None
    assert limits.slow_window_s is not None
    return FetchLimits(
        connect_timeout_s=limits.connect_timeout_s,
        read_timeout_s=limits.read_timeout_s,
        total_timeout_s=limits.total_timeout_s,
        min_rate_bytes_s=limits.min_rate_bytes_s,
        slow_window_s=limits.slow_window_s,
        max_body_bytes=limits.max_body_bytes,
        max_redirects=limits.max_redirects,
    )


def cluster_limits(settings: Settings) -> LimitsSpec:
    """The limits of a job that sets none: the cluster's ``VCRAWL_*`` settings."""
    return LimitsSpec(
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        total_timeout_s=settings.total_timeout_s,
        min_rate_bytes_s=settings.min_rate_bytes_s,
        slow_window_s=settings.slow_window_s,
        max_body_bytes=settings.max_body_bytes,
        max_redirects=settings.max_redirects,
        retries=settings.fetch_retries,
    )
