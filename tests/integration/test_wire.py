"""fetchers.wire against real loopback servers that send scripted bytes: reuse, framing, limits, time, policy, TLS."""

from __future__ import annotations

import contextlib
import gzip
import os
import resource
import ssl
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fetchers.netguard import BlockedAddress, NetworkPolicy, applying, connections_opened, parse_networks
from fetchers.wire import MAX_HEAD_BYTES, MAX_HEADERS, Budget, Connections, WireError, WireResponse
from tests.scripted_server import Peer, Script, ScriptedServer, answering, echoing_target
from tests.scripted_server import http_response as _response
from tests.tls_files import make_tls_files
from tests.waiting import wait_until

LOOPBACK = NetworkPolicy(allowed=parse_networks(["127.0.0.0/8"]))  # the default policy refuses loopback
Serve = Callable[..., ScriptedServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[ScriptedServer] = []

    def start(*scripts: Script, tls: ssl.SSLContext | None = None) -> ScriptedServer:
        servers.append(ScriptedServer(scripts, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def pool() -> Iterator[Connections]:
    connections = Connections()
    yield connections
    connections.close()


def _budget(total_s: float = 60, **changes: float) -> Budget:
    """The shipped limits (fetchers.base.FetchLimits), as a test changes them."""
    values = {"connect_s": 5, "read_s": 15, "head_rate": 1024, "head_window_s": 5, **changes}
    return Budget(deadline=time.monotonic() + total_s, **values)


def _get(pool: Connections, url: str, budget: Budget | None = None, **headers: str) -> WireResponse:
    with applying(LOOPBACK):
        return pool.get(url, headers, budget or _budget())


def _read_all(response: WireResponse, n: int = 65536) -> bytes:
    pieces = []
    for _ in range(10_000):
        if not (piece := response.read1(n)):
            return b"".join(pieces)
        pieces.append(piece)
    raise AssertionError("the body did not end")


def _fails(reason: str, call: Callable[[], object]) -> None:
    with pytest.raises(WireError) as failed:
        call()
    assert failed.value.reason == reason, failed.value


def test_two_gets_to_one_origin_share_one_connection_and_send_the_target_as_written(
    serve: Serve, pool: Connections
) -> None:
    server = serve(echoing_target)
    opened = connections_opened()

    first = _read_all(_get(pool, server.url("/a%2zb[c]?"), Accept="*/*"))
    second = _read_all(_get(pool, server.url("/second?x=1#fragment")))

    assert (first, second) == (b"/a%2zb[c]?", b"/second?x=1")
    assert connections_opened() - opened == 1 and server.accepts == 1
    line, *fields = server.requests[0].decode("latin-1").split("\r\n")
    assert line == "GET /a%2zb[c]? HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}" in fields and "Accept: */*" in fields


def test_a_connection_is_reused_by_a_process_holding_over_a_thousand_descriptors(
    serve: Serve, pool: Connections
) -> None:
    # select() refuses descriptors past 1,024: a busy worker's idle connections would all look dropped.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if max(soft, hard) < 1200:
        pytest.skip(f"the descriptor limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    spare = []
    try:
        with open("/dev/null") as null:
            spare = [os.dup(null.fileno()) for _ in range(1100)]
        server = serve(echoing_target)
        opened = connections_opened()
        bodies = [_read_all(_get(pool, server.url(f"/{n}"))) for n in range(3)]
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert bodies == [b"/0", b"/1", b"/2"]
    assert connections_opened() - opened == 1 and server.accepts == 1


def test_the_answer_time_is_the_servers_as_the_kernel_stamped_it(serve: Serve, pool: Connections) -> None:
    def slow(peer: Peer) -> None:
        for _ in range(5):
            if peer.request() is None or not peer.pause(0.3) or not peer.send(_response(b"late")):
                return

    server = serve(slow)
    response = _get(pool, server.url("/slow"))
    _read_all(response)

    # What engine.pump.inflight_cap reads: the server's 0.3 s, not the wall time around the fetch.
    assert response.answer_s is not None and 0.25 <= response.answer_s <= 0.45, response.answer_s


@pytest.mark.parametrize("closed_on_request", [False, True], ids=["closed_after_its_response", "closed_on_request"])
def test_a_kept_alive_connection_the_server_closed_is_replaced_without_an_error(
    serve: Serve, pool: Connections, closed_on_request: bool
) -> None:
    def once(peer: Peer) -> None:
        if peer.request() is not None and peer.send(_response(b"one")) and closed_on_request:
            peer.request()  # the next request arrives, then the connection closes unanswered

    server = serve(once, answering(_response(b"two")))
    assert _read_all(_get(pool, server.url("/1"))) == b"one"
    if not closed_on_request:
        wait_until(lambda: server.finished == 1, 2, "the server's close")
    opened = connections_opened()

    response = _get(pool, server.url("/2"))

    assert (response.status_code, _read_all(response)) == (200, b"two")
    assert server.accepts == 2 and connections_opened() - opened == 1


def test_a_head_with_bare_line_feeds_is_read_trimmed_joined_and_lower_cased(serve: Serve, pool: Connections) -> None:
    head = b"HTTP/1.1 200 OK\nContent-Length: 2\nX-Spaced:   padded value  \nSet-Cookie: a=1\nSET-COOKIE: b=2\n\n"
    server = serve(answering(head + b"ok"))

    response = _get(pool, server.url())

    assert (response.status_code, response.reason, _read_all(response)) == (200, "OK", b"ok")
    assert response.headers == {"content-length": "2", "x-spaced": "padded value", "set-cookie": "a=1, b=2"}


OVERSIZED_HEAD = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n"
OVERFULL_HEAD = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % n for n in range(MAX_HEADERS + 1)) + b"\r\n"
GARBLED_HEAD = b"SPDY/9 ok maybe\r\n\r\n"  # llhttp refuses the status line: a bad_response too


@pytest.mark.parametrize("raw", [OVERSIZED_HEAD, OVERFULL_HEAD, GARBLED_HEAD], ids=["oversized", "overfull", "garbled"])
def test_an_oversized_overfull_or_garbled_head_is_a_bad_response(serve: Serve, pool: Connections, raw: bytes) -> None:
    server = serve(answering(raw))
    _fails("bad_response", lambda: _get(pool, server.url()))


def test_a_body_without_a_length_ends_when_the_server_closes(serve: Serve, pool: Connections) -> None:
    body = bytes(range(256)) * 1000  # 256 KB: several reads

    def script(peer: Peer) -> None:
        if peer.request() is not None and peer.send(_response(length=False)) and peer.pause(0.05):
            peer.send(body)

    response = _get(pool, serve(script).url())
    assert _read_all(response) == body


def test_a_body_cut_short_of_its_content_length_is_incomplete(serve: Serve, pool: Connections) -> None:
    server = serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\nonly this", then_close=True))
    response = _get(pool, server.url())
    _fails("incomplete_body", lambda: _read_all(response))


def _deflated(data: bytes, wbits: int) -> bytes:
    packer = zlib.compressobj(wbits=wbits)
    return packer.compress(data) + packer.flush()


PAGE = b"<p>hello, wire</p>" * 500


def test_a_broken_chunk_is_the_bodys_fault_however_the_segments_fall(serve: Serve, pool: Connections) -> None:
    # Head and broken chunk in one write: parsed in one feed, still an incomplete body, not a bad head.
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    with pytest.raises(WireError) as failed:
        _read_all(_get(pool, serve(answering(raw)).url()))
    assert failed.value.reason == "incomplete_body"


@pytest.mark.parametrize(
    ("raw"),
    [
        _response(b"", "Transfer-Encoding: chunked", length=False)
        + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (PAGE[:7], PAGE[7:4000], PAGE[4000:]))
        + b"0\r\n\r\n",
        _response(gzip.compress(PAGE), "Content-Encoding: gzip"),
        _response(_deflated(PAGE, zlib.MAX_WBITS), "Content-Encoding: deflate"),
        _response(_deflated(PAGE, -zlib.MAX_WBITS), "Content-Encoding: deflate"),  # raw, as some servers send
        _response(gzip.compress(PAGE), "Content-Encoding: identity, gzip"),
    ],
    ids=["chunked", "gzip", "deflate", "raw_deflate", "identity_and_gzip"],
)
def test_chunked_and_compressed_bodies_are_decoded(serve: Serve, pool: Connections, raw: bytes) -> None:
    response = _get(pool, serve(answering(raw)).url())
    assert _read_all(response, 1000) == PAGE


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip.compress(b"\0" * (50 * 1024 * 1024), compresslevel=1)  # 50 MiB that travel as ~220 KiB


def test_a_gzip_bomb_gives_at_most_n_bytes_per_read1(serve: Serve, pool: Connections, bomb: bytes) -> None:
    response = _get(pool, serve(answering(_response(bomb, "Content-Encoding: gzip"))).url())

    sizes = [len(response.read1(4096)) for _ in range(5)]
    response.close()

    assert all(0 < size <= 4096 for size in sizes), sizes


@pytest.mark.parametrize("codings", ["gzip, gzip", "gzip, deflate"])
def test_a_body_compressed_twice_is_refused_as_a_bad_encoding(
    serve: Serve, pool: Connections, bomb: bytes, codings: str
) -> None:
    # A decoder feeding another cannot be held to read1's n (a bomb inside a bomb): one coding only.
    server = serve(answering(_response(gzip.compress(bomb), f"Content-Encoding: {codings}")))
    with pytest.raises(WireError) as failed:
        _get(pool, server.url())
    assert failed.value.reason == "bad_encoding"


def test_a_long_chain_of_content_codings_costs_no_more_memory_than_a_few_decoders(
    serve: Serve, pool: Connections
) -> None:
    # Every coding named gets a zlib decoder before a byte of body is read; urllib3 (2.6 on) refuses
    # more than 5 codings for this reason (CVE-2025-66418).
    chain = ", ".join(["gzip"] * 40_000)  # ~240 KB: a head under MAX_HEAD_BYTES
    server = serve(answering(_response(gzip.compress(b"plain"), f"Content-Encoding: {chain}")))
    tracemalloc.start()
    try:
        with contextlib.suppress(WireError):  # refused or undecoded: either is fine, the cost is the point
            _read_all(_get(pool, server.url()))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak // 2**20} MiB"


@pytest.mark.parametrize("interim", [b"100 Continue", b"103 Early Hints"])
def test_an_interim_response_is_skipped_for_the_final_one(serve: Serve, pool: Connections, interim: bytes) -> None:
    def script(peer: Peer) -> None:
        if peer.request() is not None and peer.send(b"HTTP/1.1 " + interim + b"\r\nX-Interim: yes\r\n\r\n"):
            if peer.pause(0.05):  # the final response in another read
                peer.send(_response(b"final", "X-Final: yes"))

    response = _get(pool, serve(script).url())

    assert (response.status_code, response.reason, _read_all(response)) == (200, "OK", b"final")
    assert response.headers == {"x-final": "yes", "content-length": "5"}


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/a b", {}),
        ("/ok", {"X-Evil": "a\r\nInjected: 1"}),
        ("/ok", {"X-Evil": "a\nInjected: 1"}),
        ("/ok", {"Bad Name": "v"}),
    ],
    ids=["space_in_target", "crlf_in_value", "lf_in_value", "space_in_name"],
)
def test_a_request_that_would_break_its_framing_is_refused_before_anything_is_sent(
    serve: Serve, pool: Connections, target: str, headers: dict[str, str]
) -> None:
    server = serve(echoing_target)
    opened = connections_opened()

    _fails("bad_request", lambda: _get(pool, server.url(target), **headers))

    time.sleep(0.1)  # room for bytes that should not come
    assert (server.accepts, server.received, connections_opened()) == (0, b"", opened)


