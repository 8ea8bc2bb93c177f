"""Analyzers by name: the built-ins plus plugins from the ``vcrawl.analyzers`` entry-point group."""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from analyzers import fields, links, programs
from analyzers.page import Page
from vcrawl.errors import ConfigError, UnknownComponent
from vcrawl.payloads import FieldRule
from vcrawl.plugins import choose_entry_points, describe, load_plugin
from vcrawl.settings import Settings

__all__ = [
    "BUILTIN_ANALYZERS",
    "ENTRY_POINT_GROUP",
    "Analyzer",
    "Registry",
    "analyzer_names",
    "check_rules",
    "get_analyzer",
    "load_plugins",
    "run_analysis",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vcrawl.analyzers"


class Analyzer(Protocol):
    """Turns one page (and the task's field rules, if any) into a JSON-ready dict."""

    def __call__(self, page: Page, rules: Mapping[str, FieldRule] | None) -> dict[str, Any]:
        """Return the analysis of `page`."""
        ...


BUILTIN_ANALYZERS: Mapping[str, Analyzer] = MappingProxyType({"links": links.analyze, "fields": fields.analyze})


class Registry:
    """The built-in analyzers plus the entry-point plugins and the analyzer programs, loaded once, on first lookup."""

    def __init__(
        self,
        builtins: Mapping[str, Analyzer] = BUILTIN_ANALYZERS,
        entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
        programs: Callable[[], Mapping[str, Analyzer]] | None = None,
    ) -> None:
        """Use `entry_points` instead of the installed ``vcrawl.analyzers`` group when given;
        `programs` is called once, at load, for the external-program analyzers (None: none)."""
        self._builtins = dict(builtins)
        self._entry_points = None if entry_points is None else tuple(entry_points)
        self._programs = programs
        self._loaded: dict[str, Analyzer] | None = None
        self._lock = threading.Lock()

    def get(self, name: str) -> Analyzer:
        """Return the analyzer called `name`.

        Raises:
            UnknownComponent: no analyzer has that name.
            ConfigError: the plugins cannot be loaded (see `load`).
        """
        analyzers = self._analyzers()
        try:
            return analyzers[name]
        except KeyError:
            raise UnknownComponent("analyzer", name, sorted(analyzers)) from None

    def names(self) -> list[str]:
        """Return every analyzer name, sorted.

        Raises:
            ConfigError: the plugins cannot be loaded (see `load`).
        """
        return sorted(self._analyzers())

    def load(self) -> None:
        """Load the plugins now (a worker calls this at start-up to fail early).

        Raises:
            ConfigError: a plugin's or program's name is taken, a plugin fails to import or is not
                callable, or the analyzer programs file is malformed.
        """
        self._analyzers()

    def run(self, page: Page, name: str, rules: Mapping[str, FieldRule] | None) -> dict[str, Any]:
        """Run the analyzer called `name` on `page`.

        Raises:
            UnknownComponent: no analyzer has that name.
            InvalidTask: the analyzer refuses `rules`.
            ConfigError: the plugins cannot be loaded, or the analyzer returned no dict.
        """
        result = self.get(name)(page, rules)
        if not isinstance(result, dict):
            raise ConfigError(f"analyzer {name!r} returned {type(result).__name__}, not a dict")
        return result

    def _analyzers(self) -> dict[str, Analyzer]:
        if self._loaded is None:
            with self._lock:
                if self._loaded is None:
                    self._loaded = self._load_plugins()
        return self._loaded

    def _load_plugins(self) -> dict[str, Analyzer]:
        entry_points = self._entry_points
        if entry_points is None:
            entry_points = tuple(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
        chosen = choose_entry_points(entry_points, "analyzer", dict.fromkeys(self._builtins))
        analyzers = dict(self._builtins)
        for name, entry_point in chosen.items():
            analyzers[name] = load_plugin(entry_point, "analyzer")
            logger.info("loaded analyzer plugin %s", describe(entry_point))
        for name, program in (self._programs() if self._programs is not None else {}).items():
            if name in analyzers:
                kind = "built-in" if name in self._builtins else "plugin"
                raise ConfigError(f"analyzer program {name!r} ({programs.SETTING}) uses the name of a {kind} analyzer")
            analyzers[name] = program
            logger.info("loaded analyzer program %s: %s", name, program)
        return analyzers


def _configured_programs() -> Mapping[str, Analyzer]:
    """The programs of ``VCRAWL_ANALYZER_PROGRAMS``, read in the process that looks analyzers up."""
    path = Settings.from_env().analyzer_programs
    return {} if path is None else programs.load_programs(path)


_default = Registry(programs=_configured_programs)


def get_analyzer(name: str) -> Analyzer:
    """Return the analyzer called `name` from the installed built-ins and plugins.

    Raises:
        UnknownComponent: no analyzer has that name.
        ConfigError: the plugins cannot be loaded.
    """
    return _default.get(name)


def analyzer_names() -> list[str]:
    """Return the names of the installed analyzers, sorted.

    Raises:
        ConfigError: the plugins cannot be loaded.
    """
    return _default.names()


def load_plugins() -> None:
    """Load the installed analyzer plugins now rather than on first lookup.

    Raises:
        ConfigError: a plugin's name is taken, or it fails to import or is not callable.
    """
    _default.load()


def run_analysis(page: Page, analyzer_name: str, rules: Mapping[str, FieldRule] | None) -> dict[str, Any]:
    """Look up `analyzer_name` among the installed analyzers and run it on `page`.

    Raises:
        UnknownComponent: no analyzer has that name.
        InvalidTask: the analyzer refuses `rules`.
        ConfigError: the plugins cannot be loaded, or the analyzer returned no dict.
    """
    return _default.run(page, analyzer_name, rules)


def check_rules(rules: Mapping[str, FieldRule] | None) -> None:
    """Compile every field rule once, so a bad selector is refused at submit time.

    Raises:
        InvalidTask: ``fields.<name>.css`` / ``fields.<name>.xpath`` naming the bad selector.
    """
    if rules is not None:
        fields.compile_rules(rules)
