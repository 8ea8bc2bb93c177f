"""The messages that travel between stages: frozen dataclasses, JSON on the wire."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit

from vcrawl.api_rules import ApiSpec, check_auth_name
from vcrawl.browser_actions import BrowserAction, parse_actions
from vcrawl.errors import InvalidTask, checked_regex, kind_of
from vcrawl.field_rules import FieldRule, field_rules

__all__ = [
    "MAX_LINKS_PER_PAGE",
    "MAX_URL_LENGTH",
    "PAGE_TYPES",
    "AnalysisJob",
    "DownloadTask",
    "FetchedBatch",
    "FetchedPage",
    "FieldRule",
    "RedirectLink",
    "Rule",
    "field_rules",
]

# The built-in page types; plug-ins add theirs (vcrawl.fetchers), checked against the registry at submit.
PAGE_TYPES = ("static", "dynamic", "api")
MAX_URL_LENGTH = 4096
# The links of a page that are read (JobSpec.max_links_per_page); the rest are counted, not read. Heritrix
# stops at 6000 outlinks a page; the longest real listing pages (a few hundred items of a few links each,
# and menus) stay well under this, while a 10 MiB body holds close to a million (docs/jobs.md).
MAX_LINKS_PER_PAGE = 10_000
# A plain identifier or dotted path (window.app.loadMore): a message must never carry script.
_JS_FUNCTION = re.compile(r"^[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*\Z")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")
_PAGE_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # a registry key: never code or a path
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


@dataclass(frozen=True)
class Rule:
    """How a page is fetched and analysed: its page type, JS function, wait-for selector, analyzer, fields.

    A single ``crawl.delay`` task's page has one rule (its own fields); a job's rules are tried in
    order, and ``pattern`` (a regex searched in the URL) picks the pages each one is for. One
    validator for both: a field's error names it the same way wherever the rule came from.
    """

    pattern: str = ""
    page_type: str = "static"
    js_function: str | None = None
    analyzer: str | None = None  # None: a job's pages are only searched for links
    fields: Mapping[str, FieldRule] | None = None
    wait_for: str | None = None
    api: ApiSpec | None = None  # page_type api: records, paging and follow-ups (docs/api-mode.md)
    auth: str | None = None  # page_type api: the worker's VCRAWL_API_AUTH_<auth> is sent, never the secret itself
    actions: tuple[BrowserAction, ...] | None = None  # dynamic pages: what the browser does first, in order

    def __post_init__(self) -> None:
        if not isinstance(self.page_type, str) or not _PAGE_TYPE.match(self.page_type):
            allowed = f"{', '.join(PAGE_TYPES)} or a plug-in's"
            raise InvalidTask("page_type", f"must be a page type name ({allowed}), got {self.page_type!r}")
        if self.js_function is not None:
            if not _JS_FUNCTION.match(self.js_function):
                expected = "a JavaScript identifier or dotted path like app.loadMore"
                raise InvalidTask("js_function", f"must be {expected}, got {self.js_function!r}")
            if self.page_type != "dynamic":
                raise InvalidTask("js_function", "only dynamic pages run a JavaScript function (set page_type dynamic)")
        if self.wait_for is not None:
            if not self.wait_for.strip():
                raise InvalidTask("wait_for", "must be a non-empty CSS selector")
            if self.page_type != "dynamic":
                raise InvalidTask("wait_for", "only dynamic pages wait in a browser (set page_type dynamic)")
        if self.actions is not None and not all(isinstance(a, BrowserAction) for a in self.actions):
            object.__setattr__(self, "actions", parse_actions(self.actions))  # built in code, from JSON
        if self.actions is not None and self.page_type != "dynamic":
            raise InvalidTask("actions", "only dynamic pages act in a browser (set page_type dynamic)")
        if self.analyzer is not None and not _NAME.match(self.analyzer):
            raise InvalidTask("analyzer", f"not an analyzer name: {self.analyzer!r}")
        if self.analyzer == "fields" and not self.fields:
            raise InvalidTask("fields", "the 'fields' analyzer needs at least one field rule")
        self._check_api()

    def _check_api(self) -> None:
        if self.page_type != "api":
            for name in ("api", "auth"):
                if getattr(self, name) is not None:
                    raise InvalidTask(name, "only api pages have it (set page_type api)")
            return
        if self.api is None:
            raise InvalidTask("api", "api pages need an api mapping (at least its records expression)")
        if self.analyzer not in (None, "api"):
            raise InvalidTask("analyzer", "an api page's records come from api.records; leave analyzer unset")
        if self.fields is not None:
            raise InvalidTask("fields", "an api page's fields are JMESPath expressions under api.fields")
        if self.auth is not None:
            check_auth_name(self.auth)

    @classmethod
    def from_dict(cls, data: Any, where: str = "rule") -> Rule:
        """Decode and validate a job's rule (``pattern`` required); errors name ``<where>.<key>``.

        Raises:
            InvalidTask: naming the first wrong key, e.g. ``rules[1].js_function``.
        """
        if not isinstance(data, Mapping):
            raise InvalidTask(where, f"must be a mapping of keys, got {kind_of(data)}")
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise InvalidTask(f"{where}.{key}", f"unknown key; known: {', '.join(sorted(known))}")
        pattern = data.get("pattern")
        if not isinstance(pattern, str):
            raise InvalidTask(f"{where}.pattern", "is required and must be a regex string")
        checked_regex(pattern, f"{where}.pattern")
        try:
            values = _typed(data, required=("page_type",), optional=("js_function", "analyzer", "wait_for", "auth"))
            return cls(**values)
        except InvalidTask as exc:
            raise InvalidTask(f"{where}.{exc.field}", exc.problem) from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``from_dict`` takes it back)."""
        data = asdict(self)
        data["fields"] = {n: r.to_dict() for n, r in self.fields.items()} if self.fields else None
        if self.actions is None:  # a job's spec keeps its shape before browser actions: older workers read it
            del data["actions"]
        else:
            data["actions"] = [action.to_dict() for action in self.actions]
        if self.page_type != "api":  # a job's spec keeps its shape before api mode: older workers read it
            del data["api"], data["auth"]
        else:
            data["api"] = self.api.to_dict() if self.api is not None else None
        return data


