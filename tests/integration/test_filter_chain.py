"""A job's filter_chain in real crawls: the session's Redis and worker, a loopback site, the test plug-in filter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

import tasks
from tests.cluster import REPO
from tests.integration.conftest import api_server, redis_env, run_job
from tests.site import TestSite, link_page
from tests.waiting import wait_until
from vcrawl.errors import InvalidTask
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")

FAST = {"min_interval_s": 0.0}
BUILTINS = ["scope", "deny", "allow", "suffix", "trap"]

# The links of the site's home page: one for each thing a filter may say about it.
LINKS = {
    "trap": "/a/a/trap.html",  # a segment repeated right after itself: the default trap filter drops it
    "pdf": "/doc.pdf",  # a suffix the default drops
    "json": "/data.json",  # a suffix the default keeps
    "plain": "/plain.html",
    "private": "/private/p.html",  # scope.deny
    "private_pdf_query": "/private/q.pdf?a=1&b=2",  # deny, suffix and the plug-in (max 1) would each drop it
    "private_query": "/private/r.html?a=1&b=2",  # deny and the plug-in would each drop it
}


def _crawl(site: TestSite, **job: Any) -> tuple[dict[str, Any], list[str]]:
    site.add_page("/", link_page(*LINKS.values()))
    for path in LINKS.values():
        site.add_page(path, link_page())
    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": False,
                      "scope": {"deny": ["/private/"]}, **job})  # fmt: skip
    assert status["state"] == "completed", status
    fetched = sorted(seen.path for seen in site.seen if seen.path not in ("/", "/robots.txt"))
    return status, fetched


def _paths(*names: str) -> list[str]:
    return sorted(LINKS[name] for name in names)


def _listed(status: dict[str, Any]) -> list[str]:
    return [entry["name"] for entry in status["filter_chain"]]


def test_without_the_key_the_chain_is_the_builtins_as_before(site: TestSite) -> None:
    status, fetched = _crawl(site)

    assert fetched == _paths("json", "plain")
    assert status["filtered"] == {"trap": 1, "suffix": 1, "deny": 3}
    assert _listed(status) == BUILTINS
    assert all(entry["params"] == {} for entry in status["filter_chain"])


def test_a_chain_without_trap_admits_a_trap_shaped_url(site: TestSite) -> None:
    status, fetched = _crawl(site, filter_chain=[{"name": "deny"}, {"name": "allow"}, {"name": "suffix"}])

    assert fetched == _paths("trap", "json", "plain")
    assert status["filtered"] == {"suffix": 1, "deny": 3}
    assert _listed(status) == ["scope", "deny", "allow", "suffix"]


def test_suffix_with_its_own_list_drops_what_the_default_keeps_and_keeps_what_it_drops(site: TestSite) -> None:
    suffix = {"name": "suffix", "params": {"suffixes": [".json"]}}
    status, fetched = _crawl(site, filter_chain=[{"name": "deny"}, suffix, {"name": "trap"}])

    assert fetched == _paths("pdf", "plain")  # .pdf fetched, .json not
    assert status["filtered"] == {"suffix": 1, "trap": 1, "deny": 3}
    assert status["filter_chain"][2] == suffix


PLUGIN = {"name": "max-query-params", "params": {"max": 1}}
# The chain, then how the three /private/ links are counted: the first filter in the chain that drops one wins.
ORDERS = [
    ([{"name": "suffix"}, PLUGIN, {"name": "deny"}], {"suffix": 1, "too_many_params": 1, "deny": 1}),
    ([{"name": "deny"}, PLUGIN, {"name": "suffix"}], {"deny": 3}),
    ([PLUGIN, {"name": "deny"}, {"name": "suffix"}], {"too_many_params": 2, "deny": 1}),
]


@pytest.mark.parametrize(("chain", "private"), ORDERS, ids=["suffix-plugin-deny", "deny-plugin-suffix", "plugin-first"])
def test_the_chain_runs_in_the_order_written_with_a_plugin_in_the_middle(
    site: TestSite, chain: list[dict[str, Any]], private: dict[str, int]
) -> None:
    status, fetched = _crawl(site, filter_chain=chain)

    assert fetched == _paths("trap", "json", "plain")  # no trap filter in these chains
    assert status["filtered"] == {**private, "suffix": private.get("suffix", 0) + 1}  # and /doc.pdf
    assert _listed(status) == ["scope", *(entry["name"] for entry in chain)]


def test_a_bad_chain_is_refused_at_submit_and_nothing_is_recorded() -> None:
    job_id = "filter-chain-refused"
    with pytest.raises(InvalidTask) as refused:
        tasks.start_job({"id": job_id, "seeds": ["http://127.0.0.1:9/"],
                         "filter_chain": [{"name": "deny"}, {"name": "trap"}, {"name": "no-such"}]})  # fmt: skip

    assert refused.value.field == "filter_chain[2].name"
    assert "max-query-params" in refused.value.problem  # the installed plug-in is named among the choices
    assert tasks.job_status(job_id, with_outputs=False) is None


API_TOKEN = "chain-token-0123456789"


def _api(base: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"}
    request = urllib.request.Request(base + path, data, headers, method=method)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def test_the_chain_shows_in_the_api_and_the_cli_status(site: TestSite, vcrawl_settings: Settings) -> None:
    site.add_page("/", link_page("/a/a/x.html"))
    site.add_page("/a/a/x.html", link_page())
    chain = [{"name": "suffix", "params": {"keep": [".pdf"]}}, PLUGIN]
    with api_server(API_TOKEN) as base:
        job = _api(base, "POST", "/api/jobs", {"seeds": [site.url("/")], "politeness": FAST, "sitemaps": False,
                                               "filter_chain": chain})["id"]  # fmt: skip
        shown = wait_until(lambda: (body := _api(base, "GET", f"/api/jobs/{job}"))["state"] != "running" and body,
                           30.0, f"job {job} ended", poll_s=0.05)  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}, "PYTHONPATH": str(REPO),
           **redis_env(vcrawl_settings)}  # fmt: skip
    as_text, as_json = (
        subprocess.run([sys.executable, "-m", "cli", "status", job, *extra], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=60)
        for extra in ((), ("--json",))
    )  # fmt: skip

    assert shown["state"] == "completed" and shown["filter_chain"] == [{"name": "scope", "params": {}}, *chain]
    assert shown["pages_stored"] == 2  # no trap filter: /a/a/x.html fetched
    assert as_text.returncode == 0, as_text.stderr
    assert 'filter_chain  scope, suffix {"keep": [".pdf"]}, max-query-params {"max": 1}' in as_text.stdout
    assert json.loads(as_json.stdout)["filter_chain"] == shown["filter_chain"]
