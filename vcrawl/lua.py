"""Lua scripts shipped as package resources, read one way for every package that has them.

A package keeps its scripts in ``<package>/lua/<name>.lua``, each opening with a comment block
that says what its KEYS and ARGV are and what it returns. ``script_text`` reads one (after a
shared prelude, when it has one) and replaces every ``{{NAME}}`` with the value of
``vcrawl.names.NAME`` as a Lua literal, so job and task states, meta fields, counter names and
queue scores are spelled once, in Python (``{{STATE_RUNNING}}`` becomes ``'running'``,
``{{INLINK_CAP}}`` becomes ``10``). An unknown name is an error when the script is read.
"""

from __future__ import annotations

import math
import re
from importlib.resources.abc import Traversable

from vcrawl import names

__all__ = ["script_text"]

_PLACEHOLDER = re.compile(r"\{\{([A-Za-z0-9_]+)\}\}")


def script_text(folder: Traversable, name: str, prelude: str | None = None) -> str:
    """The text of ``folder/<name>.lua``, after ``folder/<prelude>.lua`` if given, with names filled in.

    ``folder`` is the package's own (``importlib.resources.files(__package__) / "lua"``).

    Raises:
        ValueError: the script names a ``{{NAME}}`` that ``vcrawl.names`` does not define.
    """
    body = (folder / f"{name}.lua").read_text(encoding="utf-8")
    if prelude is not None:
        body = (folder / f"{prelude}.lua").read_text(encoding="utf-8") + "\n" + body
    return _PLACEHOLDER.sub(lambda match: _lua_literal(f"{folder.name}/{name}.lua", match.group(1)), body)


def _lua_literal(script: str, placeholder: str) -> str:
    """A name's value as Lua: a string literal, or a number (``repr``: exact, ``1e+16`` is Lua too;
    a negative one in parentheses, so ``-{{NAME}}`` never makes a ``--`` comment)."""
    value = getattr(names, placeholder, None) if placeholder.isupper() else None
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return repr(value) if value >= 0 else f"({value!r})"
    raise ValueError(f"{script}: no name {{{{{placeholder}}}}} in vcrawl.names")
