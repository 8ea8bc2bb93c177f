"""The static fetcher against a real local server: redirects, limits, encodings, proxies."""

from __future__ import annotations

import gzip
import socket
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from fetchers import DnsCache, DnsCacheStats, FetchLimits, FetchRequest, StaticFetcher, check_status, make_session
from fetchers.limits import cluster_limits, fetch_limits
from tests.conftest import LOOPBACK_POLICY
from tests.site import Response, TestSite, header_trickle
from vcrawl.errors import DownloadFailed, FetchFailed
from vcrawl.settings import Settings

LIMITS = FetchLimits(connect_timeout_s=2, read_timeout_s=1.0, total_timeout_s=3.0, max_body_bytes=64 * 1024)


@pytest.fixture
def fetcher() -> StaticFetcher:
    return StaticFetcher(make_session(), LIMITS, policy=LOOPBACK_POLICY)


def _get(fetcher: StaticFetcher, url: str, **kwargs: str) -> object:
    return fetcher.fetch(FetchRequest(url=url, user_agent="vcrawl-test", **kwargs))


def test_relative_redirects_are_followed_and_counted(site: TestSite, fetcher: StaticFetcher) -> None:
    site.add_redirect("/a", "/b", 301)
    site.add_redirect("/b", "c", 307)
    site.add_page("/c", "done")

    result = _get(fetcher, site.url("/a"))

    assert (result.status, result.body, result.redirects) == (200, b"done", 2)
    assert result.final_url == site.url("/c") and result.url == site.url("/a")


def test_redirect_loop_stops_at_once(site: TestSite, fetcher: StaticFetcher) -> None:
    site.add_redirect("/x", "/y")
    site.add_redirect("/y", "/x")
    with pytest.raises(DownloadFailed) as failed:
        _get(fetcher, site.url("/x"))
    assert failed.value.reason == "redirect_loop"
    assert len(site.seen) == 2


def test_redirect_chain_stops_at_the_budget(site: TestSite, fetcher: StaticFetcher) -> None:
    for n in range(10):
        site.add_redirect(f"/r{n}", f"/r{n + 1}")
    with pytest.raises(DownloadFailed) as failed:
        _get(fetcher, site.url("/r0"))
    assert failed.value.reason == "too_many_redirects"
    assert len(site.seen) == LIMITS.max_redirects + 1


@pytest.mark.parametrize("location", ["javascript:alert(1)", "ftp://x.test/f", "mailto:a@b.test"])
def test_redirect_to_another_scheme_is_refused(site: TestSite, fetcher: StaticFetcher, location: str) -> None:
    site.add_redirect("/go", location)
    with pytest.raises(DownloadFailed) as failed:
        _get(fetcher, site.url("/go"))
    assert failed.value.reason == "bad_redirect"


def test_slow_drip_hits_the_total_deadline(site: TestSite, fetcher: StaticFetcher) -> None:
    # One byte every 0.5 s never trips the 1 s read timeout; the total deadline ends it.
    site.add_response("/drip", Response(chunks=[b"x"] * 40, chunk_pause_s=0.5))
    started = time.monotonic()
    with pytest.raises(FetchFailed) as failed:
        _get(fetcher, site.url("/drip"))
    assert failed.value.reason == "total_timeout"
    assert time.monotonic() - started < LIMITS.total_timeout_s + 1.5


def test_slow_drip_of_headers_hits_the_total_deadline(site: TestSite, fetcher: StaticFetcher) -> None:
    # Every byte arrives well within the read timeout; only a whole-request deadline ends it.
    headers = b"HTTP/1.1 200 OK\r\n" + b"X-Filler: " + b"z" * 200 + b"\r\n\r\n"
    site.add_response("/drip-headers", Response(raw=headers, chunk_pause_s=0.2))
    started = time.monotonic()
    with pytest.raises(FetchFailed) as failed:
        _get(fetcher, site.url("/drip-headers"))
    assert failed.value.reason == "total_timeout"
    assert time.monotonic() - started < LIMITS.total_timeout_s + 1.0


def test_a_trickled_head_is_given_up_a_floor_window_after_its_first_byte_at_the_shipped_defaults(
    site: TestSite,
) -> None:
    shipped = fetch_limits(cluster_limits(Settings()))  # 1 KiB/s over 5 s; read 15 s, total 60 s
    fetcher = StaticFetcher(make_session(), shipped, policy=LOOPBACK_POLICY)
    site.add_response("/trickle", header_trickle(2.0))
    started = time.monotonic()
    with pytest.raises(FetchFailed) as failed:
        _get(fetcher, site.url("/trickle"))
    took = time.monotonic() - started
    assert failed.value.reason == "slow_head"
    # Its first byte came at once: a window later (plus the watchdog's 0.1 s tick), not total_timeout_s.
    assert shipped.slow_window_s <= took < shipped.slow_window_s + 1.5, took
    assert len(site.requests_to("/trickle")) == 1


