"""The OpenAPI 3.1 description of the job API (served at ``/openapi.json``)."""

from __future__ import annotations

from typing import Any

__all__ = ["openapi_document"]

_ERROR = {"type": "object", "properties": {"error": {"type": "string"}, "field": {"type": "string"}}}


def _op(
    summary: str,
    ok: str = "200",
    body: str | None = None,
    params: list[dict[str, Any]] | None = None,
    errors: tuple[str, ...] = ("401", "404"),
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {ok: {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}},
    }
    if body is not None:  # the body's own refusals (docs/security.md, "Limits")
        errors = tuple(sorted({*errors, "400", "408", "413"}))
    for code in errors:
        operation["responses"][code] = {
            "description": {
                "400": "a malformed body: its Content-Length or chunks, or YAML that is not UTF-8",
                "401": "no or wrong bearer token",
                "403": "a cross-site request (Origin or Sec-Fetch-Site), or a non-loopback Host without a token",
                "404": "no such job",
                "408": "the request took longer than the server's request timeout (10 s)",
                "409": "not in that state",
                "503": "the cluster does not answer (its Redis is down): `error` says why, `cluster` which",
                "413": "a body over the server's cap (1 MiB)",
                "422": "invalid: `field` names the bad key, or the document breaks a limit (depth, size, numbers, "
                "YAML aliases and merge keys)",
            }[code],
            "content": {"application/json": {"schema": _ERROR}},
        }
    if body is not None:
        schema = {"type": "object", "description": body}
        operation["requestBody"] = {
            "required": True,
            # YAML: the text of a job file, as the dashboard's job form sends it.
            "content": {"application/json": {"schema": schema}, "application/yaml": {"schema": schema}},
        }
    if params:
        operation["parameters"] = params
    return operation


_SETTING = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"},
            "description": "VCRAWL_READ_TIMEOUT_S or read_timeout_s"}
_JOB_ID = {"name": "job", "in": "path", "required": True, "schema": {"type": "string"}}

_CLUSTER = {"name": "cluster", "in": "path", "required": True, "schema": {"type": "string"}}

_HOST = {"name": "host", "in": "query", "required": False, "schema": {"type": "string"}}


def _query(name: str, default: int) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": "integer", "default": default}}


def _text(name: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": "string"}}


def openapi_document() -> dict[str, Any]:
    """The API's description: the routes on the server's own cluster, and each under ``/api/clusters/{cluster}``."""
    document = _own_cluster_document()
    paths = document["paths"]
    for path, operations in list(paths.items()):
        scoped = {}
        for method, operation in operations.items():
            responses = {**operation["responses"], "503": _op("", errors=("503",))["responses"]["503"]}
            params = [_CLUSTER, *operation.get("parameters", [])]
            scoped[method] = {**operation, "summary": operation["summary"] + " (on the cluster named)",
                              "parameters": params, "responses": responses}  # fmt: skip
        paths["/api/clusters/{cluster}" + path.removeprefix("/api")] = scoped
    listing = "The clusters this server watches: up or down (with the error), jobs by state, queues, nodes"
    paths["/api/clusters"] = {"get": _op(listing, params=[_query("limit", 100)], errors=("401",))}
    paths["/api/clusters/{cluster}"] = {"get": _op("One cluster's entry in the list", params=[_CLUSTER])}
    return document


def _own_cluster_document() -> dict[str, Any]:
    job = [_JOB_ID]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "vcrawl job API",
            "version": "1",
            "description": "Crawl jobs: start, watch, steer. Every /api/ call needs a bearer token.",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/api/jobs": {
                "get": _op("List jobs, newest first", params=[_query("limit", 50)], errors=("401",)),
                "post": _op(
                    "Start a job (the same keys as a job file)", ok="201", body="a job", errors=("401", "403", "422")
                ),
            },
            "/api/jobs/{job}": {"get": _op("State and counters, as `vcrawl status --json`", params=job)},
            "/api/jobs/{job}/cancel": {
                "post": _op("Stop dispatching for good", params=job, errors=("401", "403", "404", "409"))
            },
            "/api/jobs/{job}/pause": {
                "post": _op("Stop dispatching until resumed", params=job, errors=("401", "403", "404", "409"))
            },
            "/api/jobs/{job}/resume": {
                "post": _op("Dispatch a paused job again", params=job, errors=("401", "403", "404", "409"))
            },
            "/api/jobs/{job}/config": {
                "patch": _op(
                    "Change politeness, user_agents, referers or proxies of a running job",
                    params=job,
                    body='e.g. {"politeness": {"min_interval_s": 0.5}}',
                    errors=("401", "403", "404", "422"),
                ),
                "get": _op("The settings a running job may change, as they are now (passwords masked)", params=job),
            },
            "/api/jobs/{job}/failures": {
                "get": _op("Recent final failures with reasons", params=[_JOB_ID, _query("limit", 50)])
            },
            "/api/jobs/{job}/hosts": {
                "get": _op("Pages fetched and failures per host, busiest first", params=[_JOB_ID, _query("limit", 20)])
            },
            "/api/jobs/{job}/stats": {
                "get": _op("Per-minute fetch counters and pages/s", params=[_JOB_ID, _query("minutes", 60)])
            },
            "/api/jobs/{job}/daily": {
                "get": _op(
                    "Per UTC day: pages fetched and stored, bytes, failures by reason, new/changed pages; per host too",
                    params=[_JOB_ID, _query("days", 14), _query("limit", 50), _HOST],
                )
            },
            "/api/jobs/{job}/analyses": {
                "get": _op(
                    "The job's batch analysis and replay runs, newest first: state, chunks mapped, result location",
                    params=[_JOB_ID, _query("limit", 20)],
                )
            },
            "/api/jobs/{job}/logs": {
                "get": _op(
                    "The job's last lines in the cluster log stream, oldest first, from a level on, of a node",
                    params=[_JOB_ID, _query("limit", 100), _text("level"), _text("node")],
                )
            },
            "/api/queues": {"get": _op("Messages waiting in the download and analysis queues", errors=("401",))},
            "/api/nodes": {
                "get": _op(
                    "The workers: weight, alive, hosts owned (?hosts=1: which), pages/s, last heartbeat, pool size, "
                    "fetch statistics (requests, successes, failures, hosts, bytes, bandwidth, recent minutes)",
                    errors=("401",),
                )
            },
            "/api/config": {
                "get": _op("Every VCRAWL_* setting: value, source (default, environment, cluster), live or why not",
                           errors=("401",))
            },
            "/api/config/{name}": {
                "put": _op("Set a live setting for the whole cluster; every worker takes it up within seconds",
                           params=[_SETTING], body='{"value": "<text as the VCRAWL_* variable takes it>"}'),
                "delete": _op("Drop the cluster's value: each node's environment or default applies again",
                              params=[_SETTING]),
            },
            "/api/nodes/{node}/concurrency": {
                "post": _op(
                    "Grow or shrink a running worker's pool (its tasks at once)",
                    params=[{"name": "node", "in": "path", "required": True, "schema": {"type": "string"}}],
                    body='{"concurrency": N}, N from 1 to 1024',
                    errors=("401", "403", "404", "409", "422"),
                )
            },
        },
    }
