"""Crawl jobs: seeds plus rules, defined in Python, YAML or JSON; validated with the path of a bad key."""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vcrawl.documents import MAX_DOCUMENT_BYTES, parse_json, parse_yaml
from vcrawl.errors import InvalidTask, checked_regex, kind_of
from vcrawl.header_values import check_header_value
from vcrawl.job_filters import FilterSpec, check_filter_keys, parse_filter_chain, parse_filters
from vcrawl.names import STRATEGIES, STRATEGY_BREADTH_FIRST, STRATEGY_PRIORITY
from vcrawl.payloads import MAX_LINKS_PER_PAGE, DownloadTask, Rule
from vcrawl.priorities import PrioritySpec, compiled_priorities, parse_priorities, url_priority

__all__ = [
    "DedupSpec",
    "JobSpec",
    "LimitsSpec",
    "PolitenessSpec",
    "RevisitSpec",
    "ScopeSpec",
    "load_job_file",
    "masked_url",
    "new_job_id",
]

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
_ROBOTS_TOKEN = re.compile(r"^[A-Za-z_-]{1,64}\Z")


def new_job_id(clock: Any = time.time) -> str:
    """A fresh, sortable job id like ``job-20261122-011500-3f9a``."""
    return time.strftime("job-%Y%m%d-%H%M%S-", time.gmtime(clock())) + secrets.token_hex(2)


@dataclass(frozen=True)
class ScopeSpec:
    """Where a job may go: hosts (exact), domains (and their subdomains), URL regexes."""

    hosts: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolitenessSpec:
    """How gently a job treats each host."""

    # A quarter second between two requests to a host, one at a time (Crawl-delay or Retry-After
    # stretch it): a few requests a second is light for any site, and a page waits seconds, not minutes.
    min_interval_s: float = 0.25
    jitter: float = 0.5
    per_host: int = 1
    obey_robots: bool = True
    robots_token: str = "vcrawl"
    # What a 429/503 makes wait. auto: with Retry-After, the whole host (origin) for that long, at
    # every worker at once; without, only that URL (its backoff) while the host answers its other
    # requests, and the whole host once 3 answers in a row are 429/503. host: the whole host at
    # every one (the gentlest). url: only the URL when it sent Retry-After (a site known to misuse it).
    retry_after: str = "auto"


@dataclass(frozen=True)
class LimitsSpec:
    """Per-request bounds and the retry budget of a job's fetches; None: the cluster's setting
    (``VCRAWL_CONNECT_TIMEOUT_S``, ..., ``VCRAWL_FETCH_RETRIES``), filled in by ``resolved``."""

    connect_timeout_s: float | None = None
    read_timeout_s: float | None = None
    total_timeout_s: float | None = None
    min_rate_bytes_s: float | None = None
    slow_window_s: float | None = None
    max_body_bytes: int | None = None
    max_redirects: int | None = None
    retries: int | None = None

    def resolved(self, defaults: LimitsSpec) -> LimitsSpec:
        """These limits with every unset one taken from ``defaults``.

        >>> LimitsSpec(retries=1).resolved(LimitsSpec(5.0, 15.0, 60.0, 1024.0, 5.0, 1024, 5, 3))
        LimitsSpec(connect_timeout_s=5.0, read_timeout_s=15.0, total_timeout_s=60.0, min_rate_bytes_s=1024.0, \
slow_window_s=5.0, max_body_bytes=1024, max_redirects=5, retries=1)
        """
        return replace(
            self, **{f.name: getattr(defaults, f.name) for f in fields(self) if getattr(self, f.name) is None}
        )


@dataclass(frozen=True)
class DedupSpec:
    """Sizing of the job's Bloom filter: expected distinct URLs and false-positive rate."""

    expected_urls: int = 1_000_000
    error_rate: float = 0.001


