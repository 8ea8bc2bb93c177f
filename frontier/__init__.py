"""Deciding which URLs are crawled and when: canonical form, scope, robots.txt, dedup, queues."""

from __future__ import annotations

from frontier.dedup import BloomFilter, RecentUrls, bloom_bits, bloom_hashes, expected_fpr
from frontier.filter_registry import FilterChain, FilterRegistry, filter_chain, filter_names, load_filters
from frontier.filters import DEFAULT_SKIP_SUFFIXES, REASONS, AdmissionContext, Scope, UrlFilter, reject_reason
from frontier.frontier import Frontier
from frontier.history import History, UrlHistory, content_hash, next_interval, parse_http_date
from frontier.holds import OriginHolds
from frontier.lifecycle import JobLifecycle
from frontier.politeness import HostGate
from frontier.queue import FrontierQueue
from frontier.records import (
    Admission,
    AdmitRequest,
    Batch,
    BatchRelease,
    Candidate,
    CycleStart,
    Entry,
    PumpResult,
)
from frontier.robots import MAX_ROBOTS_BYTES, RobotsCache, RobotsResponse, RobotsRules, read_robots, robots_url
from frontier.statistics import FrontierStats
from frontier.urls import DEFAULT_TRACKING_PARAMS, canonical_url, dedup_key, host_key, origin

__all__ = [
    "DEFAULT_SKIP_SUFFIXES",
    "DEFAULT_TRACKING_PARAMS",
    "MAX_ROBOTS_BYTES",
    "REASONS",
    "Admission",
    "AdmissionContext",
    "AdmitRequest",
    "Batch",
    "BatchRelease",
    "BloomFilter",
    "Candidate",
    "CycleStart",
    "Entry",
    "FilterChain",
    "FilterRegistry",
    "Frontier",
    "FrontierQueue",
    "FrontierStats",
    "History",
    "HostGate",
    "JobLifecycle",
    "OriginHolds",
    "PumpResult",
    "RecentUrls",
    "RobotsCache",
    "RobotsResponse",
    "RobotsRules",
    "Scope",
    "UrlFilter",
    "UrlHistory",
    "bloom_bits",
    "bloom_hashes",
    "canonical_url",
    "content_hash",
    "dedup_key",
    "expected_fpr",
    "filter_chain",
    "filter_names",
    "host_key",
    "load_filters",
    "next_interval",
    "origin",
    "parse_http_date",
    "read_robots",
    "reject_reason",
    "robots_url",
]
