"""Several clusters behind one server, without sockets: the NAME=URL entries, URLs shown without passwords, the
per-cluster scope of ``tasks.deps``, and the ``/api/clusters`` routes over plain functions."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import tasks
from api.monitor import ClusterRoutes, Monitor, summarize
from api.server import JobApi
from tasks import deps
from vcrawl.errors import ClusterDown, ConfigError
from vcrawl.settings import Settings
from vcrawl.targets.clusters import cluster_urls, parse_cluster_entries, shown_url

TOKEN = "unit-test-token-0123456789"


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ("a=redis://r1:6379/0", ["a"]),
        ("a=redis://r1:6379/0, b-2=rediss://:pw@r2:6380/1", ["a", "b-2"]),
        ("a=redis://r1:6379/0\nb_x=unix:///run/redis.sock?db=2", ["a", "b_x"]),
        ('["a=redis://r1:6379/0", "b=redis://r2:6379/0"]', ["a", "b"]),
    ],
)
def test_cluster_entries_are_read_from_the_variable(raw: str, names: list[str]) -> None:
    assert list(cluster_urls(parse_cluster_entries("VCRAWL_MONITOR_CLUSTERS", raw), "V")) == names


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        (["a"], "must be NAME=URL"),
        (["a="], "must be NAME=URL"),
        (["-a=redis://r1"], "the name '-a'"),
        (["a b=redis://r1"], "the name 'a b'"),
        (["a=http://:pw-secret@r1/"], "must be redis://, rediss:// or unix://, got 'http://:***@r1/'"),
        (["a=redis://r1", "a=redis://:pw-secret@r2"], "the name 'a' is given twice"),
        (["own=redis://r1"], "this server's own cluster"),
    ],
)
def test_bad_cluster_entries_are_refused_naming_the_source_and_hiding_passwords(
    entries: list[str], problem: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        cluster_urls(entries, "--cluster", taken=["own"])
    assert problem in str(raised.value) and str(raised.value).startswith("--cluster: ")
    assert "pw-secret" not in str(raised.value)


def test_the_settings_read_the_clusters_and_never_show_their_urls() -> None:
    settings = Settings.from_env({"VCRAWL_MONITOR_CLUSTERS": "eu=redis://:pw-secret@r1:6379/0,us=redis://r2/0"})
    assert settings.monitor_clusters == ("eu=redis://:pw-secret@r1:6379/0", "us=redis://r2/0")
    assert "pw-secret" not in repr(settings)
    assert Settings.from_env(settings.to_env()).monitor_clusters == settings.monitor_clusters
    with pytest.raises(ConfigError, match="VCRAWL_MONITOR_CLUSTERS: the name"):
        Settings.from_env({"VCRAWL_MONITOR_CLUSTERS": "=redis://r1"})


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@r1:6379/0", "redis://:***@r1:6379/0"),
        ("rediss://user:pw@r1:6379/0", "rediss://user:***@r1:6379/0"),
        ("redis://pw@r1:6379/0", "redis://***@r1:6379/0"),
        ("redis://r1:6379/0", "redis://r1:6379/0"),
        ("unix:///run/r.sock?db=1&password=pw", "unix:///run/r.sock?db=1&password=%2A%2A%2A"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_a_cluster_scope_has_its_own_settings_and_clients_in_its_thread_only() -> None:
    own_client = deps.redis_client()  # made lazily: no connection yet
    other = tasks.ClusterClient.named("b", "redis://:pw@127.0.0.9:6390/2", deps.settings())
    assert other.settings.redis_url == "redis://:pw@127.0.0.9:6390/2" and other.settings.redis_password == ""
    assert other.settings.frontier_url is None and other.shown_url == "redis://:***@127.0.0.9:6390/2"
    seen: dict[str, Any] = {}

    def read() -> None:
        seen["settings"], seen["client"], seen["app"] = deps.settings(), deps.redis_client(), deps.celery_app()
        seen["same"] = deps.redis_client() is seen["client"]
        outside = threading.Thread(target=lambda: seen.setdefault("outside", deps.redis_client()))
        outside.start()
        outside.join(5)

    other.call(read)
    assert seen["settings"] is other.settings and seen["same"]
    assert seen["client"] is not own_client and seen["client"].connection_pool.connection_kwargs["port"] == 6390
    assert seen["app"] is not tasks.app and seen["app"].conf.broker_url.endswith("127.0.0.9:6390/2")
    assert seen["outside"] is own_client  # another thread is not in the scope
    assert deps.redis_client() is own_client and deps.celery_app() is tasks.app
    other.close()


def test_a_redis_error_in_a_call_is_cluster_down_without_the_password() -> None:
    other = tasks.ClusterClient.named("b", "redis://:pw-secret@127.0.0.9:6390/0", deps.settings())

    def fails() -> None:
        raise RedisConnectionError("Error connecting to redis://:pw-secret@127.0.0.9:6390/0 (pw-secret)")

    with pytest.raises(ClusterDown) as raised:
        other.call(fails)
    assert raised.value.cluster == "b" and "pw-secret" not in str(raised.value)
    assert "redis://:***@127.0.0.9:6390/0" in raised.value.reason


# The routes, over plain functions: each "cluster" is a dict of jobs.


def _api(jobs: dict[str, dict[str, Any]], clusters: Any = None) -> JobApi:
    def start(spec: Any) -> str:
        job = f"job-{len(jobs) + 1}"
        jobs[job] = {"job": job, "state": "running", "created_at": 0.0, "finished_at": None}
        return job

    return JobApi(token=TOKEN, start_job=start, job_status=jobs.get, jobs=lambda limit: list(jobs)[:limit],
                  cancel=lambda job: False, pause=lambda job: False, resume=lambda job: None,
                  reconfigure=lambda job, changes: None, failures=lambda job, limit: [], host_stats=lambda job: {},
                  stats=lambda job, minutes, now: [], queues=lambda: {"download": len(jobs)},
                  clusters=clusters)  # fmt: skip


def _routes(name: str, jobs: dict[str, dict[str, Any]], down: list[str | None]) -> ClusterRoutes:
    api = _api(jobs)

    def summary(limit: int) -> dict[str, Any]:
        return summarize(api.jobs, lambda job: jobs[job]["state"], api.queues, lambda hosts: {"nodes": []}, limit)

    return ClusterRoutes(name, f"redis://{name}/0", api, lambda: down[0], summary)


def _ask(api: JobApi, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, Any]:
    read = {"called": False}

    def read_body() -> bytes:
        read["called"] = True
        return body

    status, _, payload = api.handle(method, path, {"Authorization": f"Bearer {TOKEN}", **headers}, read_body)
    return status, {**json.loads(payload), "body_read": read["called"]}


def test_the_cluster_routes_act_on_the_cluster_named_and_today_s_on_the_default() -> None:
    east: dict[str, dict[str, Any]] = {}
    west: dict[str, dict[str, Any]] = {}
    west_down: list[str | None] = [None]
    routes = {"east": _routes("east", east, [None]), "west": _routes("west", west, west_down)}
    api = _api(east, Monitor(routes, "east").answer)

    assert _ask(api, "POST", "/api/clusters/west/jobs", b"{}")[0] == 201
    assert list(west) == ["job-1"] and east == {}
    assert _ask(api, "POST", "/api/jobs", b"{}")[0] == 201 and list(east) == ["job-1"]
    status, listing = _ask(api, "GET", "/api/clusters")
    assert status == 200 and listing["default"] == "east"
    assert [(c["name"], c["up"], c["jobs"]["states"], c["queues"]) for c in listing["clusters"]] == [
        ("east", True, {"running": 1}, {"download": 1}),
        ("west", True, {"running": 1}, {"download": 1}),
    ]
    assert _ask(api, "GET", "/api/clusters/west")[1]["url"] == "redis://west/0"
    assert _ask(api, "GET", "/api/clusters/north/jobs")[0] == 404
    assert _ask(api, "POST", "/api/clusters")[0] == 405
    assert _ask(api, "GET", "/api/clusters?limit=x")[0] == 400

    west_down[0] = "ConnectionError: refused"
    status, answer = _ask(api, "POST", "/api/clusters/west/jobs", b"{}")
    assert status == 503 and answer["error"] == "cluster west is down: ConnectionError: refused"
    assert not answer["body_read"] and list(west) == ["job-1"]
    listed = {c["name"]: c for c in _ask(api, "GET", "/api/clusters")[1]["clusters"]}
    assert listed["west"]["up"] is False and listed["west"]["error"] == "ConnectionError: refused"
    assert listed["east"]["up"] is True


def test_the_cluster_routes_refuse_cross_site_and_tokenless_requests() -> None:
    routes = {"east": _routes("east", {}, [None])}
    api = _api({}, Monitor(routes, "east").answer)
    host = {"Host": "127.0.0.1:8080"}
    status, answer = _ask(api, "POST", "/api/clusters/east/jobs", b"{}", Origin="http://evil.test", **host)
    assert status == 403 and not answer["body_read"]
    status, _, _ = api.handle("GET", "/api/clusters", {}, lambda: b"")
    assert status == 401


def test_a_cluster_that_fails_mid_call_or_answers_too_late_is_listed_down() -> None:
    release = threading.Event()

    def slow(limit: int) -> dict[str, Any]:
        release.wait(10)
        return {}

    def failing(limit: int) -> dict[str, Any]:
        raise ClusterDown("bad", "TimeoutError: Timeout reading from socket")

    ok = _routes("ok", {}, [None])
    routes = {"ok": ok, "slow": ClusterRoutes("slow", "redis://slow/0", ok.api, lambda: None, slow),
              "bad": ClusterRoutes("bad", "redis://bad/0", ok.api, lambda: None, failing)}  # fmt: skip
    try:
        listing = {c["name"]: c for c in Monitor(routes, "ok", list_deadline_s=0.3).listing(10)}
    finally:
        release.set()
    assert listing["ok"]["up"] and listing["slow"] == {"name": "slow", "url": "redis://slow/0", "default": False,
                                                       "up": False, "error": "no answer within 0.3 s"}  # fmt: skip
    assert listing["bad"]["error"] == "TimeoutError: Timeout reading from socket" and not listing["bad"]["up"]


def test_the_api_description_has_every_route_under_each_cluster_too() -> None:
    from api.openapi import openapi_document

    paths = openapi_document()["paths"]
    own = [path for path in paths if path.startswith("/api/") and not path.startswith("/api/clusters")]
    for path in own:
        scoped = paths["/api/clusters/{cluster}" + path.removeprefix("/api")]
        for operation in scoped.values():
            assert operation["parameters"][0]["name"] == "cluster" and "503" in operation["responses"]
    assert "503" not in paths["/api/jobs"]["post"]["responses"]  # today's routes are described as they were
    assert set(paths["/api/clusters"]) == {"get"} and set(paths["/api/clusters/{cluster}"]) == {"get"}