@dataclass(frozen=True)
class RevisitSpec:
    """When a known URL is due again in a scheduled job's next cycle (Nutch's adaptive schedule).

    A URL starts with ``initial_s``; each visit that finds it changed shrinks the interval by
    ``shrink`` (x 0.8 by default), each visit that finds it unchanged grows it by ``grow``
    (x 1.4), always within ``min_s`` .. ``max_s``. Intervals count from the start of the cycle
    that fetched the URL, so a page fetched late in a cycle is not one cycle late the next time.
    """

    initial_s: float = 86400.0
    min_s: float = 3600.0
    max_s: float = 30 * 86400.0
    grow: float = 0.4
    shrink: float = 0.2


ROBOTS_SITEMAPS = "robots"
"""A job's default ``sitemaps``: the sitemaps robots.txt names (docs/sitemaps.md)."""


@dataclass(frozen=True)
class JobSpec:
    """A crawl job. ``None`` header pools mean the cluster's configured defaults."""

    seeds: tuple[str, ...]
    id: str = ""
    scope: ScopeSpec = field(default_factory=ScopeSpec)
    max_depth: int = 3
    max_pages: int = 10_000
    rules: tuple[Rule, ...] = ()
    politeness: PolitenessSpec = field(default_factory=PolitenessSpec)
    user_agents: tuple[str, ...] | None = None
    referers: tuple[str, ...] | None = None
    proxies: tuple[str, ...] | None = None
    limits: LimitsSpec = field(default_factory=LimitsSpec)
    dedup: DedupSpec = field(default_factory=DedupSpec)
    allowed_networks: tuple[str, ...] = ()
    warc: bool = False
    revisit: RevisitSpec = field(default_factory=RevisitSpec)
    batch_analyzers: tuple[str, ...] = ()  # run over the stored crawl when the job (each cycle) completes
    # "robots": each seed origin's robots.txt Sitemap lines (no request beyond robots.txt); True: those,
    # else the origin's /sitemap.xml; a tuple: read these; False: none.
    sitemaps: bool | str | tuple[str, ...] = ROBOTS_SITEMAPS
    # The order of the frontier's queues: names.STRATEGIES; priorities: its scores' part from patterns.
    strategy: str = STRATEGY_BREADTH_FIRST
    priorities: tuple[PrioritySpec, ...] = ()
    filters: tuple[FilterSpec, ...] = ()  # run after the built-in scope filters, in this order
    filter_chain: tuple[FilterSpec, ...] | None = None  # the whole chain after scope; None: built-ins + filters
    # The links of a page that are read (to follow, and the links analyzer's): the rest are counted
    # (links_truncated), never canonicalised nor admitted, so a page of 750,000 links costs what one of 10,000 does.
    max_links_per_page: int = MAX_LINKS_PER_PAGE

    @classmethod
    def from_dict(cls, data: Any, job_id: str | None = None) -> JobSpec:
        """Validate a job definition (as read from YAML/JSON or given in Python).

        Raises:
            InvalidTask: ``field`` is the path of the bad key, e.g. ``rules[1].pattern``.
        """
        data = _mapping(data, "job")
        _known(data, {f.name for f in fields(cls)}, "")
        seeds = _str_list(data.get("seeds"), "seeds", required=True)
        for index, seed in enumerate(seeds):
            _check_seed(seed, f"seeds[{index}]")
        spec = cls(
            seeds=seeds,
            id=_job_id(data.get("id", job_id) or new_job_id()),
            scope=_scope(data.get("scope")),
            max_depth=_int(data.get("max_depth", 3), "max_depth", 0, 1000),
            max_pages=_int(data.get("max_pages", 10_000), "max_pages", 1, 10**9),
            rules=tuple(Rule.from_dict(r, f"rules[{i}]") for i, r in enumerate(_list(data.get("rules"), "rules"))),
            politeness=_politeness(data.get("politeness")),
            user_agents=_optional_pool(data, "user_agents"),
            referers=_optional_pool(data, "referers"),
            proxies=_optional_pool(data, "proxies"),
            limits=_limits(data.get("limits")),
            dedup=_dedup(data.get("dedup")),
            allowed_networks=_networks(data.get("allowed_networks")),
            warc=_bool(data.get("warc", False), "warc"),
            revisit=_revisit(data.get("revisit")),
            batch_analyzers=_str_list(data.get("batch_analyzers", []), "batch_analyzers"),
            sitemaps=_sitemaps(data.get("sitemaps", ROBOTS_SITEMAPS)),
            strategy=_strategy(data.get("strategy", STRATEGY_BREADTH_FIRST)),
            priorities=parse_priorities(data.get("priorities")),
            filters=parse_filters(data.get("filters")),
            filter_chain=parse_filter_chain(data.get("filter_chain")),
            max_links_per_page=_int(
                data.get("max_links_per_page", MAX_LINKS_PER_PAGE), "max_links_per_page", 1, 10_000_000
            ),
        )
        if spec.priorities and spec.strategy != STRATEGY_PRIORITY:  # else silently unused
            raise InvalidTask("priorities", f"are used only with strategy: priority, got strategy {spec.strategy!r}")
        check_filter_keys(spec.filters, spec.filter_chain, allow=bool(spec.scope.allow), deny=bool(spec.scope.deny))
        for index, proxy in enumerate(spec.proxies or ()):
            try:
                parts = urlsplit(proxy)
                valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
            except ValueError:  # a bad IPv6 literal or port
                valid = False
            if not valid:
                raise InvalidTask(f"proxies[{index}]", f"must be an http(s) proxy URL, got {proxy!r}")
        return spec

    def rule_for(self, url: str) -> Rule:
        """The first rule whose pattern matches ``url``, or the default (static, links only)."""
        for rule in self.rules:
            if re.search(rule.pattern, url):
                return rule
        return _DEFAULT_RULE

    def has_dynamic_rules(self) -> bool:
        """Whether any of the job's pages may need a browser (a rule with ``page_type: dynamic``)."""
        return any(rule.page_type == "dynamic" for rule in self.rules)

    def priority_of(self, url: str, depth: int, sitemap_priority: float | None = None) -> float:
        """A URL's score when admitted in a priority job (``vcrawl.priorities.url_priority``; a job's
        runtime keeps the patterns compiled instead: ``engine.jobs.JobRuntime.priorities``)."""
        return url_priority(compiled_priorities(self.priorities), url, depth, sitemap_priority)

    def with_id(self, job_id: str) -> JobSpec:
        """A copy under another id."""
        return replace(self, id=_job_id(job_id))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``from_dict`` takes it back)."""
        data = asdict(self)
        data["rules"] = [rule.to_dict() for rule in self.rules]
        # A spec without filters, strategy, priorities or its own link cap keeps its shape: older workers
        # refuse keys they do not know, and from_dict gives them back as defaults.
        if self.max_links_per_page == MAX_LINKS_PER_PAGE:
            del data["max_links_per_page"]
        if not self.filters:
            del data["filters"]
        if self.filter_chain is None:
            del data["filter_chain"]
        if self.strategy == STRATEGY_BREADTH_FIRST:
            del data["strategy"]
        if not self.priorities:
            del data["priorities"]
        return data

    def to_json(self) -> str:
        """Compact JSON for storing in Redis."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)


