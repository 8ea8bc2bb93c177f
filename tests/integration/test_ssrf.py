"""SSRF guard against real loopback servers and real Chromium: refused addresses get no connection.

The session allows 127.0.0.0/8 and ::1 (tests/conftest.py); these tests build fetchers with
narrower policies, down to the default (public addresses only), and check both the reason
(``blocked_address``) and that the refused server saw no connection at all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fetchers import (
    BrowserConfig,
    BrowserFetcher,
    FetchLimits,
    FetchRequest,
    NetworkPolicy,
    StaticFetcher,
    make_session,
)
from fetchers.netguard import PUBLIC_ONLY, parse_networks
from tests.cluster import REPO
from tests.integration.conftest import run_job
from tests.site import TestSite
from vcrawl.errors import DownloadFailed

LIMITS = FetchLimits(connect_timeout_s=2, read_timeout_s=2, total_timeout_s=5, max_body_bytes=64 * 1024)


def allowing(*networks: str) -> NetworkPolicy:
    return NetworkPolicy(allowed=parse_networks(networks))


def fetch(fetcher: StaticFetcher | BrowserFetcher, url: str, **kwargs: Any) -> Any:
    return fetcher.fetch(FetchRequest(url=url, user_agent="vcrawl-test", **kwargs))


def blocked(fetcher: StaticFetcher | BrowserFetcher, url: str, **kwargs: Any) -> None:
    with pytest.raises(DownloadFailed) as failed:
        fetch(fetcher, url, **kwargs)
    assert failed.value.reason == "blocked_address", failed.value


class Tripwire:
    """A listening socket that only counts the connections it accepts (any protocol)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(16)
        self._sock.settimeout(0.1)
        self.port: int = self._sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # timeout: look at the stop flag again
                continue
            self.connections += 1
            conn.close()

    def __enter__(self) -> Tripwire:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


class ScriptedResolver:
    """A scripted resolver, standing in for DNS (no real DNS can be used here): one answer per call."""

    def __init__(self, *answers: list[str]) -> None:
        self._answers = list(answers)
        self.calls: list[str] = []

    def __call__(self, host: str, port: int, *args: Any) -> list[tuple[Any, ...]]:
        self.calls.append(host)
        answer = self._answers[min(len(self.calls), len(self._answers)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in answer]


# --- static fetches --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    [
        "http://127.0.0.1:{port}/",
        "http://localhost:{port}/",
        "http://[::ffff:127.0.0.1]:{port}/",
        "http://2130706433:{port}/",  # decimal
        "http://0x7f.1:{port}/",  # hex, short form
        "http://0177.0.0.1:{port}/",  # octal
        "https://127.0.0.1:{port}/",
    ],
)
def test_loopback_in_any_spelling_is_refused_by_default(spelling: str) -> None:
    with Tripwire("127.0.0.1") as wire:
        blocked(StaticFetcher(make_session(), LIMITS), spelling.format(port=wire.port))
    assert wire.connections == 0


def test_ipv6_loopback_is_refused_by_default() -> None:
    with Tripwire("::1") as wire:
        blocked(StaticFetcher(make_session(), LIMITS), f"http://[::1]:{wire.port}/")
    assert wire.connections == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3/",
        "http://192.168.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://0.0.0.0:80/",
        "http://[fd00::1]/",
        "http://[fe80::1]/",
        "http://[::ffff:169.254.169.254]/",
    ],
)
def test_private_link_local_and_metadata_addresses_are_refused_without_a_connection(url: str) -> None:
    started = time.monotonic()
    blocked(StaticFetcher(make_session(), LIMITS), url)
    assert time.monotonic() - started < 1.0  # refused before any connect (a real one would time out)


