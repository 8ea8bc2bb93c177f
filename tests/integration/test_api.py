"""The job API over real HTTP, on the session's Redis and worker: auth, jobs, steering, statistics."""

from __future__ import annotations

import itertools
import json
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import api_server
from tests.site import NOT_PAGES, Response, TestSite
from tests.waiting import wait_until
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")

TOKEN = "test-token-0123456789"


@pytest.fixture
def api_url(vcrawl_settings: Settings) -> Iterator[str]:
    with api_server(TOKEN) as url:
        yield url


def call(base: str, method: str, path: str, body: Any = None, token: str | None = TOKEN) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def page(*links: str) -> str:
    return "<html><body>" + "".join(f'<a href="{href}">{href}</a>' for href in links) + "</body></html>"


def wait_for(base: str, job: str, state: str, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = call(base, "GET", f"/api/jobs/{job}")
        assert status == 200
        if body["state"] == state:
            return body
        time.sleep(0.05)
    raise AssertionError(f"job {job} not {state} in {timeout_s}s: {body}")


def test_every_api_call_needs_the_token(api_url: str) -> None:
    for token in (None, "wrong"):
        status, body = call(api_url, "GET", "/api/jobs", token=token)
        assert status == 401 and "token" in body["error"]
    request = urllib.request.Request(api_url + "/openapi.json")
    with urllib.request.urlopen(request, timeout=10) as response:
        document = json.loads(response.read())
    assert document["openapi"].startswith("3.1") and "/api/jobs/{job}/pause" in document["paths"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/api/jobs", {"GET", "POST"}),
        ("PUT", "/api/jobs/some-job", {"GET"}),
        ("GET", "/api/jobs/some-job/pause", {"POST"}),
    ],
)
def test_a_method_a_path_does_not_take_gets_405_with_the_allow_header(
    api_url: str, method: str, path: str, allowed: set[str]
) -> None:
    request = urllib.request.Request(api_url + path, method=method, headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 405  # RFC 9110 §15.5.6: a 405 MUST carry Allow, the methods the path takes
    assert {name.strip() for name in refused.value.headers["Allow"].split(",")} == allowed
    assert method in json.loads(refused.value.read())["error"]


def test_a_job_is_started_watched_and_its_statistics_kept(api_url: str, site: TestSite) -> None:
    site.add_page("/", page("/a", "/b", "/missing"))
    site.add_page("/a", page())
    site.add_page("/b", page())
    status, created = call(
        api_url, "POST", "/api/jobs", {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0}}
    )
    assert status == 201
    job = created["id"]
    done = wait_for(api_url, job, "completed")
    assert done["pages_stored"] == 3 and done["statuses"] == {"200": 3, "404": 1}

    status, listed = call(api_url, "GET", "/api/jobs")
    assert status == 200 and job in [row["job"] for row in listed["jobs"]]
    status, stats = call(api_url, "GET", f"/api/jobs/{job}/stats?minutes=5")
    assert status == 200 and len(stats["minutes"]) == 5
    # The fetches' minute, not the last one: fetched at hh:mm:59 and asked at hh:mm+1, the last is empty.
    busy = [minute for minute in stats["minutes"] if minute["fetched"]]
    assert sum(m["fetched"] for m in stats["minutes"]) == 4 and busy and all(m["pages_per_s"] > 0 for m in busy)
    status, hosts = call(api_url, "GET", f"/api/jobs/{job}/hosts")
    host = site.base.split("//")[1]
    assert hosts["hosts"] == [{"host": host, "fetched": 4, "done": 4, "failed": 1, "slow": 0}]
    status, failures = call(api_url, "GET", f"/api/jobs/{job}/failures")
    assert [(f["url"], f["reason"]) for f in failures["failures"]] == [(site.url("/missing"), "http_404")]
    status, queues = call(api_url, "GET", "/api/queues")
    assert status == 200 and set(queues["queues"]) == {"download", "download.dynamic", "analysis"}
    status, nodes = call(api_url, "GET", "/api/nodes")  # no ring node in this session: the shared queue
    assert status == 200 and nodes["alive"] >= 1  # the session's worker, a member of weight 0
    assert {node["weight"] for node in nodes["nodes"]} == {0}
    assert "pytest@localhost" in {node["name"] for node in nodes["nodes"]}


def test_an_invalid_job_gets_422_naming_the_field(api_url: str) -> None:
    status, body = call(api_url, "POST", "/api/jobs", {"seeds": ["http://x.test/"], "politeness": {"per_host": 0}})
    assert status == 422 and body["field"] == "politeness.per_host"
    status, body = call(api_url, "POST", "/api/jobs", {"seeds": ["ftp://x.test/"]})
    assert status == 422 and body["field"] == "seeds[0]"
    status, body = call(api_url, "GET", "/api/jobs/no-such-job")
    assert status == 404


