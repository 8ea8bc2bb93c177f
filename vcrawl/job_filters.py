"""A job's own admission filters (its ``filters`` key): names from the ``vcrawl.filters`` registry with params.

Only the shape is checked here; the registry checks each name and its params at submit
(``engine.jobs.check_job``). Kept apart from ``vcrawl.jobs`` so the job spec stays one readable module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vcrawl.errors import InvalidTask, kind_of

__all__ = ["FilterSpec", "parse_filters"]

_FILTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # a registry key: never a path to import


@dataclass(frozen=True)
class FilterSpec:
    """A job's own admission filter: a name from the ``vcrawl.filters`` registry and its params (JSON values)."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)


def parse_filters(value: Any) -> tuple[FilterSpec, ...]:
    """A job's ``filters``: a list of ``{name, params}`` (params optional).

    Raises:
        InvalidTask: naming ``filters``, ``filters[<i>].name`` or ``filters[<i>].params``.
    """
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidTask("filters", f"must be a list, got {kind_of(value)}")
    specs = []
    for index, item in enumerate(value):
        where = f"filters[{index}]"
        if not isinstance(item, Mapping):
            raise InvalidTask(where, f"must be a mapping of keys, got {kind_of(item)}")
        for key in item:
            if key not in ("name", "params"):
                raise InvalidTask(f"{where}.{key}", "unknown key; known: name, params")
        name = item.get("name")
        if not isinstance(name, str) or not _FILTER_NAME.match(name):
            raise InvalidTask(f"{where}.name", f"must be a filter name (letters, digits, . _ -), got {name!r}")
        params = item.get("params")
        if params is None:
            params = {}
        if not isinstance(params, Mapping):
            raise InvalidTask(f"{where}.params", f"must be a mapping of keys, got {kind_of(params)}")
        try:
            params = json.loads(json.dumps(dict(params)))  # JSON values only: the spec is stored as JSON
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"{where}.params", f"must hold JSON values only: {exc}") from None
        specs.append(FilterSpec(name, params))
    return tuple(specs)