def _trickling_head(peer: Peer) -> None:
    if peer.request() is None or not peer.send(b"HTTP/1.1 200 OK\r\n"):
        return
    for n in range(30):
        if not peer.pause(1.0) or not peer.send(b"X-Trickle-%d: y\r\n" % n):
            return


def test_a_trickled_head_is_given_up_a_floor_window_after_its_first_byte(serve: Serve, pool: Connections) -> None:
    # The shipped rate (1 KiB/s) over a 2 s window instead of 5 s: the same floor, sooner. One line a
    # second never trips the read timeout (15 s); only the floor ends it.
    server = serve(_trickling_head)
    started = time.monotonic()
    _fails("slow_head", lambda: _get(pool, server.url(), _budget(head_window_s=2)))
    took = time.monotonic() - started
    assert 2 <= took < 3, took


@pytest.mark.slow
def test_a_trickled_head_is_given_up_at_the_shipped_floor_window(serve: Serve, pool: Connections) -> None:
    # The twin of the test above at the limits users run (5 s window, 15 s read, 60 s total).
    server = serve(_trickling_head)
    started = time.monotonic()
    _fails("slow_head", lambda: _get(pool, server.url()))
    took = time.monotonic() - started
    assert 5 <= took < 6, took


@pytest.mark.parametrize("total_s", [2.0, pytest.param(60.0, marks=[pytest.mark.slow, pytest.mark.long], id="shipped")])
def test_a_dripping_body_is_given_up_at_the_total_deadline(serve: Serve, pool: Connections, total_s: float) -> None:
    # 2 s: the rule, sooner; 60 s: the shipped total. A byte every 0.5 s never trips the read timeout (15 s).
    def script(peer: Peer) -> None:
        if peer.request() is None or not peer.send(_response(b"", "Content-Length: 1000", length=False)):
            return
        for _ in range(1000):
            if not peer.pause(0.5) or not peer.send(b"x"):
                return

    server = serve(script)
    started = time.monotonic()
    response = _get(pool, server.url(), _budget(total_s=total_s))
    _fails("total_timeout", lambda: _read_all(response, 1))
    took = time.monotonic() - started
    assert total_s <= took < total_s + 0.5, took