def _typed(data: Mapping[str, Any], required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, Any]:
    """A copy of ``data`` whose string keys are checked and whose field rules are decoded.

    Raises:
        InvalidTask: naming the key of the wrong type.
    """
    values = dict(data)
    for name in required:
        if name in values and not isinstance(values[name], str):
            raise InvalidTask(name, f"must be a string, got {kind_of(values[name])}")
    for name in optional:
        if values.get(name) is not None and not isinstance(values[name], str):
            raise InvalidTask(name, f"must be a string or null, got {kind_of(values[name])}")
    if values.get("fields") is not None:
        values["fields"] = field_rules(values["fields"])
    if values.get("actions") is not None:
        values["actions"] = parse_actions(values["actions"])
    if values.get("api") is not None and not isinstance(values["api"], ApiSpec):
        values["api"] = ApiSpec.from_value(values["api"])
    return values


@dataclass(frozen=True)
class DownloadTask:
    """What ``crawl.delay()`` accepts: one page to download, store and analyse."""

    url: str
    page_type: str = "static"
    save_path: str | None = None
    js_function: str | None = None
    analyzer: str = "links"
    result_path: str | None = None
    job: str | None = None
    fields: Mapping[str, FieldRule] | None = None
    wait_for: str | None = None
    api: ApiSpec | None = None  # page_type api: how its answer is read (its next pages are not followed)
    auth: str | None = None  # page_type api: the worker's VCRAWL_API_AUTH_<auth> secret is sent
    actions: tuple[BrowserAction, ...] | None = None  # page_type dynamic: browser actions (vcrawl.browser_actions)

    def __post_init__(self) -> None:
        if self.page_type == "api" and self.analyzer == "links":  # the default: an api page's analyzer is "api"
            object.__setattr__(self, "analyzer", "api")
        _check_url(self.url)
        for name in ("save_path", "result_path"):
            value = getattr(self, name)
            if value is not None and (not value.strip() or "\x00" in value):
                raise InvalidTask(name, "must be a non-empty path without NUL bytes")
        if self.job is not None and not _JOB_ID.match(self.job):
            raise InvalidTask("job", f"must be 1-128 letters, digits or . _ : - , got {self.job!r}")
        _ = self.rule  # the page's rule checks page type, JS function, wait-for, analyzer and fields

    @property
    def rule(self) -> Rule:
        """The rule this page is fetched and analysed by (the shape of a job's rules).

        Raises:
            InvalidTask: naming the wrong field.
        """
        return Rule(
            pattern="",
            page_type=self.page_type,
            js_function=self.js_function,
            analyzer=self.analyzer,
            fields=self.fields,
            wait_for=self.wait_for,
            api=self.api,
            auth=self.auth,
            actions=self.actions,
        )

    @classmethod
    def from_dict(cls, data: Any) -> DownloadTask:
        """Decode and validate a payload.

        Raises:
            InvalidTask: naming the first wrong field.
        """
        if not isinstance(data, Mapping):
            raise InvalidTask("task", f"must be an object (dict) of task fields, got {kind_of(data)}")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(data) - known, key=repr):
            raise InvalidTask(_key_name(unknown[0]), f"unknown field; known fields: {', '.join(sorted(known))}")
        if "url" not in data:
            raise InvalidTask("url", "is required")
        values = _typed(
            data,
            required=("url", "page_type", "analyzer"),
            optional=("save_path", "result_path", "js_function", "job", "wait_for", "auth"),
        )
        return cls(**values)

    def with_paths(self, save_path: str, result_path: str) -> DownloadTask:
        """Return a copy with both storage locations filled in."""
        return replace(self, save_path=save_path, result_path=result_path)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (the same shape ``from_dict`` takes)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.fields is not None:
            data["fields"] = {name: rule.to_dict() for name, rule in self.fields.items()}
        if self.api is not None:
            data["api"] = self.api.to_dict()
        if self.actions is None:  # the wire shape before browser actions: older workers read it
            del data["actions"]
        else:
            data["actions"] = [action.to_dict() for action in self.actions]
        return data


