"""The ``fields`` analyzer: one record per page, one value per named CSS/XPath rule."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import cssselect
import lxml.html
from lxml import etree

from analyzers.page import Page
from vcrawl.errors import InvalidTask
from vcrawl.payloads import FieldRule

__all__ = ["FieldExtractor", "analyze", "compile_rules"]

logger = logging.getLogger(__name__)

FieldExtractor = Callable[[lxml.html.HtmlElement], Any]
# No EXSLT regular expressions: a rule from a message could backtrack for minutes on a page.
_NAMESPACES: dict[str, str] = {}
# Compiled once, as lxml.html does for text_content(): about 4x faster than element.xpath("string()").
_string_value = etree.XPath("string()")
_PROBE_DOCUMENT = b"<html><head><title>t</title></head><body><p class='c'>x</p></body></html>"


def analyze(page: Page, rules: Mapping[str, FieldRule] | None) -> dict[str, Any]:
    """Return ``{"url": page.url, "fields": {name: value}}``, one value per rule.

    A rule that matches nothing gives ``None`` (``[]`` with ``all``). Element matches give their
    whitespace-normalized text, or with ``attr`` that attribute's stripped value (elements without it
    are passed over); XPath strings, numbers and booleans come back as str, float and bool, with NaN
    and infinities as ``None``; whitespace-only ``text()`` nodes are passed over.

    Raises:
        InvalidTask: no rules, or a rule whose selector does not compile or evaluate.
    """
    if not rules:
        raise InvalidTask("fields", "the 'fields' analyzer needs at least one field rule")
    tree = page.tree
    values = {name: extract(tree) for name, extract in compile_rules(rules).items()}
    if missing := [name for name, value in values.items() if value is None or value == []]:
        logger.debug("%s: no match for fields %s", page.url, ", ".join(missing))
    return {"url": page.url, "fields": values}


def compile_rules(rules: Mapping[str, FieldRule]) -> dict[str, FieldExtractor]:
    """Compile every rule once; each result maps a parsed page's root to the field's value.

    Raises:
        InvalidTask: ``fields.<name>.css`` / ``fields.<name>.xpath`` for a selector that does not
            compile (or fails on every document: unknown functions, undefined variables), or
            ``fields.<name>`` for a rule with neither or both.
    """
    return {name: _extractor(name, rule) for name, rule in rules.items()}


def _extractor(name: str, rule: FieldRule) -> FieldExtractor:
    if (rule.css is None) == (rule.xpath is None):
        raise InvalidTask(f"fields.{name}", "needs exactly one of css or xpath")
    kind, selector = ("css", rule.css) if rule.css is not None else ("xpath", rule.xpath)
    assert selector is not None
    where = f"fields.{name}.{kind}"
    # The HTML parser lowercases attribute names (they are case-insensitive in HTML).
    attr = rule.attr.lower() if rule.attr is not None else None
    try:
        compiled = _compile(kind, selector)
    except cssselect.SelectorError as exc:
        hint = " (pseudo-elements such as ::text and ::attr() are not supported; use the attr key)"
        raise InvalidTask(where, f"invalid CSS selector: {exc}{hint if '::' in selector else ''}") from None
    except etree.XPathError as exc:
        raise InvalidTask(where, f"invalid XPath expression: {exc}") from None
    except ValueError as exc:  # lxml refuses control characters, NULs, lone surrogates in the string
        raise InvalidTask(where, f"invalid selector string: {exc}") from None

    def extract(tree: lxml.html.HtmlElement) -> Any:
        try:
            result = compiled(tree)
        except etree.XPathError as exc:
            raise InvalidTask(where, f"XPath evaluation failed: {exc}") from None
        values = _values(result, attr)
        if rule.all:
            return values
        return values[0] if values else None

    return extract


@lru_cache(maxsize=1024)
def _compile(kind: str, selector: str) -> etree.XPath:
    """Return the compiled selector, evaluated once on a probe page to surface evaluation errors."""
    # cssselect's own HTML translator, not lxml.cssselect.CSSSelector: the latter's :contains() calls a
    # global extension function that lxml 6.1 fails to find once another XPath ran on the same tree.
    expression = cssselect.HTMLTranslator().css_to_xpath(selector) if kind == "css" else selector
    compiled = etree.XPath(expression, namespaces=_NAMESPACES)
    # libxml2 only notices unknown functions and undefined variables when evaluating.
    compiled(lxml.html.document_fromstring(_PROBE_DOCUMENT))
    return compiled


def _values(result: Any, attr: str | None) -> list[Any]:
    items = result if isinstance(result, list) else [result]
    return [value for item in items if (value := _value(item, attr)) is not None]


def _value(item: Any, attr: str | None) -> Any:
    if isinstance(item, bool):
        return item
    if isinstance(item, float):
        return item if math.isfinite(item) else None  # JSON has no NaN or Infinity
    if etree.iselement(item):
        if not isinstance(item.tag, str):  # a comment or processing instruction: no attributes
            return _normalize(item.text or "") if attr is None else None
        if attr is not None:
            value = item.get(attr)
            return value.strip() if value is not None else None
        return _normalize(_string_value(item))
    if isinstance(item, str):
        # Smart strings from XPath know where they came from: attribute values are stripped like attr
        # values, text is whitespace-normalized, and a text node of only whitespace (indentation
        # between tags) is dropped. str() also drops the reference they hold to the whole tree.
        if getattr(item, "is_attribute", False):
            return str(item).strip()
        text = _normalize(str(item))
        is_text_node = getattr(item, "is_text", False) or getattr(item, "is_tail", False)
        return None if is_text_node and not text else text
    return str(item)  # namespace nodes come back as (prefix, uri) tuples


def _normalize(text: str) -> str:
    return " ".join(text.split())
