"""The job API and dashboard (``vcrawl serve``): JSON over HTTP, a bearer token on every ``/api/`` call.

``JobApi.handle`` is a plain function of (method, target, headers, a body reader) to (status,
headers, body), so routing and auth are testable without sockets; ``api.http`` serves it over
HTTP. It reads the body only once the request passed its checks, and reads JSON and YAML bodies
within ``vcrawl.documents``' limits. The dashboard (``/``) is one static page (with its script
and styles as files, so its Content-Security-Policy allows no inline code) that reads only this API.

Cross-site requests (docs/security.md): a request that changes something is refused when the
browser says it comes from another site (``Sec-Fetch-Site``) or another origin (``Origin``
against ``Host``), before the token is even looked at; without a token (``--insecure-local``)
every ``/api/`` call must also name a loopback host, so a DNS-rebound name cannot reach it.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from api.openapi import openapi_document
from vcrawl.documents import parse_json, parse_yaml
from vcrawl.errors import InvalidTask
from vcrawl.jobs import masked_url

__all__ = ["JobApi", "RequestRefused", "cross_site_refusal", "json_response", "loggable"]

logger = logging.getLogger(__name__)

# Every answer refuses to be framed (a hidden Cancel button under another site's page: clickjacking).
_API_POLICY = "default-src 'none'; frame-ancestors 'none'"
_PAGE_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
                "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")  # fmt: skip
# The dashboard's files: path -> (resource, content type).
_PAGES = {
    "/": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard-forms.js": ("dashboard-forms.js", "text/javascript; charset=utf-8"),
    "/dashboard-clusters.js": ("dashboard-clusters.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CHANGES = frozenset({"POST", "PATCH", "PUT", "DELETE"})  # the methods a cross-site page must not send
_YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml"})
_MOST_SLOTS = 1024  # a worker's pool size at most (``tasks.pool.MAX_CONCURRENCY``)
_JOB = r"(?P<job>[A-Za-z0-9][A-Za-z0-9._:%-]{0,200})"


@dataclass
class JobApi:
    """Routes and handlers; every dependency is passed in (the CLI passes the real ones)."""

    token: str | None  # None: no auth (``--insecure-local``)
    start_job: Callable[[Mapping[str, Any]], str]
    job_status: Callable[[str], dict[str, Any] | None]
    jobs: Callable[[int], list[str]]
    cancel: Callable[[str], bool]
    pause: Callable[[str], bool]
    resume: Callable[[str], str | None]
    reconfigure: Callable[[str, Mapping[str, Any]], Any]
    failures: Callable[[str, int], list[dict[str, Any]]]
    host_stats: Callable[[str], dict[str, dict[str, int]]]
    stats: Callable[[str, int, float], list[tuple[int, dict[str, int]]]]
    queues: Callable[[], dict[str, int]]
    nodes: Callable[[bool], dict[str, Any]] = lambda with_hosts: {"nodes": []}
    # (node, pool size) -> the worker's answer (``tasks.resize_node``): "concurrency", or "error" and "answered"
    resize_node: Callable[[str, int], dict[str, Any]] = lambda node, size: {"error": "no workers", "answered": False}
    daily: Callable[[str, int, float, str | None], dict[str, Any] | None] = lambda job, days, now, host: None
    analyses: Callable[[str, int], list[dict[str, Any]]] = lambda job, limit: []
    # The cluster log stream's last lines of a job: (job, node, level, limit) -> [(stream id, fields)]; a
    # level that is not one raises ValueError.
    logs: Callable[[str, str | None, str, int], list[tuple[str, dict[str, str]]]] = lambda job, node, level, limit: []
    job_spec: Callable[[str], Any] = lambda job: None  # a JobSpec with its live changes, None if unknown
    # A job's status for the job list, which shows no output files (None: job_status).
    job_summary: Callable[[str], dict[str, Any] | None] | None = None
    # The cluster's VCRAWL_* settings (vcrawl.live_settings): listed; set and unset live (None: not offered).
    cluster_settings: Callable[[], list[dict[str, Any]]] = lambda: []
    set_setting: Callable[[str, str], str] | None = None
    unset_setting: Callable[[str], bool] | None = None
    clock: Callable[[], float] = time.time
    # The routes under /api/clusters (api.monitor.Monitor.answer): (method, path, query, headers, read_body) ->
    # an answer; None: those paths are unknown here, as on a JobApi of one cluster of a monitor.
    clusters: Callable[..., tuple[int, dict[str, str], bytes]] | None = None
    _routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        route = [
            ("GET", r"/api/jobs", self._list_jobs),
            ("POST", r"/api/jobs", self._create_job),
            ("GET", rf"/api/jobs/{_JOB}", self._get_job),
            ("POST", rf"/api/jobs/{_JOB}/(?P<action>cancel|pause|resume)", self._act),
            ("PATCH", rf"/api/jobs/{_JOB}/config", self._configure),
            ("GET", rf"/api/jobs/{_JOB}/config", self._get_config),
            ("GET", rf"/api/jobs/{_JOB}/failures", self._failures),
            ("GET", rf"/api/jobs/{_JOB}/hosts", self._hosts),
            ("GET", rf"/api/jobs/{_JOB}/stats", self._stats),
            ("GET", rf"/api/jobs/{_JOB}/daily", self._daily),
            ("GET", rf"/api/jobs/{_JOB}/analyses", self._analyses),
            ("GET", rf"/api/jobs/{_JOB}/logs", self._logs),
            ("GET", r"/api/queues", self._queues),
            ("GET", r"/api/nodes", self._nodes),
            ("GET", r"/api/config", self._cluster_config),
            ("PUT", r"/api/config/(?P<name>[A-Za-z][A-Za-z0-9_]{0,79})", self._set_setting),
            ("DELETE", r"/api/config/(?P<name>[A-Za-z][A-Za-z0-9_]{0,79})", self._unset_setting),
            ("POST", r"/api/nodes/(?P<node>[A-Za-z0-9._@:%+-]{1,300})/concurrency", self._resize),
        ]
        self._routes = [(method, re.compile(pattern + "$"), handler) for method, pattern, handler in route]

    def handle(
        self, method: str, target: str, headers: Mapping[str, str], read_body: Callable[[], bytes]
    ) -> tuple[int, dict[str, str], bytes]:
        """Answer one request: (status, headers, body).

        ``read_body`` is called only for a request that passed the cross-site and token checks
        and names an endpoint; it raises ``RequestRefused`` for a body over the limits.
        """
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        named = {name.lower(): value for name, value in headers.items()}
        if (early := self._unauthenticated(method, path, named)) is not None:
            status, extra, payload = early
            # No keep-alive for a client that showed no token: it could hold connections for ever.
            return status, {**extra, "Connection": "close"}, payload
        if self.clusters is not None and (path == "/api/clusters" or path.startswith("/api/clusters/")):
            return self.clusters(method, path, query, named, read_body)
        return self.route(method, path, query, named, read_body)

    def _unauthenticated(
        self, method: str, path: str, headers: Mapping[str, str]
    ) -> tuple[int, dict[str, str], bytes] | None:
        """The answer to a request that needs no token (the dashboard's files, the API's description)
        or that is refused before one is looked at (cross-site, wrong token); None for one that passed."""
        if method in ("GET", "HEAD") and path in _PAGES:
            name, content_type = _PAGES[path]
            page = resources.files("api").joinpath(name).read_bytes()
            return 200, {"Content-Type": content_type, "Cache-Control": "no-store",
                         "Content-Security-Policy": _PAGE_POLICY}, page  # fmt: skip
        if method == "GET" and path == "/openapi.json":
            return json_response(200, openapi_document())
        if not path.startswith("/api/"):
            return json_response(404, {"error": f"no such page: {path}"})
        if (refusal := cross_site_refusal(method, headers, loopback_only=self.token is None)) is not None:
            logger.warning("refused %s %s: %s", method, loggable(path), loggable(refusal))
            return json_response(403, {"error": refusal})
        if not self._authorized(headers.get("authorization", "")):
            status, extra, payload = json_response(401, {"error": "missing or wrong bearer token"})
            return status, {**extra, "WWW-Authenticate": 'Bearer realm="vcrawl"'}, payload
        return None

    def route(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        read_body: Callable[[], bytes],
    ) -> tuple[int, dict[str, str], bytes]:
        """Answer a request that passed the cross-site and token checks (``handle``'s, or a monitor's)."""
        allowed = []
        for route_method, pattern, handler in self._routes:
            match = pattern.match(path)
            if match is None:
                continue
            allowed.append(route_method)
            if route_method == method:
                params = {name: unquote(value) for name, value in match.groupdict().items()}
                try:
                    body = _Body(read_body(), headers.get("content-type", ""))
                    return handler(query=query, body=body, **params)
                except InvalidTask as exc:
                    return json_response(422, {"error": exc.problem, "field": exc.field})
                except RequestRefused as exc:
                    return json_response(exc.status, {"error": exc.message})
        if allowed:
            status, extra, payload = json_response(405, {"error": f"{method} not allowed here"})
            return status, {**extra, "Allow": ", ".join(allowed)}, payload
        return json_response(404, {"error": f"no such endpoint: {path}"})

    def _authorized(self, header: str) -> bool:
        if self.token is None:
            return True
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())

    # Handlers: each returns json_response(...) or raises InvalidTask / RequestRefused.

    def _list_jobs(self, query: dict[str, list[str]], body: _Body) -> tuple[int, dict[str, str], bytes]:
        limit = _int_param(query, "limit", 50, 1, 1000)
        status_of = self.job_summary or self.job_status
        jobs = [status_of(job_id) for job_id in self.jobs(limit)]
        return json_response(200, {"jobs": [_summary(status) for status in jobs if status is not None]})

    def _create_job(self, query: dict[str, list[str]], body: _Body) -> tuple[int, dict[str, str], bytes]:
        job_id = self.start_job(body.mapping())
        return json_response(201, {"id": job_id, "status": self.job_status(job_id)})

    def _get_job(self, query: dict[str, list[str]], body: _Body, job: str) -> tuple[int, dict[str, str], bytes]:
        return json_response(200, self._status(job))

    def _act(
        self, query: dict[str, list[str]], body: _Body, job: str, action: str
    ) -> tuple[int, dict[str, str], bytes]:
        state = self._status(job)["state"]
        if action == "cancel":
            done = self.cancel(job)
        elif action == "pause":
            done = self.pause(job)
        else:
            done = self.resume(job) is not None
        if not done:
            raise RequestRefused(409, f"cannot {action} job {job}: it is {state}")
        return json_response(200, {"job": job, "state": self._status(job)["state"]})

    def _configure(self, query: dict[str, list[str]], body: _Body, job: str) -> tuple[int, dict[str, str], bytes]:
        self._status(job)
        spec = self.reconfigure(job, body.mapping())
        return json_response(200, {"job": job, "spec_rev": self._status(job)["spec_rev"], **_live_settings(spec)})

    def _get_config(self, query: dict[str, list[str]], body: _Body, job: str) -> tuple[int, dict[str, str], bytes]:
        status, spec = self._status(job), self.job_spec(job)
        if spec is None:
            raise RequestRefused(404, f"no job {job!r}")
        live = _live_settings(spec)
        return json_response(200, {"job": job, "state": status["state"], "spec_rev": status["spec_rev"], **live})

    def _failures(self, query: dict[str, list[str]], body: _Body, job: str) -> tuple[int, dict[str, str], bytes]:
        self._status(job)
        return json_response(200, {"job": job, "failures": self.failures(job, _int_param(query, "limit", 50, 1, 200))})

    def _hosts(self, query: dict[str, list[str]], body: _Body, job: str) -> tuple[int, dict[str, str], bytes]:
        self._status(job)
        limit = _int_param(query, "limit", 20, 1, 10_000)
        rows = [{"host": host, **counts} for host, counts in self.host_stats(job).items()]
        rows.sort(key=lambda row: (-row["fetched"], row["host"]))
        return json_response(200, {"job": job, "hosts": rows[:limit], "total_hosts": len(rows)})

    def _stats(self, query: dict[str, list[str]], body: _Body, job: str) -> tuple[int, dict[str, str], bytes]:
        status = self._status(job)
        minutes = _int_param(query, "minutes", 60, 1, 7 * 24 * 60)
        now = self.clock()
        began = status.get("started_at") or status["created_at"]
        ended = status["finished_at"] or now
        out = []
        for minute, counters in self.stats(job, minutes, now):
            # A rate over the part of the minute the job ran: its first, last and current minutes are partial.
            seconds = max(1.0, min(minute * 60 + 60, ended) - max(minute * 60, began))
            fetched = counters.get("fetched", 0)
            statuses = {name.split(":", 1)[1]: n for name, n in counters.items() if name.startswith("status:")}
            failed = sum(n for name, n in counters.items() if name.startswith("failed:"))
            out.append({"minute": minute * 60, "fetched": fetched, "pages_per_s": round(fetched / seconds, 3),
                        "stored": counters.get("stored", 0), "failed": failed, "statuses": statuses})  # fmt: skip
        return json_response(200, {"job": job, "minutes": out})

    def _daily(self, query: dict[str, list[str]], body: _Body, job: str) -> tuple[int, dict[str, str], bytes]:
        self._status(job)
        days, limit = _int_param(query, "days", 14, 1, 3660), _int_param(query, "limit", 50, 1, 10_000)
        report = self.daily(job, days, self.clock(), query.get("host", [""])[-1] or None)
        if report is None:
            raise RequestRefused(404, f"no job {job!r}")
        hosts = report["hosts"]  # the busiest over the window first, at most `limit` of them
        busiest = sorted(hosts, key=lambda host: (-sum(day["pages_fetched"] for day in hosts[host]), host))[:limit]
        shown = {host: hosts[host] for host in busiest}
        return json_response(200, {**report, "hosts": shown, "total_hosts": len(hosts)})

    def _analyses(self, query: dict[str, list[str]], body: _Body, job: str) -> tuple[int, dict[str, str], bytes]:
        self._status(job)
        return json_response(200, {"job": job, "runs": self.analyses(job, _int_param(query, "limit", 20, 1, 500))})

    def _logs(self, query: dict[str, list[str]], body: _Body, job: str) -> tuple[int, dict[str, str], bytes]:
        self._status(job)
        node, limit = query.get("node", [""])[-1] or None, _int_param(query, "limit", 100, 1, 1000)
        try:
            entries = self.logs(job, node, query.get("level", ["DEBUG"])[-1], limit)
        except ValueError as exc:  # the level: logs() checks it and names the levels
            raise RequestRefused(400, str(exc)) from None
        return json_response(200, {"job": job, "lines": [{"id": entry_id, **fields} for entry_id, fields in entries]})

    def _queues(self, query: dict[str, list[str]], body: _Body) -> tuple[int, dict[str, str], bytes]:
        return json_response(200, {"queues": self.queues()})

    def _nodes(self, query: dict[str, list[str]], body: _Body) -> tuple[int, dict[str, str], bytes]:
        # ?hosts=1 lists the hosts each node owns (long on a big crawl); counts always
        return json_response(200, self.nodes(query.get("hosts", ["0"])[-1] in ("1", "true")))

    def _cluster_config(self, query: dict[str, list[str]], body: _Body) -> tuple[int, dict[str, str], bytes]:
        return json_response(200, {"settings": self.cluster_settings()})

    def _set_setting(self, query: dict[str, list[str]], body: _Body, name: str) -> tuple[int, dict[str, str], bytes]:
        if self.set_setting is None:
            raise RequestRefused(404, "cluster settings are not offered here")
        value = body.mapping().get("value")
        if not isinstance(value, str):
            raise InvalidTask("value", 'the body must be {"value": "<text as the VCRAWL_* variable takes it>"}')
        return json_response(200, {"name": self.set_setting(name, value), "value": value})

    def _unset_setting(self, query: dict[str, list[str]], body: _Body, name: str) -> tuple[int, dict[str, str], bytes]:
        if self.unset_setting is None:
            raise RequestRefused(404, "cluster settings are not offered here")
        return json_response(200, {"name": name, "removed": self.unset_setting(name)})

    def _resize(self, query: dict[str, list[str]], body: _Body, node: str) -> tuple[int, dict[str, str], bytes]:
        wanted = body.mapping().get("concurrency")
        if not isinstance(wanted, int) or isinstance(wanted, bool) or not 1 <= wanted <= _MOST_SLOTS:
            raise InvalidTask("concurrency", f"must be a whole number from 1 to {_MOST_SLOTS}, got {wanted!r}")
        answer = self.resize_node(node, wanted)
        if "error" in answer:
            raise RequestRefused(404 if answer.get("answered") is False else 409, str(answer["error"]))
        return json_response(200, {"node": node, **answer})

    def _status(self, job: str) -> dict[str, Any]:
        status = self.job_status(job)
        if status is None:
            raise RequestRefused(404, f"no job {job!r}")
        return status


class RequestRefused(Exception):
    """A request answered with ``status`` and ``message`` (a 4xx, or 501 for a transfer coding)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class _Body:
    """A request's body and its Content-Type."""

    data: bytes
    content_type: str

    def mapping(self) -> dict[str, Any]:
        """The body as a JSON object, or a YAML mapping (``Content-Type: application/yaml``, a job file's text).

        Raises:
            InvalidTask: ``body`` (JSON) or ``yaml`` for text that is not one or breaks a document limit.
        """
        if self.content_type.split(";", 1)[0].strip().lower() in _YAML_TYPES:
            try:
                text = self.data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RequestRefused(400, f"the body is not UTF-8: {exc}") from None
            data = parse_yaml(text, "yaml")
        else:
            data = parse_json(self.data or b"null", "body")
        if not isinstance(data, dict):
            raise InvalidTask("body", "must be a JSON object")
        return data


