"""Page scripts: JavaScript an operator registers by name, which a rule's ``{"script": NAME}`` action runs.

A job names a script, never carries one: the ``vcrawl.page_scripts`` entry-point group maps each
name to a callable returning the script's source, installed with the workers like any plug-in
(docs/plugins.md). The source runs in the page as the body of a function (``return`` a Promise to
be waited for, within the browser's script timeout).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from vcrawl.errors import ConfigError, UnknownComponent
from vcrawl.plugins import load_group

__all__ = ["BUILTIN_PAGE_SCRIPTS", "ENTRY_POINT_GROUP", "MAX_SCRIPT_CHARS", "load_page_scripts", "page_script"]

ENTRY_POINT_GROUP = "vcrawl.page_scripts"
MAX_SCRIPT_CHARS = 64 * 1024
BUILTIN_PAGE_SCRIPTS: Mapping[str, str] = MappingProxyType({"open-details": "fetchers.page_scripts:open_details"})
"""The built-in page scripts, as vcrawl's pyproject.toml registers them."""


def open_details() -> str:
    """``open-details``: open every ``<details>`` element (FAQ answers, collapsed specifications)."""
    return "document.querySelectorAll('details:not([open])').forEach(function (d) { d.open = true; });"


def load_page_scripts(entry_points: Iterable[importlib.metadata.EntryPoint] | None = None) -> dict[str, str]:
    """Name -> script source, for the installed group (or ``entry_points``).

    Raises:
        ConfigError: a name is taken twice, a plug-in fails to load, or its source is not a string
            of at most ``MAX_SCRIPT_CHARS`` characters.
    """
    scripts = {}
    for name, make in load_group(ENTRY_POINT_GROUP, "page script", BUILTIN_PAGE_SCRIPTS, entry_points).items():
        try:
            source = make()
        except Exception as exc:  # a plug-in's own code: named, never a worker's crash
            raise ConfigError(f"page script {name!r} failed to give its source: {exc!r}") from exc
        if not isinstance(source, str) or not 0 < len(source) <= MAX_SCRIPT_CHARS:
            raise ConfigError(f"page script {name!r} must give a non-empty string of at most {MAX_SCRIPT_CHARS} chars")
        scripts[name] = source
    return scripts


@functools.cache
def _installed() -> Mapping[str, str]:
    return MappingProxyType(load_page_scripts())


def page_script(name: str) -> str:
    """The source of the installed page script ``name``.

    Raises:
        UnknownComponent: no such page script on this machine.
        ConfigError: the group does not load (as ``load_page_scripts``).
    """
    scripts = _installed()
    if name not in scripts:
        raise UnknownComponent("page script", name, sorted(scripts))
    return scripts[name]
