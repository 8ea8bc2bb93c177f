"""Entry-point groups whose built-ins are registered like plug-ins (``vcrawl.filters``, ``vcrawl.fetchers``).

vcrawl's own pyproject.toml registers the built-ins in the group; a plug-in package adds names
next to them. A name is taken once: a plug-in reusing a built-in's name, or two plug-ins one name,
is a configuration error that names both. Names are looked up in the loaded dict, never imported
from a message.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vcrawl.errors import ConfigError

__all__ = ["choose_entry_points", "describe", "load_group", "load_plugin"]


def load_group(
    group: str,
    kind: str,
    builtins: Mapping[str, str],
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
) -> dict[str, Callable[..., Any]]:
    """Load every entry point of ``group``: name -> loaded object (only callables).

    ``builtins`` maps each built-in name to the ``module:attr`` vcrawl registers it as; they must
    all be there, as vcrawl's own. ``entry_points`` replaces the installed group (tests).

    Raises:
        ConfigError: a built-in is missing (vcrawl installed without its entry points), a plug-in
            takes a built-in's or another plug-in's name, or one fails to import or is not callable.
    """
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=group)
    chosen = choose_entry_points(entry_points, kind, builtins)
    if missing := sorted(set(builtins) - set(chosen)):
        raise ConfigError(
            f"the built-in {kind}s {missing} are not registered in the {group!r} entry points: "
            "install vcrawl as a package (pip install -e .) so its entry points are known"
        )
    return {name: load_plugin(entry_point, kind) for name, entry_point in chosen.items()}


def choose_entry_points(
    entry_points: Iterable[importlib.metadata.EntryPoint], kind: str, builtins: Mapping[str, str | None]
) -> dict[str, importlib.metadata.EntryPoint]:
    """Name -> entry point, each name taken once; nothing is imported yet.

    ``builtins`` maps a built-in's name to the ``module:attr`` its own entry point names, or to None
    when the built-in is code, not an entry point (analyzers): then any entry point of that name clashes.

    Raises:
        ConfigError: a plug-in takes a built-in's name, or two plug-ins one name (naming both).
    """
    chosen: dict[str, importlib.metadata.EntryPoint] = {}
    for entry_point in entry_points:
        name = entry_point.name
        if name in builtins and entry_point.value != builtins[name]:
            raise ConfigError(f"{kind} plugin {describe(entry_point)} uses the name of the built-in {kind} {name!r}")
        if (other := chosen.get(name)) is not None:
            if other.value == entry_point.value:  # one distribution seen twice on sys.path
                continue
            raise ConfigError(
                f"{kind} plugins {describe(other)} and {describe(entry_point)} both use the name {name!r}"
            )
        chosen[name] = entry_point
    return chosen


def load_plugin(entry_point: importlib.metadata.EntryPoint, kind: str) -> Callable[..., Any]:
    """Import what ``entry_point`` names; every plug-in group (analyzers too) loads through here.

    Raises:
        ConfigError: it fails to import (naming the entry point and its package), or is not callable.
    """
    try:
        loaded = entry_point.load()
    # Importing third-party code can raise anything; this is where it enters, so wrap it here.
    except Exception as exc:
        raise ConfigError(f"{kind} plugin {describe(entry_point)} failed to load: {exc!r}") from exc
    if not callable(loaded):
        raise ConfigError(f"{kind} plugin {describe(entry_point)} is a {type(loaded).__name__}, not a callable")
    return loaded


def describe(entry_point: importlib.metadata.EntryPoint) -> str:
    """``'name = module:attr' (group, distribution)``, for error messages and logs."""
    dist = entry_point.dist.name if entry_point.dist is not None else "no distribution"
    return f"'{entry_point.name} = {entry_point.value}' ({entry_point.group}, {dist})"
