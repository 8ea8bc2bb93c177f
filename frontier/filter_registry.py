"""Admission filters by name: the ``vcrawl.filters`` entry-point group, built-ins and plug-ins alike.

Every job runs ``scope`` first (its boundary). A job with a ``filter_chain`` then runs the filters it
lists there, built-ins and plug-ins, with their params, in the order given; a job without one runs
the other built-ins in ``BUILTIN_FILTERS`` order (the job's ``scope`` configures them), then the
filters its ``filters`` key names. A link dropped by one is counted as ``filtered:<reason>``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from frontier.filters import AdmissionContext, UrlFilter
from vcrawl.errors import InvalidTask
from vcrawl.job_filters import BUILTIN_FILTER_NAMES, SCOPE_FILTER, FilterSpec
from vcrawl.plugins import load_group

__all__ = [
    "BUILTIN_FILTERS",
    "ENTRY_POINT_GROUP",
    "FilterChain",
    "FilterFactory",
    "FilterRegistry",
    "filter_chain",
    "filter_names",
    "load_filters",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vcrawl.filters"

BUILTIN_FILTERS: Mapping[str, str] = MappingProxyType(
    {name: f"frontier.filters:{name}_filter" for name in BUILTIN_FILTER_NAMES}
)
"""The built-in filters, as vcrawl's pyproject.toml registers them, in the order a job without a
``filter_chain`` runs them."""

_REASON = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")


class FilterFactory(Protocol):
    """What a ``vcrawl.filters`` entry point names: makes a job's filter from its params.

    Raises ``InvalidTask(<param>, problem)`` or ``ValueError`` for bad params (refused at submit).
    """

    def __call__(self, params: Mapping[str, Any]) -> UrlFilter:
        """Return the filter for these params."""
        ...


@dataclass(frozen=True)
class FilterChain:
    """The filters one job runs, in order: ``(name, filter)`` pairs."""

    filters: tuple[tuple[str, UrlFilter], ...]

    def reject_reason(self, url: str, context: AdmissionContext) -> str | None:
        """The first filter's reason to drop the canonical ``url``, or None to keep it.

        A reason that is not a short token is counted under the filter's name; a filter that
        raises drops the link as ``<name>_failed`` (logged), so a plug-in's bug never stalls a crawl.
        """
        for name, check in self.filters:
            try:
                reason = check(url, context)
            except Exception as exc:  # a plug-in's bug: any exception, at the one place plug-in code runs
                logger.warning("filter %s failed on %s: %r; link dropped", name, url, exc)
                return f"{name}_failed"
            if reason is not None:
                return reason if isinstance(reason, str) and _REASON.match(reason) else name
        return None

    @property
    def names(self) -> list[str]:
        """The filters' names, in the order they run."""
        return [name for name, _ in self.filters]


class FilterRegistry:
    """The installed ``vcrawl.filters`` group, loaded once, on first use."""

    def __init__(self, entry_points: Iterable[importlib.metadata.EntryPoint] | None = None) -> None:
        """Use ``entry_points`` instead of the installed group when given (tests)."""
        self._entry_points = None if entry_points is None else tuple(entry_points)
        self._loaded: dict[str, FilterFactory] | None = None
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        """Every filter name, sorted.

        Raises:
            ConfigError: the group cannot be loaded (see ``vcrawl.plugins.load_group``).
        """
        return sorted(self._factories())

    def load(self) -> None:
        """Load the group now (a worker does at start-up, to fail early on a clash).

        Raises:
            ConfigError: as in ``names``.
        """
        self._factories()

    def chain(self, specs: Sequence[FilterSpec], listed: Sequence[FilterSpec] | None = None) -> FilterChain:
        """A job's chain: ``scope``, then ``listed`` (its ``filter_chain``) when given, else the other
        built-ins, then the filters ``specs`` (its ``filters``) name; each with its params.

        Raises:
            InvalidTask: ``filters[<i>].name`` (unknown, or a built-in, which always runs),
                ``filter_chain[<i>].name`` (unknown, or ``scope``), or ``<key>[<i>].params[.<param>]``
                (refused by the filter).
            ConfigError: as in ``names``.
        """
        factories = self._factories()
        if listed is not None:
            return FilterChain(((SCOPE_FILTER, factories[SCOPE_FILTER]({})), *self._made_all(listed, "filter_chain")))
        for index, spec in enumerate(specs):
            if spec.name in BUILTIN_FILTERS:
                raise InvalidTask(f"filters[{index}].name", f"{spec.name!r} always runs; set it up under scope and "
                                  "max_depth, or list the whole chain under filter_chain")  # fmt: skip
        builtins = tuple((name, factories[name]({})) for name in BUILTIN_FILTERS)
        return FilterChain((*builtins, *self._made_all(specs, "filters")))

    def _made_all(self, specs: Sequence[FilterSpec], key: str) -> list[tuple[str, UrlFilter]]:
        """Each of ``specs`` made by its factory: plug-ins only under ``filters``; any but scope in a chain."""
        factories = self._factories()
        listable = set(factories) - ({SCOPE_FILTER} if key == "filter_chain" else set(BUILTIN_FILTERS))
        made = []
        for index, spec in enumerate(specs):
            where = f"{key}[{index}]"
            if spec.name == SCOPE_FILTER:  # parse_filter_chain refuses it too; a spec built in Python is checked here
                raise InvalidTask(f"{where}.name", "'scope' always runs first (it is the job's boundary): leave it out")
            if spec.name not in listable:
                kind = "filters" if key == "filter_chain" else "plug-in filters"
                raise InvalidTask(f"{where}.name", f"no filter {spec.name!r}; {kind}: "
                                                   f"{', '.join(sorted(listable)) or '(none installed)'}")  # fmt: skip
            made.append((spec.name, _made(factories[spec.name], spec, where)))
        return made

    def _factories(self) -> dict[str, FilterFactory]:
        if self._loaded is None:
            with self._lock:
                if self._loaded is None:
                    loaded = load_group(ENTRY_POINT_GROUP, "filter", BUILTIN_FILTERS, self._entry_points)
                    self._loaded = loaded  # type: ignore[assignment]
                    logger.info("filters: %s", ", ".join(sorted(loaded)))
        assert self._loaded is not None
        return self._loaded


def _made(factory: FilterFactory, spec: FilterSpec, where: str) -> UrlFilter:
    try:
        made = factory(spec.params)
    except InvalidTask as exc:
        raise InvalidTask(f"{where}.params.{exc.field}", exc.problem) from None
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidTask(f"{where}.params", f"refused by filter {spec.name!r}: {exc}") from None
    if not callable(made):
        raise InvalidTask(f"{where}.name", f"filter {spec.name!r} made a {type(made).__name__}, not a filter")
    return made


_default = FilterRegistry()


def filter_chain(specs: Sequence[FilterSpec], listed: Sequence[FilterSpec] | None = None) -> FilterChain:
    """The installed filters' chain for a job's ``filters``, or its ``filter_chain`` (``listed``) when given.

    Raises:
        InvalidTask: naming ``filters[<i>]...`` or ``filter_chain[<i>]...`` (``.name``, ``.params...``).
        ConfigError: the group cannot be loaded.
    """
    return _default.chain(specs, listed)


def filter_names() -> list[str]:
    """The installed filters' names, sorted.

    Raises:
        ConfigError: the group cannot be loaded.
    """
    return _default.names()


def load_filters() -> None:
    """Load the installed filters now rather than on first use.

    Raises:
        ConfigError: a name is taken twice, a built-in is missing, or a plug-in fails to load.
    """
    _default.load()