def test_a_redirect_to_a_refused_address_is_refused() -> None:
    with TestSite("127.0.0.2") as allowed, TestSite("127.0.0.3") as refused:
        refused.add_page("/secret", "internal")
        allowed.add_redirect("/go", refused.url("/secret"))
        blocked(StaticFetcher(make_session(), LIMITS, policy=allowing("127.0.0.2/32")), allowed.url("/go"))
    assert [seen.path for seen in allowed.seen] == ["/go"]
    assert refused.seen == []


def test_a_job_list_cannot_widen_the_cluster_list() -> None:
    with TestSite("127.0.0.2") as inside, TestSite("127.0.0.3") as outside:
        inside.add_page("/", "in")
        outside.add_page("/", "out")
        fetcher = StaticFetcher(make_session(), LIMITS, policy=allowing("127.0.0.2/32"))
        job_networks = parse_networks(["127.0.0.0/8"])
        assert fetch(fetcher, inside.url("/"), networks=job_networks).body == b"in"
        blocked(fetcher, outside.url("/"), networks=job_networks)
    assert outside.seen == []


def test_a_kept_alive_connection_obeys_the_next_requests_narrower_policy() -> None:
    with TestSite("127.0.0.2") as site:
        site.add_page("/", "page")
        fetcher = StaticFetcher(make_session(), LIMITS, policy=allowing("127.0.0.0/8"))
        assert fetch(fetcher, site.url("/")).body == b"page"
        blocked(fetcher, site.url("/"), networks=parse_networks(["10.0.0.0/8"]))
        assert fetch(fetcher, site.url("/")).body == b"page"
    assert len(site.seen) == 2


def test_dns_rebinding_one_resolution_and_the_connection_goes_to_the_checked_address() -> None:
    # The scripted resolver answers the allowed address first and a refused one on any later call.
    with TestSite("127.0.0.2") as good:
        port = int(good.base.rsplit(":", 1)[1])
        with TestSite("127.0.0.3", port) as evil:
            good.add_page("/", "public page")
            evil.add_page("/", "internal page")
            resolver = ScriptedResolver(["127.0.0.2"], ["127.0.0.3"])
            fetcher = StaticFetcher(make_session(resolver=resolver), LIMITS, policy=allowing("127.0.0.2/32"))

            result = fetch(fetcher, f"http://rebind.test:{port}/")

            assert result.body == b"public page"
            assert resolver.calls == ["rebind.test"]  # resolved once: no second lookup to rebind
            assert [seen.headers["Host"] for seen in good.seen] == [f"rebind.test:{port}"]
            # A new connection resolves again and now gets the refused address: refused, never sent.
            blocked(StaticFetcher(make_session(resolver=resolver), LIMITS, policy=allowing("127.0.0.2/32")),
                    f"http://rebind.test:{port}/")  # fmt: skip
        assert evil.seen == []


def test_refused_addresses_of_a_name_are_dropped_and_a_permitted_one_is_used() -> None:
    with TestSite("127.0.0.2") as good, Tripwire("127.0.0.3") as evil:
        good.add_page("/", "ok")
        port = int(good.base.rsplit(":", 1)[1])
        resolver = ScriptedResolver(["127.0.0.3", "127.0.0.2"])
        fetcher = StaticFetcher(make_session(resolver=resolver), LIMITS, policy=allowing("127.0.0.2/32"))
        assert fetch(fetcher, f"http://mixed.test:{port}/").body == b"ok"
    assert evil.connections == 0


def test_through_a_proxy_the_target_is_checked_and_a_jobs_proxy_must_be_allowed() -> None:
    with TestSite() as proxy:
        proxy.add_page("http://shop.test/item", "via proxy")
        trusted = NetworkPolicy(trusted_proxies=frozenset({proxy.base.removeprefix("http://")}))
        fetcher = StaticFetcher(make_session(), LIMITS, policy=trusted)
        # The cluster's proxy is trusted; a target name that does not resolve here is left to it.
        assert fetch(fetcher, "http://shop.test/item", proxy=proxy.base).body == b"via proxy"
        blocked(fetcher, "http://127.0.0.3:8080/admin", proxy=proxy.base)  # a literal refused target
        # A proxy that is not the cluster's (a job's) is an address like any other: refused here.
        blocked(StaticFetcher(make_session(), LIMITS), "http://shop.test/item", proxy=proxy.base)
    assert [seen.path for seen in proxy.seen] == ["http://shop.test/item"]


