"""A job's admission filters: ``filters`` (plug-ins after the built-ins) or ``filter_chain`` (the whole chain).

Both are lists of ``{name, params}``, names from the ``vcrawl.filters`` registry. Only the shape is
checked here; the registry checks each name and its params at submit (``engine.jobs.check_job``).
Kept apart from ``vcrawl.jobs`` so the job spec stays one readable module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vcrawl.errors import InvalidTask, kind_of

__all__ = [
    "BUILTIN_FILTER_NAMES",
    "MAX_JOB_FILTERS",
    "SCOPE_FILTER",
    "FilterSpec",
    "check_filter_keys",
    "effective_filters",
    "parse_filter_chain",
    "parse_filters",
]

SCOPE_FILTER = "scope"
"""The filter every chain starts with (scheme, length, depth, hosts: the job's boundary); never listed."""

BUILTIN_FILTER_NAMES: tuple[str, ...] = (SCOPE_FILTER, "deny", "allow", "suffix", "trap")
"""The built-in filters in the order a job without ``filter_chain`` runs them."""

MAX_JOB_FILTERS = 32
"""The most entries a job's ``filters`` or ``filter_chain`` may hold."""

_FILTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # a registry key: never a path to import


@dataclass(frozen=True)
class FilterSpec:
    """A job's admission filter: a name from the ``vcrawl.filters`` registry and its params (JSON values)."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)


def parse_filters(value: Any, key: str = "filters") -> tuple[FilterSpec, ...]:
    """A job's ``filters`` (or another list of ``{name, params}`` under ``key``; params optional).

    Raises:
        InvalidTask: naming ``<key>``, ``<key>[<i>].name`` or ``<key>[<i>].params``.
    """
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidTask(key, f"must be a list, got {kind_of(value)}")
    if len(value) > MAX_JOB_FILTERS:
        raise InvalidTask(key, f"may hold at most {MAX_JOB_FILTERS} filters, got {len(value)}")
    specs = []
    for index, item in enumerate(value):
        where = f"{key}[{index}]"
        if not isinstance(item, Mapping):
            raise InvalidTask(where, f"must be a mapping of keys, got {kind_of(item)}")
        for name in item:
            if name not in ("name", "params"):
                raise InvalidTask(f"{where}.{name}", "unknown key; known: name, params")
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


def parse_filter_chain(value: Any) -> tuple[FilterSpec, ...] | None:
    """A job's ``filter_chain``: every filter after ``scope``, in order; None when not given.

    Raises:
        InvalidTask: naming ``filter_chain[<i>].name`` for ``scope`` or a name listed twice, or as
            ``parse_filters`` does.
    """
    if value is None:
        return None
    chain = parse_filters(value, "filter_chain")
    first_at: dict[str, int] = {}
    for index, spec in enumerate(chain):
        where = f"filter_chain[{index}].name"
        if spec.name == SCOPE_FILTER:
            raise InvalidTask(where, "'scope' always runs first (it is the job's boundary): leave it out")
        if spec.name in first_at:
            raise InvalidTask(where, f"{spec.name!r} is listed twice (first as filter_chain[{first_at[spec.name]}])")
        first_at[spec.name] = index
    return chain


def check_filter_keys(
    filters: Sequence[FilterSpec], chain: Sequence[FilterSpec] | None, allow: bool, deny: bool
) -> None:
    """Refuse ``filters`` beside ``filter_chain``, and a chain that would leave the job's ``scope.allow``
    (``allow`` true: set) or ``scope.deny`` patterns unused.

    Raises:
        InvalidTask: naming ``filters`` or ``filter_chain``.
    """
    if chain is None:
        return
    if filters:
        raise InvalidTask("filters", "give either filters (run after the built-ins) or filter_chain (the whole "
                                     "chain, plug-ins included), not both")  # fmt: skip
    names = {spec.name for spec in chain}
    for name, is_set in (("deny", deny), ("allow", allow)):
        if is_set and name not in names:
            raise InvalidTask("filter_chain", f"leaves out {name!r} while scope.{name} is set: its patterns would "
                                              f"never apply; list {name!r} or drop scope.{name}")  # fmt: skip


def effective_filters(filters: Sequence[FilterSpec], chain: Sequence[FilterSpec] | None) -> tuple[FilterSpec, ...]:
    """The filters a job runs, in order, ``scope`` first: its ``filter_chain``, else the built-ins then ``filters``.

    >>> [spec.name for spec in effective_filters((), (FilterSpec("suffix"), FilterSpec("deny")))]
    ['scope', 'suffix', 'deny']
    """
    if chain is not None:
        return (FilterSpec(SCOPE_FILTER), *chain)
    return (*(FilterSpec(name) for name in BUILTIN_FILTER_NAMES), *filters)