@dataclass(frozen=True)
class FetchedPage:
    """What a fetch hands to the analysis step: where the stored page is, never the body."""

    url: str
    final_url: str
    save_path: str
    http_status: int
    bytes: int
    content_type: str | None = None
    elapsed_s: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    depth: int = 0  # a job's page: its link depth
    fetched_at: str = ""  # ISO 8601, UTC
    history: str | None = None  # a scheduled job's page: the encoded URL history this visit makes
    ip: str = ""  # the server address the page came from; "" when unknown (a proxy, the browser)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FetchedPage:
        """Decode a fetch result.

        Raises:
            InvalidTask: unknown or missing fields.
        """
        return _strict(cls, data, "fetched page")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (field by field: ``dataclasses.asdict`` deep-copies, once per fetched page)."""
        return {**{name: getattr(self, name) for name in _FETCHED_PAGE_FIELDS}, "headers": dict(self.headers)}


_FETCHED_PAGE_FIELDS = tuple(spec.name for spec in fields(FetchedPage))


@dataclass(frozen=True)
class RedirectLink:
    """A redirect a job's fetch found: its target is admitted like a link, one hop fewer left."""

    url: str
    target: str
    depth: int
    redirects_left: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RedirectLink:
        """Decode one redirect.

        Raises:
            InvalidTask: unknown, missing or malformed fields.
        """
        return _strict(cls, data, "redirect")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class FetchedBatch:
    """What a job's fetch batch hands to its analysis batch: stored pages and redirects, never bodies."""

    job: str
    batch: str
    cycle: int = 0
    pages: tuple[FetchedPage, ...] = ()
    redirects: tuple[RedirectLink, ...] = ()

    @property
    def done(self) -> int:
        """How many of the batch's URLs its analysis finishes."""
        return len(self.pages) + len(self.redirects)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FetchedBatch:
        """Decode a fetch batch's hand-over.

        Raises:
            InvalidTask: unknown, missing or malformed fields.
        """
        if not isinstance(data, Mapping):
            raise InvalidTask("fetched batch", f"must be an object, got {kind_of(data)}")
        values = dict(data)
        for name in ("pages", "redirects"):
            if not isinstance(values.get(name, []), list | tuple):
                raise InvalidTask(name, f"must be a list, got {kind_of(values[name])}")
        values["pages"] = tuple(FetchedPage.from_dict(_current_page(page)) for page in values.get("pages", ()))
        values["redirects"] = tuple(RedirectLink.from_dict(hop) for hop in values.get("redirects", ()))
        return _strict(cls, values, "fetched batch")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {
            "job": self.job,
            "batch": self.batch,
            "cycle": self.cycle,
            "pages": [page.to_dict() for page in self.pages],
            "redirects": [hop.to_dict() for hop in self.redirects],
        }