def test_pause_resume_and_cancel(api_url: str, site: TestSite) -> None:
    paths = [f"/p{n}" for n in range(30)]
    site.add_page("/", page(*paths))
    for path in paths:
        site.add_page(path, page())
    job = {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.1, "jitter": 0}}
    status, created = call(api_url, "POST", "/api/jobs", job)
    assert status == 201
    job_id = created["id"]
    time.sleep(0.8)
    assert call(api_url, "POST", f"/api/jobs/{job_id}/pause")[0] == 200
    # A batch that was running finishes its current URL and hands the rest back: poll for that
    # (a fixed 0.5 s was not always enough on a loaded machine).
    wait_until(lambda: call(api_url, "GET", f"/api/jobs/{job_id}")[1]["in_flight_batches"] == 0, 10.0,
               "the running batches handed back")  # fmt: skip
    during = len(site.seen)
    time.sleep(1.0)
    assert len(site.seen) == during  # nothing is fetched while paused
    assert call(api_url, "POST", f"/api/jobs/{job_id}/pause")[0] == 409
    assert call(api_url, "GET", f"/api/jobs/{job_id}")[1]["state"] == "paused"
    assert call(api_url, "POST", f"/api/jobs/{job_id}/resume")[1]["state"] == "running"
    finished = wait_for(api_url, job_id, "completed")
    fetched = [seen.path for seen in site.seen if seen.path not in NOT_PAGES]
    assert sorted(fetched) == sorted(["/", *paths]) and finished["pages_stored"] == 31  # each once

    created = call(api_url, "POST", "/api/jobs", {**job, "politeness": {"min_interval_s": 0.3}})[1]
    assert call(api_url, "POST", f"/api/jobs/{created['id']}/cancel")[1]["state"] == "cancelled"
    assert call(api_url, "POST", f"/api/jobs/{created['id']}/resume")[0] == 409


def test_live_configuration_changes_the_request_rate(api_url: str, site: TestSite) -> None:
    paths = [f"/q{n}" for n in range(80)]
    site.add_page("/", page(*paths))
    for path in paths:
        site.add_response(path, Response(page().encode()))
    job = {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.4, "jitter": 0}}
    job_id = call(api_url, "POST", "/api/jobs", job)[1]["id"]

    def gaps(window_s: float) -> list[float]:
        """The gaps between the page requests of a window, from the requests' own times.

        Counting requests in a sleep window quantizes to whole requests (6 in 3.0001 s read as
        1.9998/s in one CI run); a rate from the gaps carries the per-request overhead, which a
        loaded machine stretches (fast/slow = (0.2 + o) / (0.4 + o)). The gaps themselves do not.
        """
        before = len(site.seen)
        time.sleep(window_s)
        times = [seen.at for seen in site.seen[before:] if seen.path not in NOT_PAGES]
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    time.sleep(1.0)
    slow = gaps(3.0)
    status, body = call(api_url, "PATCH", f"/api/jobs/{job_id}/config", {"politeness": {"min_interval_s": 0.2}})
    assert status == 200 and body["politeness"]["min_interval_s"] == 0.2 and body["spec_rev"] == 1
    time.sleep(2.5)  # workers re-read a changed spec within 2 s
    fast = gaps(3.0)
    status, body = call(api_url, "PATCH", f"/api/jobs/{job_id}/config", {"proxies": ["http://u:s3cret@127.0.0.1:9/"]})
    assert status == 200 and body["proxies"] == ["http://u:***@127.0.0.1:9/"]  # credentials never echoed
    call(api_url, "POST", f"/api/jobs/{job_id}/cancel")
    # The host's next request waits the interval from the release, after the response, and the site
    # notes arrivals: no gap is shorter than the interval (0.02 s for the clocks), whatever the load.
    # The same overhead is in both medians, so their difference is the interval's 0.2 s: a change
    # not applied would give about 0.
    assert len(slow) >= 4 and len(fast) >= 4, (slow, fast)
    assert min(slow) >= 0.4 - 0.02 and min(fast) >= 0.2 - 0.02, (slow, fast)
    assert statistics.median(fast) < statistics.median(slow) - 0.1, (slow, fast)

    status, body = call(api_url, "PATCH", f"/api/jobs/{job_id}/config", {"max_depth": 9})
    assert status == 422 and body["field"] == "max_depth"
    status, body = call(api_url, "PATCH", f"/api/jobs/{job_id}/config", {"politeness": {"min_interval_s": 0.1}})
    assert status == 422 and "not running" in body["error"]