def _summary(status: dict[str, Any]) -> dict[str, Any]:
    keys = ("job", "state", "created_at", "finished_at", "elapsed_s", "pages_fetched", "pages_stored", "queued",
            "pending", "analysed", "records", "hosts", "cycle")  # fmt: skip
    summary = {key: status[key] for key in keys if key in status}
    summary["failed"] = sum(status.get("failed", {}).values())
    return summary


def cross_site_refusal(method: str, headers: Mapping[str, str], loopback_only: bool) -> str | None:
    """Why an ``/api/`` request must be refused as cross-site, or None (``headers`` with lower-case names).

    Browsers send ``Origin`` with every POST and PATCH (and ``Sec-Fetch-Site`` to HTTPS and loopback
    servers), and no page can set either; tools like curl send neither and are let through (with the
    token, if there is one).

    >>> cross_site_refusal("POST", {"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}, True) is None
    True
    >>> cross_site_refusal("POST", {"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:9000"}, True)
    'Origin http://127.0.0.1:9000 is not this server (127.0.0.1:8080): a page of another origin may not change jobs'
    """
    host = headers.get("host", "")
    if loopback_only and host and not _is_loopback_name(host):
        return (f"Host {host!r} is not a loopback address: without a token (--insecure-local) the API answers "
                f"only requests to 127.0.0.1, ::1 or localhost")  # fmt: skip
    if method not in _CHANGES:
        return None
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):  # none: typed by the user, no page involved
        return f"a {site} request may not change jobs (Sec-Fetch-Site: {site})"
    origin = headers.get("origin")
    if origin is not None and not _is_origin_of(origin, host):
        return f"Origin {origin} is not this server ({host}): a page of another origin may not change jobs"
    return None