# --- crawl jobs (the session's worker: the cluster allows 127.0.0.0/8 and ::1) ----------------


def test_a_job_narrowed_to_one_host_refuses_another_and_a_robots_redirect_there(worker: object) -> None:
    with TestSite("127.0.0.2") as allowed, TestSite("127.0.0.3") as refused:
        refused.add_page("/robots.txt", "User-agent: *\nDisallow: /\n")
        refused.add_page("/", "internal")
        allowed.add_redirect("/robots.txt", refused.url("/robots.txt"))
        allowed.add_page("/", "<a href='/a.html'>a</a>")
        allowed.add_page("/a.html", "a")

        status = run_job({"seeds": [allowed.url("/"), refused.url("/")], "politeness": {"min_interval_s": 0},
                          "allowed_networks": ["127.0.0.2/32"]})  # fmt: skip

    assert status["state"] == "completed"
    assert status["pages_stored"] == 2  # robots.txt unavailable (its redirect refused): allow all
    assert status["failed"] == {"blocked_address": 1}
    assert refused.seen == []


@pytest.mark.slow
def test_the_cli_cluster_list_is_the_ceiling_and_allow_network_widens_it(tmp_path: Path) -> None:
    with TestSite("127.0.0.2") as two, TestSite("127.0.0.3") as three, TestSite("127.0.0.4") as four:
        for site in (two, three, four):
            site.add_page("/", "a page")
        job_file = tmp_path / "job.json"
        job_file.write_text(json.dumps({"seeds": [two.url("/"), three.url("/"), four.url("/")],
                                        "allowed_networks": ["127.0.0.0/8"]}))  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}
        done = subprocess.run(
            [sys.executable, "-m", "cli", "crawl", "--job", str(job_file), "--allow-network", "127.0.0.4/32",
             "--delay", "0", "--workers", "1", "--threads", "4", "--data", str(tmp_path / "data"), "--json"],
            env={**env, "PYTHONPATH": str(REPO), "VCRAWL_ALLOWED_NETWORKS": "127.0.0.2/32"},
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["pages_stored"] == 2 and summary["failed"] == {"blocked_address": 1}
    assert three.seen == []  # the job listed 127.0.0.0/8, but the cluster never allowed 127.0.0.3
    assert two.seen and four.seen


def test_a_bad_allowed_networks_setting_stops_the_cli_naming_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}
    done = subprocess.run(
        [sys.executable, "-m", "cli", "crawl", "http://example.test/", "--data", str(tmp_path)],
        env={**env, "PYTHONPATH": str(REPO), "VCRAWL_ALLOWED_NETWORKS": "10.0.0.0/33"},
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "VCRAWL_ALLOWED_NETWORKS" in done.stderr
    bad_flag = subprocess.run(
        [sys.executable, "-m", "cli", "crawl", "http://example.test/", "--allow-network", "nope"],
        env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad_flag.returncode == 2 and "not a CIDR network" in bad_flag.stderr


# --- the browser ------------------------------------------------------------------------------

BROWSER = BrowserConfig(page_timeout_s=5.0, lazy_timeout_s=3.0, idle_s=0.3)


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserFetcher]:
    missing = [p for p in (BROWSER.chromium_path, BROWSER.chromedriver_path) if not os.access(p, os.X_OK)]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"headless Chromium is required in CI; missing: {missing}")
        pytest.skip(f"no browser here ({missing})")
    fetcher = BrowserFetcher(BROWSER, policy=allowing("127.0.0.2/32"))
    yield fetcher
    fetcher.close()


