"""A rule's ``api`` key: how records, next pages and follow-up URLs are picked out of a JSON API's answers.

Every expression is JMESPath (https://jmespath.org), compiled here at validation time, so a bad
one is refused when the job is submitted, naming its key (``rules[0].api.records``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import jmespath
import jmespath.exceptions
import jmespath.parser

from vcrawl.errors import InvalidTask

__all__ = [
    "AUTH_PREFIX",
    "ApiSpec",
    "CountPaging",
    "CursorPaging",
    "auth_variable",
    "check_auth_name",
    "compiled",
]

AUTH_PREFIX = "VCRAWL_API_AUTH_"
"""``auth: "ACME"`` names the worker's variable ``VCRAWL_API_AUTH_ACME``; the secret never travels in a message."""

_AUTH_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}\Z")
# A query parameter name as APIs spell them (page, page[number], pageSize, next_cursor, ...).
_PARAM = re.compile(r"^[A-Za-z0-9_.\[\]-]{1,64}\Z")
# Names canonical_url drops by default (frontier.urls.DEFAULT_TRACKING_PARAMS): a paging parameter
# of that name would vanish from the next page's URL, and the crawl would read page one for ever.
_DROPPED_PARAMS = frozenset({"fbclid", "gclid", "dclid", "msclkid", "mc_cid", "mc_eid", "yclid", "igshid", "_ga",
                             "jsessionid", "phpsessid", "sid", "sessionid", "aspsessionid"})  # fmt: skip
_PAGINGS = ("next", "cursor", "page", "offset")


@functools.lru_cache(maxsize=1024)
def compiled(expression: str) -> jmespath.parser.ParsedResult:
    """The compiled JMESPath ``expression`` (cached: rules are decoded again and again).

    Raises:
        jmespath.exceptions.JMESPathError: a malformed expression (validation checked it already).
    """
    return jmespath.compile(expression)


