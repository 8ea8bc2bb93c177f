"""Proxy sources: pages that list proxies, and how to read each (the operator's ``VCRAWL_PROXY_SOURCES``).

A proxy source is a URL and a format:

- ``lines``: one ``host:port`` per line (other text on a line, blank lines and ``#`` comments skipped);
- ``table``: an HTML table; ``host_column`` and ``port_column`` name the cells, by 0-based index or
  by header text (without ``port_column``, the host cell holds ``host:port``); ``table`` picks the
  table on the page (0-based, default the first);
- ``regex``: a Python regular expression with named groups ``host`` and ``port``, matched over the
  whole page.

``scheme`` is the proxies' scheme (``http``, the default, or ``https``). Sources come only from the
operator's configuration, never from a job or a message: a proxy list decides where requests go.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vcrawl.documents import parse_yaml
from vcrawl.errors import InvalidTask

__all__ = ["SOURCE_FORMATS", "ProxySource", "dump_proxy_sources", "load_proxy_sources"]

SOURCE_FORMATS = ("lines", "table", "regex")
_SCHEMES = ("http", "https")


@dataclass(frozen=True)
class ProxySource:
    """One page that lists proxies, and how to read it."""

    url: str
    format: str = "lines"
    host_column: int | str | None = None  # table: the host's (or host:port's) column, index or header
    port_column: int | str | None = None  # table: the port's column; None: the host column has host:port
    table: int = 0  # table: which table of the page
    pattern: str | None = None  # regex: with named groups host and port
    scheme: str = "http"  # of the proxies listed

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in _SCHEMES or not parts.hostname:
            raise InvalidTask("url", f"must be an http(s) URL, got {self.url!r}")
        if self.format not in SOURCE_FORMATS:
            raise InvalidTask("format", f"must be one of {', '.join(SOURCE_FORMATS)}, got {self.format!r}")
        if self.scheme not in _SCHEMES:
            raise InvalidTask("scheme", f"must be http or https, got {self.scheme!r}")
        if self.format == "table":
            if self.host_column is None:
                raise InvalidTask("host_column", "a table source names the column of the host (index or header)")
            for name in ("host_column", "port_column"):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int | str | None):
                    raise InvalidTask(name, f"must be a column index or a header text, got {value!r}")
            if isinstance(self.table, bool) or not isinstance(self.table, int) or self.table < 0:
                raise InvalidTask("table", f"must be a table index (0 or more), got {self.table!r}")
        if self.format == "regex":
            if not self.pattern:
                raise InvalidTask(
                    "pattern", "a regex source needs a pattern with groups (?P<host>...) and (?P<port>...)"
                )
            try:
                groups = re.compile(self.pattern).groupindex
            except re.error as exc:
                raise InvalidTask("pattern", f"is not a regular expression: {exc}") from None
            if not {"host", "port"} <= set(groups):
                raise InvalidTask("pattern", "needs named groups (?P<host>...) and (?P<port>...)")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProxySource:
        """A source from its JSON/YAML form.

        Raises:
            InvalidTask: an unknown key, a missing URL or a value the format cannot use.
        """
        if not isinstance(data, Mapping):
            raise InvalidTask("source", f"must be a mapping with url and format, got {data!r}")
        if unknown := set(data) - {f.name for f in fields(cls)}:
            raise InvalidTask("source", f"unknown keys {sorted(unknown)}")
        if "url" not in data:
            raise InvalidTask("url", "is missing")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, without the keys left at their defaults."""
        default = {f.name: f.default for f in fields(self)}
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != default[f.name]
                or f.name == "url"}  # fmt: skip


def load_proxy_sources(raw: str) -> tuple[ProxySource, ...]:
    """Sources from a JSON array, or from the JSON/YAML file at path ``raw`` (a list, or ``sources:`` list).

    Raises:
        InvalidTask: unreadable file (or not UTF-8), bad JSON/YAML, a key given twice, or a bad source
            (``field`` says which, ``sources[i]...``).
    """
    text = raw.strip()
    if not text.startswith("["):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidTask("file", f"cannot read {raw!r}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise InvalidTask("file", f"cannot read {raw!r}: not UTF-8 text ({exc})") from None
    data = parse_yaml(text, "sources")  # YAML is a superset of JSON; a key given twice is refused
    if isinstance(data, Mapping) and set(data) == {"sources"}:
        data = data["sources"]
    if not isinstance(data, list):
        raise InvalidTask("sources", "must be a list of sources (url, format, ...)")
    sources = []
    for index, item in enumerate(data):
        try:
            sources.append(ProxySource.from_dict(item))
        except InvalidTask as exc:
            raise InvalidTask(f"sources[{index}].{exc.field}", exc.problem) from None
    return tuple(sources)


def dump_proxy_sources(sources: tuple[ProxySource, ...]) -> str:
    """The JSON array ``load_proxy_sources`` reads back."""
    return json.dumps([source.to_dict() for source in sources])