def test_a_silent_server_is_a_timeout_after_the_read_timeout(serve: Serve, pool: Connections) -> None:
    # A 1 s read timeout instead of 15 s: the same rule, sooner.
    def silent(peer: Peer) -> None:
        if peer.request() is not None:
            peer.pause(10)

    server = serve(silent)
    started = time.monotonic()
    _fails("timeout", lambda: _get(pool, server.url(), _budget(read_s=1)))
    took = time.monotonic() - started
    assert 1 <= took < 1.5, took


def test_a_kept_alive_connection_is_not_reused_by_a_request_whose_policy_refuses_its_address(
    serve: Serve, pool: Connections
) -> None:
    server = serve(echoing_target)
    assert _read_all(_get(pool, server.url("/allowed"))) == b"/allowed"

    with pytest.raises(BlockedAddress):
        pool.get(server.url("/refused"), {}, _budget())  # the default policy: public addresses only

    wait_until(lambda: server.finished == 1, 2, "the kept-alive connection's close")
    assert server.accepts == 1 and [head.split(b" ")[1] for head in server.requests] == [b"/allowed"]


def test_an_unfinished_response_closed_drops_its_connection_and_a_finished_one_is_kept(
    serve: Serve, pool: Connections
) -> None:
    big = b"y" * 300_000  # more than one read: the response cannot have arrived whole with its head
    server = serve(answering(_response(big)))
    opened = connections_opened()

    unfinished = _get(pool, server.url("/1"))
    assert unfinished.read1(10) == b"y" * 10
    unfinished.close()
    assert _read_all(_get(pool, server.url("/2"))) == big
    assert _read_all(_get(pool, server.url("/3"))) == big

    assert server.accepts == 2 and connections_opened() - opened == 2
    assert len(server.requests) == 3