@pytest.mark.browser
def test_a_pages_requests_to_refused_addresses_never_leave(browser: BrowserFetcher) -> None:
    with TestSite("127.0.0.2") as allowed, Tripwire("127.0.0.3") as refused, Tripwire("::1") as refused6:
        target, target6 = f"127.0.0.3:{refused.port}", f"[::1]:{refused6.port}"
        allowed.add_page(
            "/",
            f"""<p id="p">page</p>
            <img src="http://{target}/pixel.png"><img src="https://{target}/tls.png">
            <iframe src="http://{target6}/frame"></iframe>
            <script>
              fetch("http://{target}/api").catch(function () {{}});
              fetch("http://{target6}/api6").catch(function () {{}});
              var x = new XMLHttpRequest(); x.open("GET", "http://{target}/xhr"); x.send();
              try {{ new WebSocket("ws://{target}/ws"); }} catch (e) {{}}
            </script>""",
        )

        result = fetch(browser, allowed.url("/"))

    assert result.status == 200 and b'id="p"' in result.body
    assert refused.connections == 0 and refused6.connections == 0


@pytest.mark.browser
def test_navigating_to_a_refused_address_is_blocked_address(browser: BrowserFetcher) -> None:
    with TestSite("127.0.0.2") as allowed, Tripwire("127.0.0.3") as refused:
        allowed.add_redirect("/go", f"http://127.0.0.3:{refused.port}/")
        allowed.add_page("/after", "<p>still works</p>")
        blocked(browser, f"http://127.0.0.3:{refused.port}/")
        blocked(browser, f"https://127.0.0.3:{refused.port}/")
        blocked(browser, allowed.url("/go"))
        blocked(browser, f"http://2130706435:{refused.port}/")  # 127.0.0.3, spelt in decimal
        assert b"still works" in fetch(browser, allowed.url("/after")).body  # the same browser goes on
    assert refused.connections == 0


@pytest.mark.browser
def test_a_request_narrowed_by_its_job_is_held_to_it_in_the_browser(browser: BrowserFetcher) -> None:
    with TestSite("127.0.0.2") as site:
        site.add_page("/", "<p>page</p>")
        blocked(browser, site.url("/"), networks=parse_networks(["127.0.0.9/32"]))
        assert fetch(browser, site.url("/")).status == 200
    assert len(site.requests_to("/")) == 1


@pytest.mark.browser
def test_the_browsers_upstream_proxy_gets_only_allowed_targets(browser: BrowserFetcher) -> None:
    with TestSite() as proxy:
        proxy.add_page("http://shop.test/", "<p>through the proxy</p>")
        trusted = NetworkPolicy(trusted_proxies=frozenset({proxy.base.removeprefix("http://")}))
        fetcher = BrowserFetcher(BROWSER, policy=trusted)
        try:
            assert b"through the proxy" in fetch(fetcher, "http://shop.test/", proxy=proxy.base).body
            blocked(fetcher, "http://127.0.0.3:8080/", proxy=proxy.base)
        finally:
            fetcher.close()
    paths = [seen.path for seen in proxy.seen]
    assert "http://shop.test/" in paths and all(path.startswith("http://shop.test/") for path in paths)


@pytest.mark.browser
def test_the_egress_guard_closes_with_the_browser(browser: BrowserFetcher) -> None:
    fetcher = BrowserFetcher(BROWSER, policy=PUBLIC_ONLY)
    try:
        blocked(fetcher, "http://127.0.0.1:8080/")
        guard = fetcher._guard
        assert guard is not None
        port = int(guard.url.rsplit(":", 1)[1])
    finally:
        fetcher.close()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


# --- the egress guard on its own (what Chromium sends it) ----------------------------------------