def _current_page(page: Any) -> Any:
    """A page of a hand-over written before the one-crawler redesign (it named its analyzer and fields,
    which the analysis now takes from the job's rules, and had no status or size): as it is read now."""
    if not isinstance(page, Mapping) or ("analyzer" not in page and "fields" not in page):
        return page
    current = {key: value for key, value in page.items() if key not in ("analyzer", "fields")}
    return {"http_status": 200, "bytes": 0, **current}


@dataclass(frozen=True)
class AnalysisJob:
    """What the analysis stage is asked to do with a fetched page."""

    trail_id: str
    analyzer: str
    result_path: str
    fields: Mapping[str, FieldRule] | None = None
    job: str | None = None
    api: ApiSpec | None = None  # an api page: its answer is read by this, not by an analyzer

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AnalysisJob:
        """Decode an analysis job.

        Raises:
            InvalidTask: unknown, missing or malformed fields.
        """
        values = dict(data) if isinstance(data, Mapping) else data
        if isinstance(values, dict) and values.get("fields") is not None:
            values["fields"] = field_rules(values["fields"])
        if isinstance(values, dict) and values.get("api") is not None:
            values["api"] = ApiSpec.from_value(values["api"])
        return _strict(cls, values, "analysis job")

    @classmethod
    def for_task(cls, trail_id: str, task: DownloadTask) -> AnalysisJob:
        """Return the analysis part of a validated download task with paths filled in."""
        assert task.result_path is not None, "paths are filled in before dispatch"
        return cls(trail_id, task.analyzer, task.result_path, task.fields, task.job, task.api)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        data = asdict(self)
        if self.fields is not None:
            data["fields"] = {name: rule.to_dict() for name, rule in self.fields.items()}
        data["api"] = self.api.to_dict() if self.api is not None else None
        return data


def _strict(cls: type, data: Any, what: str) -> Any:
    if not isinstance(data, Mapping):
        raise InvalidTask(what, f"must be an object, got {kind_of(data)}")
    names = {f.name for f in fields(cls)}
    if unknown := sorted(set(data) - names, key=repr):
        raise InvalidTask(_key_name(unknown[0]), f"unknown field in {what}")
    for spec in fields(cls):
        value = data.get(spec.name)
        wanted = _SCALARS.get(str(spec.type).removesuffix(" | None"))
        if value is None or wanted is None:
            continue
        if not isinstance(value, wanted[0]) or isinstance(value, bool):
            raise InvalidTask(spec.name, f"must be {wanted[1]}, got {kind_of(value)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise InvalidTask(what, str(exc)) from None


_SCALARS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "str": (str, "a string"),
    "int": (int, "an integer"),
    "float": ((int, float), "a number"),
}


def _key_name(key: Any) -> str:
    """An unknown key as a field name people can read ('' and non-strings shown quoted)."""
    return key if isinstance(key, str) and key else repr(key)


def _check_url(url: str) -> None:
    if len(url) > MAX_URL_LENGTH:
        raise InvalidTask("url", f"longer than {MAX_URL_LENGTH} characters")
    if _CONTROL.search(url):
        raise InvalidTask("url", f"contains whitespace or control characters: {url[:100]!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidTask("url", f"malformed URL {url[:100]!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidTask("url", f"must be an http or https URL, got {url[:100]!r}")
    if not parts.hostname:
        raise InvalidTask("url", f"has no host: {url[:100]!r}")
    if port == 0:
        raise InvalidTask("url", f"port 0 is not a valid port: {url[:100]!r}")