def test_a_head_is_held_to_the_floor_from_its_first_byte_not_from_the_request(site: TestSite) -> None:
    # A server that thinks longer than the floor's window, then answers at once, is a slow page, not a
    # tarpit: it keeps the read timeout to begin. Its head, begun, is held to the floor like a body.
    limits = replace(LIMITS, read_timeout_s=3.0, total_timeout_s=6.0, min_rate_bytes_s=1024, slow_window_s=0.5)
    fetcher = StaticFetcher(make_session(), limits, policy=LOOPBACK_POLICY)
    site.add_response("/thinks", Response(b"thought", delay_s=1.0))
    site.add_response("/trickle", header_trickle(0.2))

    assert _get(fetcher, site.url("/thinks")).body == b"thought"
    started = time.monotonic()
    with pytest.raises(FetchFailed) as failed:
        _get(fetcher, site.url("/trickle"))
    assert failed.value.reason == "slow_head" and time.monotonic() - started < 1.5


def test_a_server_that_thinks_past_the_floors_window_is_waited_for_at_the_shipped_defaults(site: TestSite) -> None:
    # The twin of the test above at the limits users run (a 5 s floor window, a 15 s read timeout):
    # an answer that takes longer than the window to begin is a slow page, fetched, not a tarpit.
    shipped = fetch_limits(cluster_limits(Settings()))
    fetcher = StaticFetcher(make_session(), shipped, policy=LOOPBACK_POLICY)
    thinking_s = shipped.slow_window_s + 1.0
    assert thinking_s < shipped.read_timeout_s
    site.add_response("/thinks", Response(b"thought", delay_s=thinking_s))
    assert _get(fetcher, site.url("/thinks")).body == b"thought"


def test_silent_server_is_a_timeout(site: TestSite, fetcher: StaticFetcher) -> None:
    site.add_response("/silent", Response(b"late", delay_s=2.0))
    with pytest.raises(FetchFailed) as failed:
        _get(fetcher, site.url("/silent"))
    assert failed.value.reason == "timeout"


@pytest.mark.long  # make test-long: 15 s each at the shipped read timeout
@pytest.mark.parametrize(
    "response",
    [
        # The twin of the test above: silence before the head.
        pytest.param(lambda read_s: Response(b"late", delay_s=read_s + 3.0), id="silent-server"),
        # The twin of test_hostile_sites' lying Content-Length held open: a body that stops short and
        # goes silent. (The rate floor counts bytes as they come: silence is the timeout's.)
        pytest.param(
            lambda read_s: Response(chunks=[b"only this", b""], chunk_pause_s=read_s + 3.0,
                                    headers={"Content-Length": "5000"}),
            id="short-body",
        ),
    ],
)
def test_silence_is_a_timeout_at_the_shipped_read_timeout(
    site: TestSite, response: Callable[[float], Response]
) -> None:
    # At the limits users run: silence past the read timeout (15 s) ends the request then, as a
    # timeout (retried), not at the total deadline (60 s).
    shipped = fetch_limits(cluster_limits(Settings()))
    fetcher = StaticFetcher(make_session(), shipped, policy=LOOPBACK_POLICY)
    site.add_response("/silence", response(shipped.read_timeout_s))
    started = time.monotonic()
    with pytest.raises(FetchFailed) as failed:
        _get(fetcher, site.url("/silence"))
    assert failed.value.reason == "timeout"
    assert shipped.read_timeout_s <= time.monotonic() - started < shipped.read_timeout_s + 2.0


def test_connection_refused_is_retryable(fetcher: StaticFetcher) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(FetchFailed) as failed:
        _get(fetcher, f"http://127.0.0.1:{port}/")
    assert failed.value.reason == "connection_error"


@pytest.mark.parametrize("wire", [True, False], ids=["own wire", "requests' adapters"])
def test_a_name_that_does_not_resolve_fails_retryably_as_dns_error(wire: bool) -> None:
    def no_such_name(host: str, *args: object) -> list:  # what getaddrinfo raises for an NXDOMAIN
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    session = make_session(resolver=DnsCache(no_such_name))
    if not wire:  # a session without vcrawl's wire (a plug-in's): requests sends through the guarded adapters
        del session.wire
    fetcher = StaticFetcher(session, LIMITS, policy=LOOPBACK_POLICY)
    with pytest.raises(FetchFailed) as failed:  # the crawl of named hosts (test_dns_crawl.py) uses a real server
        _get(fetcher, "http://gone.test/")
    assert failed.value.reason == "dns_error"


def test_gzip_body_is_decoded(site: TestSite, fetcher: StaticFetcher) -> None:
    site.add_page("/z", gzip.compress(b"<p>hello</p>"), Content_Encoding="gzip")
    assert _get(fetcher, site.url("/z")).body == b"<p>hello</p>"


def test_compression_bomb_is_capped(site: TestSite, fetcher: StaticFetcher) -> None:
    bomb = gzip.compress(b"\0" * (50 * 1024 * 1024))  # 50 MiB that travel as ~50 KiB
    site.add_page("/bomb", bomb, Content_Encoding="gzip")
    with pytest.raises(DownloadFailed) as failed:
        _get(fetcher, site.url("/bomb"))
    assert failed.value.reason == "too_large"


