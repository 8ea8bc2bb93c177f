"""Answers of a JSON API read by a rule's ``api`` spec: records, the next page's URL, follow-up URLs.

A body is one JSON document, or JSON Lines (``application/x-ndjson``, ``application/jsonl``, or a
body that is not one document but whose every non-empty line is): then every line is a record
as it is (``records`` is not applied; ``fields`` still reshapes each one), and only
``page``/``offset`` paging (with ``stop: empty``) and ``follow`` (run on each line) apply.
Pure code: no sockets, no storage.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit

import jmespath.exceptions

from vcrawl.api_rules import ApiSpec, CountPaging, compiled
from vcrawl.errors import NotJson

__all__ = ["ApiAnswer", "is_json_lines", "read_answer", "with_param"]

logger = logging.getLogger(__name__)

_JSON_LINES_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines", "application/x-jsonlines")


@dataclass(frozen=True)
class ApiAnswer:
    """What one answer holds: its records (JSON values), the next page's URL, follow-up URLs."""

    records: tuple[Any, ...] = ()
    next_url: str | None = None
    follow: tuple[str, ...] = ()


def is_json_lines(content_type: str | None) -> bool:
    """True for the JSON Lines media types.

    >>> is_json_lines("application/x-ndjson; charset=utf-8"), is_json_lines("application/json")
    (True, False)
    """
    return (content_type or "").split(";", 1)[0].strip().lower() in _JSON_LINES_TYPES


def read_answer(body: bytes, content_type: str | None, url: str, spec: ApiSpec) -> ApiAnswer:
    """Read one answer of the API at ``url`` (the URL asked for: paging parameters are set on it).

    Raises:
        NotJson: the body is neither one JSON document nor JSON Lines.
    """
    documents = _documents(body, content_type)
    if documents is None:
        raise NotJson(url)
    document = documents.value if isinstance(documents, _Document) else None
    if isinstance(documents, _Document):
        found = _search(spec.records, documents.value)
        records: list[Any] = [] if found is None else found if isinstance(found, list) else [found]
        sources: list[Any] = [documents.value]
    else:
        records, sources = list(documents), list(documents)
    if spec.fields is not None:
        records = [{name: _search(expr, record) for name, expr in spec.fields.items()} for record in records]
    follow = tuple(link for source in sources for expr in spec.follow for link in _urls(_search(expr, source)))
    next_url = _next_url(spec, url, document, len(records))
    return ApiAnswer(tuple(records), next_url, tuple(urljoin(url, link) for link in follow))


@dataclass(frozen=True)
class _Document:
    value: Any


def _documents(body: bytes, content_type: str | None) -> _Document | list[Any] | None:
    """One JSON document, or the values of JSON Lines; None when the body is neither."""
    text = body.decode("utf-8-sig", errors="replace")
    if not is_json_lines(content_type):
        try:
            return _Document(json.loads(text))
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
            pass
    values = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except (ValueError, RecursionError):
            return None
    return values if values or not text.strip() else None


def _search(expression: str, value: Any) -> Any:
    """What ``expression`` finds in ``value``; None when it cannot apply (a function given the wrong type)."""
    try:
        return compiled(expression).search(value)
    except jmespath.exceptions.JMESPathError as exc:  # the API's data, not our rule: nothing found
        logger.debug("JMESPath %r on an api answer: %s", expression, exc)
        return None


def _urls(found: Any) -> list[str]:
    """The URLs an expression found: a string, or the strings of a list."""
    items = found if isinstance(found, list) else [found]
    return [item.strip() for item in items if isinstance(item, str) and item.strip()]


def _next_url(spec: ApiSpec, url: str, document: Any, count: int) -> str | None:
    """The next page's URL by the spec's paging; None when this was the last page."""
    if spec.next is not None:
        if document is None:
            return None
        links = _urls(_search(spec.next, document))
        return urljoin(url, links[0]) if links else None
    if spec.cursor is not None:
        cursor = None if document is None else _search(spec.cursor.field, document)
        if cursor is None or cursor == "" or cursor is False:
            return None
        return with_param(url, spec.cursor.param, _query_value(cursor))
    paging = spec.page or spec.offset
    if paging is None:
        return None
    return _counted_next(paging, url, document, count, offsets=spec.offset is not None)


def _counted_next(paging: CountPaging, url: str, document: Any, count: int, *, offsets: bool) -> str | None:
    """The next page by page number or offset, unless this page ends the listing."""
    current = _current(url, paging)
    step = paging.step
    if count == 0:
        return None  # an empty page ends every counted listing, whatever "stop" says
    if paging.stop != "empty":
        last = None if document is None else _search(paging.stop, document)
        if not isinstance(last, int | float) or isinstance(last, bool):
            logger.debug("api page %s: stop %r found %r, not a number: last page", url, paging.stop, last)
            return None
        if current + step >= last + (0 if offsets else 1):
            return None  # pages: this was page ``last``; offsets: the next one starts past the total
    next_url = with_param(url, paging.param, str(current + step))
    if paging.size_param is not None and paging.size is not None:
        next_url = with_param(next_url, paging.size_param, str(paging.size))
    return next_url


def _current(url: str, paging: CountPaging) -> int:
    """This page's number (or offset) from its URL; ``start`` when the URL has none."""
    for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if name == paging.param:
            try:
                return int(value)
            except ValueError:
                return paging.start
    return paging.start


def with_param(url: str, name: str, value: str) -> str:
    """``url`` with query parameter ``name`` set to ``value`` (in its place, or added at the end).

    >>> with_param("http://a.test/items?limit=5&page=2", "page", "3")
    'http://a.test/items?limit=5&page=3'
    >>> with_param("http://a.test/items", "cursor", "c/2=")
    'http://a.test/items?cursor=c%2F2%3D'
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key == name for key, _ in query):
        query = [(key, value if key == name else old) for key, old in query]
    else:
        query.append((name, value))
    return parts._replace(query=urlencode(query), fragment="").geturl()


def _query_value(value: Any) -> str:
    """A cursor as a query value: strings as they are, numbers and others as JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