def _is_loopback_name(host: str) -> bool:
    name = urlsplit("//" + host).hostname or ""
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return name == "localhost"


def _is_origin_of(origin: str, host: str) -> bool:
    """Whether ``origin`` (scheme://name[:port]) names the server the ``Host`` header names."""
    default = {"http": 80, "https": 443}
    try:
        given, own = urlsplit(origin), urlsplit(f"//{host}")
        if given.scheme not in default or not given.hostname or given.path:
            return False  # "null" (a sandboxed page or a file), or not an origin at all
        same_port = (given.port or default[given.scheme]) == (own.port or default[given.scheme])
    except ValueError:  # a port out of range
        return False
    return given.hostname == own.hostname and same_port


def _live_settings(spec: Any) -> dict[str, Any]:
    """What may change while a job runs, as the API shows it (proxy passwords masked)."""
    proxies = [masked_url(proxy) for proxy in spec.proxies] if spec.proxies is not None else None
    return {"politeness": spec.to_dict()["politeness"], "user_agents": spec.user_agents,
            "referers": spec.referers, "proxies": proxies}  # fmt: skip


def _int_param(query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name, [str(default)])[-1]
    try:
        value = int(raw)
    except ValueError:
        raise RequestRefused(400, f"{name} must be an integer, got {raw!r}") from None
    return min(max(value, low), high)


def loggable(text: str) -> str:
    r"""``text`` fit for a log line: control characters (a terminal's escape codes, line breaks) escaped.

    >>> loggable("/api/jobs/\x1b[2J\r\nFAKE")
    '/api/jobs/\\x1b[2J\\x0d\\x0aFAKE'
    """
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def json_response(status: int, payload: Any) -> tuple[int, dict[str, str], bytes]:
    """An answer with ``payload`` as its JSON body."""
    body = json.dumps(payload, sort_keys=True, default=list).encode()
    return status, {"Content-Type": "application/json", "Cache-Control": "no-store",
                    "Content-Security-Policy": _API_POLICY}, body  # fmt: skip