def test_bytes_after_a_complete_response_neither_change_it_nor_get_its_connection_reused(
    serve: Serve, pool: Connections
) -> None:
    # A broken (or hostile) server answers one request twice, in one write.
    server = serve(answering(_response(b"ok") + _response(b"nope", status="404 Not Found")))

    response = _get(pool, server.url("/1"))
    seen = (response.status_code, response.reason, response.headers, _read_all(response))
    _read_all(_get(pool, server.url("/2")))

    assert seen == (200, "OK", {"content-length": "2"}, b"ok")
    assert server.accepts == 2


@pytest.fixture
def tls_server(serve: Serve, tmp_path: Path) -> tuple[ScriptedServer, Path]:
    files = make_tls_files(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    return serve(echoing_target, tls=context), files.ca


def test_https_is_verified_against_the_given_ca_and_kept_alive(tls_server: tuple[ScriptedServer, Path]) -> None:
    server, ca = tls_server
    pool = Connections(ca_file=str(ca))
    try:
        bodies = [_read_all(_get(pool, server.url(f"/tls{n}"))) for n in range(2)]
    finally:
        pool.close()
    assert bodies == [b"/tls0", b"/tls1"] and server.accepts == 1


def test_https_to_a_certificate_outside_the_bundle_is_a_tls_error(
    tls_server: tuple[ScriptedServer, Path], pool: Connections
) -> None:
    server, _ = tls_server
    _fails("tls_error", lambda: _get(pool, server.url()))
    assert server.requests == []