_DEFAULT_RULE = Rule(pattern="")


def masked_url(url: str) -> str:
    """A URL with its password hidden, for anything people or logs see.

    >>> masked_url("http://user:s3cret@proxy.internal:3128/"), masked_url("http://proxy.internal:3128")
    ('http://user:***@proxy.internal:3128/', 'http://proxy.internal:3128')
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.netloc.rsplit('@', 1)[1]}"
    return parts._replace(netloc=netloc).geturl()


def load_job_file(path: str | Path) -> JobSpec:
    """Read a job from a ``.yaml``/``.yml`` or ``.json`` file, within the job API's document limits.

    Raises:
        InvalidTask: unreadable, too large or malformed file (``field`` is ``file``), or a bad key.
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_DOCUMENT_BYTES + 1)  # a larger file is refused unread
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTask("file", f"cannot read {path}: {exc}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise InvalidTask("file", f"{path} is over {MAX_DOCUMENT_BYTES} bytes, the most a job document may hold")
    # YAML as the job API reads it: a key given twice is refused, naming it
    document = parse_json(data, "file") if path.suffix == ".json" else parse_yaml(text, "file")
    return JobSpec.from_dict(document)


def _scope(value: Any) -> ScopeSpec:
    data = _mapping(value if value is not None else {}, "scope")
    _known(data, {f.name for f in fields(ScopeSpec)}, "scope.")
    hosts = tuple(h.lower().strip(".") for h in _str_list(data.get("hosts"), "scope.hosts"))
    domains = tuple(d.lower().strip(".") for d in _str_list(data.get("domains"), "scope.domains"))
    for name, items in (("scope.hosts", hosts), ("scope.domains", domains)):
        for index, item in enumerate(items):
            if not item or "/" in item or ":" in item:
                raise InvalidTask(f"{name}[{index}]", f"must be a host name without scheme, port or path, got {item!r}")
    allow = _regexes(data.get("allow"), "scope.allow")
    deny = _regexes(data.get("deny"), "scope.deny")
    return ScopeSpec(hosts, domains, allow, deny)


# (low, high) for every number a job file may set.
_BOUNDS: dict[str, tuple[float, float]] = {
    "min_interval_s": (0, 3600),
    "jitter": (0, 10),
    "per_host": (1, 256),
    "connect_timeout_s": (0.1, 600),
    "read_timeout_s": (0.1, 600),
    "total_timeout_s": (0.1, 3600),
    "min_rate_bytes_s": (0, 10**9),
    "slow_window_s": (0.1, 3600),
    "max_body_bytes": (1, 2**31),
    "max_redirects": (0, 20),
    "retries": (0, 20),
    "expected_urls": (1000, 10**10),
    "error_rate": (1e-9, 0.1),
    "initial_s": (0, 10 * 365 * 86400),
    "min_s": (0, 10 * 365 * 86400),
    "max_s": (0, 10 * 365 * 86400),
    "grow": (0, 10),
    "shrink": (0, 0.99),
}


def _section(value: Any, cls: type, prefix: str) -> Any:
    """Build a spec dataclass from a mapping, checking each key's type and range."""
    data = _mapping(value if value is not None else {}, prefix)
    _known(data, {f.name for f in fields(cls)}, f"{prefix}.")
    values: dict[str, Any] = {}
    for spec_field in fields(cls):
        if spec_field.name not in data:
            continue
        where, raw = f"{prefix}.{spec_field.name}", data[spec_field.name]
        kind = str(spec_field.type).removesuffix(" | None")
        if raw is None and kind != spec_field.type:
            continue  # optional: None means the default
        if kind == "bool":
            if not isinstance(raw, bool):
                raise InvalidTask(where, f"must be true or false, got {raw!r}")
            values[spec_field.name] = raw
        elif kind == "int":
            values[spec_field.name] = _int(raw, where, *map(int, _BOUNDS[spec_field.name]))
        elif kind == "float":
            values[spec_field.name] = _float(raw, where, *_BOUNDS[spec_field.name])
        else:
            values[spec_field.name] = raw
    return cls(**values)


def _politeness(value: Any) -> PolitenessSpec:
    spec = _section(value, PolitenessSpec, "politeness")
    if not isinstance(spec.robots_token, str) or not _ROBOTS_TOKEN.match(spec.robots_token):
        raise InvalidTask(
            "politeness.robots_token", f"must be a product token of letters, '-' or '_', got {spec.robots_token!r}"
        )
    if spec.retry_after not in ("auto", "host", "url"):
        raise InvalidTask("politeness.retry_after", f"must be 'auto', 'host' or 'url', got {spec.retry_after!r}")
    return spec


def _limits(value: Any) -> LimitsSpec:
    return _section(value, LimitsSpec, "limits")


def _dedup(value: Any) -> DedupSpec:
    return _section(value, DedupSpec, "dedup")


def _revisit(value: Any) -> RevisitSpec:
    spec = _section(value, RevisitSpec, "revisit")
    if spec.min_s > spec.max_s:
        raise InvalidTask("revisit.min_s", f"must not exceed revisit.max_s ({spec.max_s:g}), got {spec.min_s:g}")
    if not spec.min_s <= spec.initial_s <= spec.max_s:
        raise InvalidTask(
            "revisit.initial_s",
            f"must be between min_s and max_s ({spec.min_s:g}..{spec.max_s:g}), got {spec.initial_s:g}",
        )
    return spec


def _sitemaps(value: Any) -> bool | str | tuple[str, ...]:
    if isinstance(value, bool) or value == ROBOTS_SITEMAPS:
        return value
    if not isinstance(value, list | tuple):
        raise InvalidTask("sitemaps", f'must be "robots" (the default: robots.txt\'s Sitemap lines), true (those, '
                          f"else /sitemap.xml), false, or a list of sitemap URLs; got {value!r}")  # fmt: skip
    urls = _str_list(value, "sitemaps")
    for index, url in enumerate(urls):
        _check_seed(url, f"sitemaps[{index}]")
    return urls


def _strategy(value: Any) -> str:
    if value not in STRATEGIES:
        raise InvalidTask("strategy", f"must be one of {', '.join(STRATEGIES)}; got {value!r}")
    return value


def _networks(value: Any) -> tuple[str, ...]:
    networks = []
    for index, item in enumerate(_str_list(value, "allowed_networks")):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise InvalidTask(f"allowed_networks[{index}]", f"not a CIDR network: {item!r}") from None
    return tuple(networks)


def _optional_pool(data: Mapping[str, Any], name: str) -> tuple[str, ...] | None:
    """A header pool (``user_agents``, ``referers``, ``proxies``): every value is sent in a request header."""
    if data.get(name) is None:
        return None
    pool = _str_list(data[name], name)
    for index, value in enumerate(data[name]):  # as given: a CR/LF at an end is refused, not trimmed away
        check_header_value(value, f"{name}[{index}]")
    return pool


def _check_seed(url: str, where: str) -> None:
    try:
        DownloadTask(url=url)
    except InvalidTask as exc:
        raise InvalidTask(where, exc.problem) from None


def _job_id(value: Any) -> str:
    if not isinstance(value, str) or not _JOB_ID.match(value):
        raise InvalidTask("id", f"must be 1-128 letters, digits or . _ : - , got {value!r}")
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidTask(where, f"must be a mapping of keys, got {kind_of(value)}")
    return value


def _known(data: Mapping[str, Any], names: set[str], prefix: str) -> None:
    for key in data:
        if key not in names:
            raise InvalidTask(f"{prefix}{key}", f"unknown key; known: {', '.join(sorted(names))}")


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise InvalidTask(where, f"must be a list, got {kind_of(value)}")
    return list(value)


def _str_list(value: Any, where: str, required: bool = False) -> tuple[str, ...]:
    items = _list(value, where)
    if required and not items:
        raise InvalidTask(where, "needs at least one entry")
    for index, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise InvalidTask(f"{where}[{index}]", f"must be a non-empty string, got {kind_of(item)}")
    return tuple(item.strip() for item in items)


def _regexes(value: Any, where: str) -> tuple[str, ...]:
    patterns = _str_list(value, where)
    for index, pattern in enumerate(patterns):
        checked_regex(pattern, f"{where}[{index}]")
    return patterns


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidTask(where, f"must be true or false, got {value!r}")
    return value


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTask(where, f"must be an integer, got {kind_of(value)}")
    if not low <= value <= high:
        raise InvalidTask(where, f"must be between {low} and {high}, got {value}")
    return value


def _float(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTask(where, f"must be a number, got {kind_of(value)}")
    if not low <= value <= high:
        raise InvalidTask(where, f"must be between {low:g} and {high:g}, got {value}")
    return float(value)
