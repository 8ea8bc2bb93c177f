"""Field rules: how an analyzer picks one named field from a page (a CSS selector or an XPath expression)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from vcrawl.errors import InvalidTask, kind_of

__all__ = ["FieldRule", "field_rules"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")


@dataclass(frozen=True)
class FieldRule:
    """How to pick one named field from a page: a CSS selector or an XPath expression.

    ``attr`` takes an attribute instead of the text; ``all`` returns every match as a list
    instead of the first one.
    """

    css: str | None = None
    xpath: str | None = None
    attr: str | None = None
    all: bool = False

    @classmethod
    def from_value(cls, name: str, value: Any) -> FieldRule:
        """Build from ``"h1"`` (CSS), ``"xpath://h1"``, ``"css:h1"`` or a dict of the fields.

        Raises:
            InvalidTask: the rule is malformed (``field`` is ``fields.<name>...``).
        """
        where = f"fields.{name}"
        if isinstance(value, str):
            if value.startswith("xpath:"):
                return cls._checked(where, xpath=value[len("xpath:") :])
            return cls._checked(where, css=value.removeprefix("css:"))
        if not isinstance(value, Mapping):
            raise InvalidTask(where, f"must be a selector string or an object, got {kind_of(value)}")
        if unknown := set(value) - {f.name for f in fields(cls)}:
            raise InvalidTask(where, f"unknown keys {sorted(unknown)}; known: css, xpath, attr, all")
        for key in ("css", "xpath", "attr"):
            if value.get(key) is not None and not isinstance(value[key], str):
                raise InvalidTask(f"{where}.{key}", f"must be a string, got {kind_of(value[key])}")
        if not isinstance(value.get("all", False), bool):
            raise InvalidTask(f"{where}.all", f"must be true or false, got {kind_of(value['all'])}")
        return cls._checked(where, **dict(value))

    @classmethod
    def _checked(cls, where: str, **values: Any) -> FieldRule:
        rule = cls(**values)
        if (rule.css is None) == (rule.xpath is None):
            raise InvalidTask(where, "needs exactly one of css or xpath")
        selector = rule.css if rule.css is not None else rule.xpath
        if not selector or not selector.strip():
            raise InvalidTask(where, "selector is empty")
        if rule.attr is not None and not _NAME.match(rule.attr):
            raise InvalidTask(f"{where}.attr", f"not an attribute name: {rule.attr!r}")
        return rule

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form, without unset keys."""
        return {k: v for k, v in asdict(self).items() if v is not None and v is not False}


def field_rules(value: Any) -> dict[str, FieldRule]:
    """Parse a ``fields`` object (name -> rule, as in a job's rules).

    Raises:
        InvalidTask: ``fields`` or ``fields.<name>...`` naming the bad part.
    """
    if not isinstance(value, Mapping) or not value:
        raise InvalidTask("fields", f"must be a non-empty object of name -> rule, got {kind_of(value)}")
    rules = {}
    for name, rule in value.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidTask("fields", f"not a field name: {name!r}")
        rules[name] = rule if isinstance(rule, FieldRule) else FieldRule.from_value(name, rule)
    return rules