def test_body_shorter_than_its_content_length_is_incomplete(site: TestSite, fetcher: StaticFetcher) -> None:
    site.add_response("/short", Response(chunks=[b"only this"], headers={"Content-Length": "5000"}))
    with pytest.raises(FetchFailed) as failed:
        _get(fetcher, site.url("/short"))
    assert failed.value.reason == "incomplete_body"


def test_a_cut_body_asked_to_be_kept_comes_back_truncated(site: TestSite, fetcher: StaticFetcher) -> None:
    site.add_response("/short", Response(chunks=[b"only this"], headers={"Content-Length": "5000"}))
    result = fetcher.fetch(FetchRequest(url=site.url("/short"), user_agent="vcrawl-test", keep_cut_body=True))
    assert (result.status, result.body, result.truncated) == (200, b"only this", True)
    site.add_page("/whole", b"all of it")  # a body that is whole is not truncated
    whole = fetcher.fetch(FetchRequest(url=site.url("/whole"), user_agent="vcrawl-test", keep_cut_body=True))
    assert (whole.body, whole.truncated) == (b"all of it", False)


def test_request_goes_through_the_proxy(fetcher: StaticFetcher) -> None:
    # A forward proxy receives the absolute URL as the request target.
    with TestSite() as proxy:
        proxy.add_page("http://shop.test/item", "via proxy")
        result = _get(fetcher, "http://shop.test/item", proxy=proxy.base)
    assert result.body == b"via proxy"
    assert result.ip == ""  # the connection went to the proxy: the server's address is not known here
    assert proxy.seen[0].headers["User-Agent"] == "vcrawl-test"


def test_connections_to_one_name_share_one_lookup_through_the_cache(site: TestSite) -> None:
    lookups: list[str] = []

    def counting_getaddrinfo(host: str, *args: object) -> list:
        lookups.append(host)
        return socket.getaddrinfo(host, *args)  # type: ignore[arg-type]

    cache = DnsCache(counting_getaddrinfo)
    site.add_page("/p", "by name")
    url = site.url("/p").replace("127.0.0.1", "localhost")  # /etc/hosts: no DNS server needed
    for _ in range(2):  # two sessions, so two connections, each resolving once (from the cache)
        result = _get(StaticFetcher(make_session(resolver=cache), LIMITS, policy=LOOPBACK_POLICY), url)
        assert (result.body, result.ip) == (b"by name", "127.0.0.1")

    assert lookups == ["localhost"]
    assert cache.stats() == DnsCacheStats(lookups=1, hits=1, failures=0, names=1)
    assert len(site.seen) == 2


def test_the_address_is_that_of_the_response_returned(site: TestSite, fetcher: StaticFetcher) -> None:
    site.add_page("/end", "here")
    with TestSite("127.0.0.2") as first:
        first.add_redirect("/start", site.url("/end"))
        followed = _get(fetcher, first.url("/start"))
        unfollowed = StaticFetcher(make_session(), replace(LIMITS, follow_redirects=False), policy=LOOPBACK_POLICY)
        redirect = _get(unfollowed, first.url("/start"))

    assert (followed.status, followed.redirects, followed.ip) == (200, 1, "127.0.0.1")  # the last hop's server
    assert (redirect.status, redirect.ip) == (302, "127.0.0.2")


@pytest.mark.parametrize(
    ("status", "headers", "error", "reason", "retry_after"),
    [
        (404, {}, DownloadFailed, "http_404", None),
        (403, {}, DownloadFailed, "http_403", None),
        (410, {}, DownloadFailed, "http_410", None),
        (204, {}, DownloadFailed, "http_204", None),
        (500, {}, FetchFailed, "http_500", None),
        (503, {"Retry-After": "7"}, FetchFailed, "http_503", 7.0),
        (429, {"Retry-After": "junk"}, FetchFailed, "http_429", None),
    ],
)
def test_status_classes(
    site: TestSite,
    fetcher: StaticFetcher,
    status: int,
    headers: dict[str, str],
    error: type[Exception],
    reason: str,
    retry_after: float | None,
) -> None:
    site.add_response("/s", Response(b"", status, headers))
    result = _get(fetcher, site.url("/s"))
    with pytest.raises(error) as raised:
        check_status(result)
    assert raised.value.reason == reason
    assert getattr(raised.value, "retry_after_s", None) == retry_after


@pytest.mark.parametrize(
    "target",
    ["/foo%2zbar", "/a[b]|c", "/x%7e%2f", "/q?", "/q?a=%zz&b=[1]", "/%E2%82%AC?%e2%82%ac"],
)
def test_the_request_line_carries_the_url_as_written(site: TestSite, fetcher: StaticFetcher, target: str) -> None:
    # What a browser sends for these (the WHATWG serialisation); requests and urllib3 would send
    # /foo%252zbar, /a%5Bb%5D%7Cc, /x%7E%2F, /q, ...
    site.add_page(target, "here")
    result = _get(fetcher, site.url(target))
    assert result.status == 200
    assert [seen.path for seen in site.seen] == [target]