def _exchange(guard_url: str, data: bytes) -> bytes:
    port = int(guard_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
            if data.startswith(b"CONNECT") and b"\r\n\r\n" in b"".join(chunks):
                break  # a tunnel stays open: the caller goes on through it
        return b"".join(chunks)


def test_the_guard_tunnels_and_forwards_to_allowed_addresses_only() -> None:
    from fetchers.egress import EgressGuard

    guard = EgressGuard(allowing("127.0.0.2/32")).start()
    try:
        with TestSite("127.0.0.2") as allowed, Tripwire("127.0.0.3") as refused:
            allowed.add_page("/x", "through the guard")
            forwarded = _exchange(guard.url, f"GET {allowed.url('/x')} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert forwarded.startswith(b"HTTP/1.1 200") and forwarded.endswith(b"through the guard")
            assert b"Connection: close" in forwarded
            assert _exchange(guard.url, f"GET http://127.0.0.3:{refused.port}/ HTTP/1.1\r\n\r\n".encode()) == b""
            assert _exchange(guard.url, f"CONNECT 127.0.0.3:{refused.port} HTTP/1.1\r\n\r\n".encode()).startswith(
                b"HTTP/1.1 403"
            )
            assert guard.was_refused(f"https://127.0.0.3:{refused.port}/")
            port = int(guard.url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(f"CONNECT {allowed.base.removeprefix('http://')} HTTP/1.1\r\n\r\n".encode())
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
                sock.sendall(b"GET /x HTTP/1.1\r\nHost: 127.0.0.2\r\nConnection: close\r\n\r\n")
                tunnelled = b""
                while chunk := sock.recv(65536):
                    tunnelled += chunk
            assert tunnelled.endswith(b"through the guard")
            guard.begin(allowing("127.0.0.2/32"))
            assert not guard.was_refused(f"https://127.0.0.3:{refused.port}/")  # forgotten for the next page
        assert refused.connections == 0
        assert [seen.path for seen in allowed.seen] == ["/x", "/x"]
    finally:
        guard.close()


class TunnellingProxy:
    """An upstream proxy that only tunnels (CONNECT), one connection at a time; records request heads."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.url = f"http://user:pw@127.0.0.1:{self._sock.getsockname()[1]}"
        self.heads: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536 and (byte := conn.recv(1)):
                    head += byte
                self.heads.append(head.decode("latin-1"))
                host, port = head.split(b" ")[1].decode().rsplit(":", 1)
                with socket.create_connection((host, int(port)), timeout=5) as origin:
                    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    origin.sendall(conn.recv(65536))
                    while chunk := origin.recv(65536):
                        conn.sendall(chunk)

    def __enter__(self) -> TunnellingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sock.close()


def test_the_guard_tunnels_through_its_upstream_proxy_with_its_credentials() -> None:
    from fetchers.egress import EgressGuard

    with TunnellingProxy() as upstream, TestSite("127.0.0.2") as allowed, Tripwire("127.0.0.3") as refused:
        allowed.add_page("/x", "tunnelled")
        policy = NetworkPolicy(allowed=parse_networks(["127.0.0.2/32"]),
                               trusted_proxies=frozenset({upstream.url.rsplit("@", 1)[1]}))  # fmt: skip
        guard = EgressGuard(policy, upstream=upstream.url).start()
        try:
            port = int(guard.url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(f"CONNECT {allowed.base.removeprefix('http://')} HTTP/1.1\r\n\r\n".encode())
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
                sock.sendall(b"GET /x HTTP/1.1\r\nHost: 127.0.0.2\r\nConnection: close\r\n\r\n")
                tunnelled = b""
                while chunk := sock.recv(65536):
                    tunnelled += chunk
            refused_answer = _exchange(guard.url, f"CONNECT 127.0.0.3:{refused.port} HTTP/1.1\r\n\r\n".encode())
        finally:
            guard.close()
    assert tunnelled.endswith(b"tunnelled")
    assert refused_answer.startswith(b"HTTP/1.1 403") and refused.connections == 0
    [head] = upstream.heads  # the refused target never reached the upstream proxy
    assert head.startswith(f"CONNECT {allowed.base.removeprefix('http://')} HTTP/1.1")
    assert "Proxy-Authorization: Basic dXNlcjpwdw==" in head
