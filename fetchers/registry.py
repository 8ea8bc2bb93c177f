"""Fetchers by page type: the only way a page type from a message becomes code."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fetchers.base import Fetcher
from vcrawl.errors import UnknownComponent

__all__ = ["FetcherRegistry"]


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
