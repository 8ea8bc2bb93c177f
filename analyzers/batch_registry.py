"""Batch analyzers by name: the built-ins plus plugins from the ``vcrawl.batch_analyzers`` entry points.

An entry point names a class (or any callable) that makes a ``BatchAnalyzer``; it is called
once per lookup, so an analyzer may keep state for one run.
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from analyzers.batch import BATCH_ENTRY_POINT_GROUP, BatchAnalyzer
from analyzers.near_duplicates import NearDuplicates
from analyzers.site_report import SiteReport
from vcrawl.errors import ConfigError, UnknownComponent
from vcrawl.plugins import describe, load_plugin

__all__ = ["BUILTIN_BATCH_ANALYZERS", "BatchRegistry", "batch_analyzer_names", "get_batch_analyzer"]

BUILTIN_BATCH_ANALYZERS: Mapping[str, Callable[[], BatchAnalyzer]] = MappingProxyType(
    {"site-report": SiteReport, "near-duplicates": NearDuplicates}
)


class BatchRegistry:
    """The built-in batch analyzers plus the entry-point plugins, loaded once, on first lookup."""

    def __init__(
        self,
        builtins: Mapping[str, Callable[[], BatchAnalyzer]] = BUILTIN_BATCH_ANALYZERS,
        entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    ) -> None:
        self._builtins = dict(builtins)
        self._entry_points = None if entry_points is None else tuple(entry_points)
        self._loaded: dict[str, Callable[[], BatchAnalyzer]] | None = None
        self._lock = threading.Lock()

    def get(self, name: str) -> BatchAnalyzer:
        """A new instance of the batch analyzer called ``name``.

        Raises:
            UnknownComponent: no batch analyzer has that name.
            ConfigError: a plugin cannot be loaded, or makes no map/reduce analyzer.
        """
        factories = self._factories()
        try:
            factory = factories[name]
        except KeyError:
            raise UnknownComponent("batch analyzer", name, sorted(factories)) from None
        analyzer = factory()
        if not (callable(getattr(analyzer, "map", None)) and callable(getattr(analyzer, "reduce", None))):
            raise ConfigError(f"batch analyzer {name!r} has no map and reduce methods")
        return analyzer

    def names(self) -> list[str]:
        """Every batch analyzer name, sorted."""
        return sorted(self._factories())

    def _factories(self) -> dict[str, Callable[[], BatchAnalyzer]]:
        if self._loaded is None:
            with self._lock:
                if self._loaded is None:
                    self._loaded = self._load()
        return self._loaded

    def _load(self) -> dict[str, Callable[[], BatchAnalyzer]]:
        entry_points = self._entry_points
        if entry_points is None:
            entry_points = tuple(importlib.metadata.entry_points(group=BATCH_ENTRY_POINT_GROUP))
        factories = dict(self._builtins)
        for entry_point in entry_points:
            if entry_point.name in factories:
                taken = entry_point.name
                raise ConfigError(f"batch analyzer plugin {describe(entry_point)} uses the taken name {taken!r}")
            factories[entry_point.name] = load_plugin(entry_point, "batch analyzer")
        return factories


_default = BatchRegistry()


def get_batch_analyzer(name: str) -> BatchAnalyzer:
    """A new instance of the installed batch analyzer called ``name`` (see ``BatchRegistry.get``)."""
    return _default.get(name)


def batch_analyzer_names() -> list[str]:
    """The names of the installed batch analyzers, sorted."""
    return _default.names()