def _expression(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidTask(where, f"must be a non-empty JMESPath expression, got {_kind(value)}")
    try:
        compiled(value)
    except jmespath.exceptions.JMESPathError as exc:
        problem = " ".join(str(exc).split())
        raise InvalidTask(where, f"invalid JMESPath expression {value!r}: {problem}") from None
    return value


def _param(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _PARAM.match(value):
        raise InvalidTask(where, f"must be a query parameter name (letters, digits, _ . - [ ]), got {value!r}")
    if value.lower() in _DROPPED_PARAMS or value.lower().startswith("utm_"):
        raise InvalidTask(where, f"{value!r} is a tracking or session parameter that URL canonicalization drops")
    return value


def _int(value: Any, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidTask(where, f"must be an integer of at least {low}, got {value!r}")
    return value


def _known(data: Mapping[str, Any], names: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in names:
            raise InvalidTask(f"{where}.{key}", f"unknown key; known: {', '.join(sorted(names))}")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidTask(where, f"must be a mapping of keys, got {_kind(value)}")
    return value


@dataclass(frozen=True)
class CursorPaging:
    """The next page is this URL with ``param`` set to the cursor ``field`` picks; none (null, "") ends it."""

    field: str
    param: str

    @classmethod
    def from_value(cls, value: Any, where: str) -> CursorPaging:
        """Decode ``{field, param}``.

        Raises:
            InvalidTask: naming ``<where>.<key>``.
        """
        data = _mapping(value, where)
        _known(data, ("field", "param"), where)
        return cls(_expression(data.get("field"), f"{where}.field"), _param(data.get("param"), f"{where}.param"))


@dataclass(frozen=True)
class CountPaging:
    """Page-number or offset paging: ``param`` counts up by ``step`` from ``start``.

    ``stop`` is ``"empty"`` (a page without records is the last) or a JMESPath expression to a
    number: for page numbers the last page (or the page count), for offsets the total of records.
    ``size_param``/``size`` set the page size on every next page's URL, when given.
    """

    param: str
    start: int = 1
    step: int = 1
    stop: str = "empty"
    size_param: str | None = None
    size: int | None = None

    @classmethod
    def from_value(cls, value: Any, where: str, *, offsets: bool) -> CountPaging:
        """Decode a ``page`` (``offsets`` False) or ``offset`` (True) mapping.

        Raises:
            InvalidTask: naming ``<where>.<key>``.
        """
        data = _mapping(value, where)
        names = ("param", "start", "step", "stop") if offsets else ("param", "start", "stop", "size_param", "size")
        _known(data, names, where)
        stop = data.get("stop", "empty")
        paging = cls(
            param=_param(data.get("param"), f"{where}.param"),
            start=_int(data.get("start", 0 if offsets else 1), f"{where}.start", 0),
            step=_int(data.get("step"), f"{where}.step", 1) if offsets else 1,
            stop=stop if stop == "empty" else _expression(stop, f"{where}.stop"),
            size_param=_param(data["size_param"], f"{where}.size_param") if data.get("size_param") else None,
            size=_int(data["size"], f"{where}.size", 1) if data.get("size") is not None else None,
        )
        if (paging.size_param is None) != (paging.size is None):
            raise InvalidTask(f"{where}.size_param", "size_param and size go together")
        return paging


@dataclass(frozen=True)
class ApiSpec:
    """How one JSON (or JSON Lines) answer is read: its records, its next page, its follow-up URLs.

    At most one paging: ``next`` (an expression to the next page's URL), ``cursor``, ``page`` or
    ``offset``. ``fields`` (name -> expression) reshapes each record; without it a record is kept whole.
    """

    records: str = "@"
    fields: Mapping[str, str] | None = None
    next: str | None = None
    cursor: CursorPaging | None = None
    page: CountPaging | None = None
    offset: CountPaging | None = None
    follow: tuple[str, ...] = ()

    @property
    def paging(self) -> str | None:
        """Which paging the spec uses (``next``, ``cursor``, ``page``, ``offset``), None for none."""
        return next((name for name in _PAGINGS if getattr(self, name) is not None), None)

    @classmethod
    def from_value(cls, value: Any, where: str = "api") -> ApiSpec:
        """Decode and check an ``api`` mapping, compiling every expression.

        Raises:
            InvalidTask: naming the key, e.g. ``api.cursor.param``.
        """
        data = _mapping(value, where)
        _known(data, tuple(f.name for f in fields(cls)), where)
        given = [name for name in _PAGINGS if data.get(name) is not None]
        if len(given) > 1:
            raise InvalidTask(f"{where}.{given[1]}", f"give one paging at most, got {', '.join(given)}")
        follow = data.get("follow") or []
        if not isinstance(follow, list | tuple):
            raise InvalidTask(f"{where}.follow", f"must be a list of JMESPath expressions, got {_kind(follow)}")
        return cls(
            records=_expression(data.get("records", "@"), f"{where}.records"),
            fields=_fields(data["fields"], f"{where}.fields") if data.get("fields") is not None else None,
            next=_expression(data["next"], f"{where}.next") if data.get("next") is not None else None,
            cursor=CursorPaging.from_value(data["cursor"], f"{where}.cursor") if "cursor" in given else None,
            page=CountPaging.from_value(data["page"], f"{where}.page", offsets=False) if "page" in given else None,
            offset=CountPaging.from_value(data["offset"], f"{where}.offset", offsets=True)
            if "offset" in given
            else None,
            follow=tuple(_expression(item, f"{where}.follow[{i}]") for i, item in enumerate(follow)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``from_value`` takes it back), without unset keys."""
        data = {key: value for key, value in asdict(self).items() if value is not None and value != ()}
        if "follow" in data:
            data["follow"] = list(data["follow"])
        for name in ("page", "offset"):
            if name in data:
                data[name] = {key: value for key, value in data[name].items() if value is not None}
                if name == "page":
                    data[name].pop("step", None)
        return data


def _fields(value: Any, where: str) -> dict[str, str]:
    data = _mapping(value, where)
    if not data:
        raise InvalidTask(where, "must name at least one field")
    for name in data:
        if not isinstance(name, str) or not name:
            raise InvalidTask(where, f"not a field name: {name!r}")
    return {name: _expression(expr, f"{where}.{name}") for name, expr in data.items()}


def check_auth_name(value: Any, where: str = "auth") -> str:
    """Check an ``auth`` name: upper-case letters, digits and ``_`` (it ends a variable's name).

    Raises:
        InvalidTask: naming ``where``.
    """
    if not isinstance(value, str) or not _AUTH_NAME.match(value):
        raise InvalidTask(where, f"must be a name like ACME_API (A-Z, 0-9, _), got {_kind(value)}")
    return value


def auth_variable(name: str) -> str:
    """The worker's variable that holds the secret of ``auth: name``.

    >>> auth_variable("ACME_API")
    'VCRAWL_API_AUTH_ACME_API'
    """
    return AUTH_PREFIX + name


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    return "null" if value is None else type(value).__name__
