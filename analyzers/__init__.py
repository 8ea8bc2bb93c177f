"""Analyzers: turn a fetched page into a JSON-ready result (links, fields, or a plugin's)."""

from __future__ import annotations

from analyzers.fields import compile_rules
from analyzers.links import FOLLOWED_TAGS, followed_links
from analyzers.links import analyze as links_analyzer
from analyzers.page import Page
from analyzers.registry import (
    Analyzer,
    Registry,
    analyzer_names,
    check_rules,
    get_analyzer,
    load_plugins,
    run_analysis,
)

__all__ = [
    "FOLLOWED_TAGS",
    "Analyzer",
    "Page",
    "Registry",
    "analyzer_names",
    "check_rules",
    "compile_rules",
    "followed_links",
    "get_analyzer",
    "links_analyzer",
    "load_plugins",
    "run_analysis",
]
