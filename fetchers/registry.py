"""Fetchers by page type: the only way a page type from a message becomes code.

Page types come from the ``vcrawl.fetchers`` entry-point group: vcrawl's own (``static``,
``dynamic``, ``api``) and plug-ins' alike, each a ``FetcherFactory`` called with this worker's
``FetcherContext`` on the page type's first fetch.
"""

from __future__ import annotations

import importlib.metadata
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from fetchers.base import Fetcher, FetchLimits
from fetchers.browser import BrowserConfig
from fetchers.netguard import PUBLIC_ONLY, NetworkPolicy, Resolver
from vcrawl.errors import UnknownComponent
from vcrawl.plugins import load_group

__all__ = ["BUILTIN_FETCHERS", "ENTRY_POINT_GROUP", "FetcherContext", "FetcherFactory", "FetcherRegistry"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vcrawl.fetchers"

BUILTIN_FETCHERS: Mapping[str, str] = MappingProxyType(
    {"static": "fetchers.builtin:static", "dynamic": "fetchers.builtin:dynamic", "api": "fetchers.builtin:api"}
)
"""The built-in page types, as vcrawl's pyproject.toml registers them."""


@dataclass(frozen=True)
class FetcherContext:
    """What a fetcher factory builds its fetcher from: this worker's cluster settings and shared clients."""

    # The cluster's per-request bounds; a request's follow_redirects=False (a job's) overrides following.
    limits: FetchLimits = field(default_factory=FetchLimits)
    policy: NetworkPolicy = PUBLIC_ONLY  # the addresses a fetch may reach (SSRF guard): honour it
    browser: BrowserConfig = field(default_factory=BrowserConfig)
    session: Callable[[], Any] | None = None  # this process's pooled requests.Session, made on first call
    resolver: Resolver = socket.getaddrinfo  # this process's DNS cache


class FetcherFactory(Protocol):
    """What a ``vcrawl.fetchers`` entry point names: builds the page type's fetcher, once per process.

    It is called on the page type's first fetch, never by validation; a factory may also have an
    ``unavailable(context) -> str | None`` method saying what this worker lacks (a missing binary),
    so jobs that need it are refused at submit.
    """

    def __call__(self, context: FetcherContext) -> Fetcher:
        """Return the fetcher."""
        ...


class FetcherRegistry:
    """Page type -> fetcher, each built lazily on first use (one per process)."""

    def __init__(
        self,
        factories: Mapping[str, Callable[[], Fetcher]],
        unavailable: Mapping[str, str] | None = None,
    ) -> None:
        self._factories = dict(factories)
        # Page types the payload knows but this build cannot fetch, with the reason why.
        self._unavailable = dict(unavailable or {})
        self._built: dict[str, Fetcher] = {}

    @classmethod
    def from_entry_points(
        cls, context: FetcherContext, entry_points: Iterable[importlib.metadata.EntryPoint] | None = None
    ) -> FetcherRegistry:
        """The installed ``vcrawl.fetchers`` group (or ``entry_points``), bound to ``context``.

        Raises:
            ConfigError: a built-in is missing, a name is taken twice, or a plug-in fails to load.
        """
        factories: dict[str, Callable[[], Fetcher]] = {}
        unavailable: dict[str, str] = {}
        for name, factory in load_group(ENTRY_POINT_GROUP, "fetcher", BUILTIN_FETCHERS, entry_points).items():
            check = getattr(factory, "unavailable", None)
            reason = check(context) if callable(check) else None
            if reason is not None:
                unavailable[name] = str(reason)
                logger.info("page type %s unavailable on this worker: %s", name, reason)
                continue
            factories[name] = _bound(factory, context)
        return cls(factories, unavailable)

    def page_types(self) -> list[str]:
        """Return the page types that have a working fetcher."""
        return sorted(self._factories)

    def check(self, page_type: str) -> None:
        """Raise unless ``page_type`` has a working fetcher.

        Raises:
            UnknownComponent: unknown page type, or one this build cannot fetch (with why).
        """
        if page_type in self._factories:
            return
        kind = "fetcher for page_type"
        if page_type in self._unavailable:
            kind = f"{kind} ({self._unavailable[page_type]})"
        raise UnknownComponent(kind, page_type, self.page_types())

    def close(self) -> None:
        """Close the fetchers that hold resources (browsers); they are built again on next use."""
        built, self._built = self._built, {}
        for fetcher in built.values():
            close = getattr(fetcher, "close", None)
            if close is not None:
                close()

    def get(self, page_type: str) -> Fetcher:
        """Return the fetcher for ``page_type``, building it on first use.

        Raises:
            UnknownComponent: as in ``check``.
        """
        self.check(page_type)
        if page_type not in self._built:
            self._built[page_type] = self._factories[page_type]()
        return self._built[page_type]


def _bound(factory: Any, context: FetcherContext) -> Callable[[], Fetcher]:
    return lambda: factory(context)
