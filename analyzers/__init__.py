"""Analyzers: turn a fetched page into a JSON-ready result (links, fields, a plugin's or a program's),
or an API's answer into records (``analyzers.api``)."""

from __future__ import annotations

from analyzers.api import ApiAnswer, read_answer
from analyzers.fields import compile_rules
from analyzers.links import TRUNCATED, followed_links
from analyzers.links import analyze as links_analyzer
from analyzers.page import Page, is_html
from analyzers.programs import ProgramAnalyzer, load_programs
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
    "TRUNCATED",
    "Analyzer",
    "ApiAnswer",
    "Page",
    "ProgramAnalyzer",
    "Registry",
    "analyzer_names",
    "check_rules",
    "compile_rules",
    "followed_links",
    "get_analyzer",
    "is_html",
    "links_analyzer",
    "load_plugins",
    "load_programs",
    "read_answer",
    "run_analysis",
]
