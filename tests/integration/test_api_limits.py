"""Hostile requests against a real ``vcrawl -v serve`` process at its shipped limits (docs/security.md, "Limits").

Each probe must be answered with a 4xx (a 501 for a transfer coding the server does not implement)
within seconds and grow the server's resident memory by less than 50 MB; the server must go on
answering. The probes are the rows of issue 33's security pass: bodies before authentication,
broken framing, YAML bombs, deep nesting, huge numbers, stalled bodies, too many connections,
framing by another origin, tokens in the log.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import tasks
from api import HttpLimits
from tests.cluster import REPO, cluster_env
from tests.ports import free_port
from tests.waiting import wait_until
from vcrawl.settings import Settings

TOKEN = "limits-token-0123456789abcdef"
LIMITS = HttpLimits()  # what `vcrawl serve` runs with: the probes hold at the shipped defaults
MAX_GROWTH_MB = 50
ANSWER_S = 5.0  # "within seconds"


@dataclass
class Served:
    url: str
    port: int
    pid: int
    log: Path

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def served(vcrawl_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``vcrawl -v serve`` with a token, on the session's Redis, logging to a file; stopped by PID."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    port = free_port()
    env = {**cluster_env(vcrawl_settings), "VCRAWL_API_TOKEN": TOKEN}
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "cli", "-v", "serve", "--port", str(port)],
                                   env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_until(lambda: _answers(port), 30, "vcrawl serve answers")
        yield Served(f"http://127.0.0.1:{port}", port, process.pid, log)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def raw(port: int, head: bytes, body: Iterable[bytes] = (), read_s: float = 20.0) -> tuple[int | None, bytes]:
    """Send a raw request (the head, then the body's pieces, as far as the server takes them); return
    the answer's status (None: no answer) and its bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_s) as sock:
        sock.sendall(head)
        for piece in body:
            try:
                sock.sendall(piece)
            except OSError:  # the server answered and stopped reading
                break
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except OSError:
            pass
    try:
        return int(data.split(b" ", 2)[1]), data
    except (IndexError, ValueError):
        return None, data


def post(served: Served, body: bytes, content_type: str, token: str | None = TOKEN) -> tuple[int, dict]:
    request = urllib.request.Request(served.url + "/api/jobs", data=body, method="POST",
                                     headers={"Content-Type": content_type})  # fmt: skip
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def head(served: Served, method: str, *lines: str) -> bytes:
    lines = (f"{method} /api/jobs HTTP/1.1", f"Host: 127.0.0.1:{served.port}", *lines, "", "")
    return "\r\n".join(lines).encode()


def probe(served: Served, send: Callable[[], tuple[int | None, object]]) -> tuple[int | None, object, float, float]:
    """Run one hostile request: (status, answer, seconds, server memory growth in MB)."""
    before = served.rss_mb()
    started = time.monotonic()
    status, answer = send()
    return status, answer, time.monotonic() - started, served.rss_mb() - before


MB = 1024 * 1024
ANCHORED = b"x: &s " + b"A" * 600_000 + b"\nseeds: [" + b",".join([b"*s"] * 90_000) + b"]\n"  # ~870 KB


def framed(*lines: str, body: Iterable[bytes] = ()) -> Callable[[Served], tuple[int | None, bytes]]:
    """A raw POST /api/jobs with these header lines and body pieces."""
    return lambda served: raw(served.port, head(served, "POST", *lines), body)


def posted(body: bytes, content_type: str = "application/yaml") -> Callable[[Served], tuple[int, dict]]:
    """A POST /api/jobs with the token, this body and Content-Type."""
    return lambda served: post(served, body, content_type)


BEARER = f"Authorization: Bearer {TOKEN}"
SEED = b"seeds: [http://127.0.0.1:9/]\n"


@pytest.mark.parametrize(
    ("name", "send", "statuses"),
    [
        ("content-length -1 and 50 MB without a token",
         framed("Content-Length: -1", body=(b"A" * MB for _ in range(50))), {401}),
        ("200 MB declared without a token",
         framed("Content-Length: 209715200", body=(b"A" * MB for _ in range(200))), {401}),
        ("200 MB declared with the token",
         framed(BEARER, "Content-Length: 209715200", body=(b"A" * MB for _ in range(200))), {413}),
        ("2 MB chunked with the token",
         framed(BEARER, "Transfer-Encoding: chunked", body=[b"100000\r\n" + b"A" * MB + b"\r\n"] * 2), {413}),
        ("content-length not a number", framed(BEARER, "Content-Length: abc"), {400}),
        ("content-length given twice, differently",
         framed(BEARER, "Content-Length: 2", "Content-Length: 3", body=[b"{}"]), {400}),
        ("content-length and chunked",
         framed(BEARER, "Content-Length: 5", "Transfer-Encoding: chunked", body=[b"0\r\n\r\n"]), {400}),
        ("a malformed chunk", framed(BEARER, "Transfer-Encoding: chunked", body=[b"zz\r\nabc\r\n0\r\n\r\n"]), {400}),
        ("a body cut short", framed(BEARER, "Content-Length: 1000", body=[b"{}"]), {400}),
        ("a transfer coding other than chunked (501, as RFC 9112 asks)",
         framed(BEARER, "Transfer-Encoding: gzip", body=[b"x"]), {501}),
        ("self-referencing YAML alias (45 bytes)", posted(b"seeds: &s [http://127.0.0.1:9/, *s]\n"), {422}),
        ("a 600 KB string aliased 90,000 times", posted(ANCHORED), {422}),
        ("YAML merge key repeating a key", posted(SEED + b"max_pages: 5\n<<: {max_pages: 7}\n"), {422}),
        ("JSON nested 500,000 deep", posted(b"[" * 500_000 + b"]" * 500_000, "application/json"), {422}),
        ("YAML nested 1,200 deep", posted(b"seeds: " + b"[" * 1200 + b"]" * 1200), {422}),
        ("YAML nested 1,200 deep, block style", posted(b"".join(b" " * n + b"k:\n" for n in range(1200))), {422}),
        ("a 5,000-digit integer in JSON",
         posted(b'{"seeds": ["http://127.0.0.1:9/"], "max_pages": ' + b"9" * 5000 + b"}", "application/json"), {422}),
        ("a 5,000-digit integer in YAML", posted(SEED + b"max_pages: " + b"9" * 5000), {422}),
        ("a YAML body that is not UTF-8", posted(b"seeds: [\xff]"), {400}),
        ("a tagged YAML scalar that is no such thing", posted(SEED + b"max_depth: !!float abc\n"), {422}),
        ("a 5,000-digit hex integer in YAML", posted(SEED + b"max_depth: 0x" + b"f" * 5000), {422}),
        ("a JSON key given twice",
         posted(b'{"seeds": ["http://127.0.0.1:9/"], "max_pages": 1, "max_pages": 9}', "application/json"), {422}),
        ("a lone surrogate in JSON", posted(b'{"seeds": ["http://127.0.0.1:9/\\ud800"]}', "application/json"), {422}),
        ("1 MiB of empty JSON objects", posted(b"[" + b"{}," * 349_000 + b"{}]", "application/json"), {422}),
        ("a chunked body of 70,000 one-byte chunks",
         framed(BEARER, "Transfer-Encoding: chunked", body=[b"1\r\nx\r\n" * 70_000]), {400}),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)  # fmt: skip
def test_a_hostile_request_is_refused_cheaply(
    served: Served, name: str, send: Callable[[Served], tuple[int | None, object]], statuses: set[int]
) -> None:
    status, answer, seconds, growth_mb = probe(served, lambda: send(served))
    assert status in statuses, (name, status, str(answer)[:300])
    assert seconds < ANSWER_S and growth_mb < MAX_GROWTH_MB, (name, seconds, growth_mb)
    assert _answers(served.port), "the server still answers"


def test_the_body_is_not_read_before_the_token_is_checked(served: Served) -> None:
    # Headers of a 50 MB body and nothing more: the answer comes at once, without waiting for the body.
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.sendall(head(served, "POST", "Content-Length: 52428800", "Content-Type: application/json"))
        assert sock.recv(200).startswith(b"HTTP/1.1 401 ")
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:  # nor past its cap, with it
        sock.sendall(head(served, "POST", BEARER, "Content-Length: 52428800"))
        assert sock.recv(200).startswith(b"HTTP/1.1 413 ")


def test_100_continue_is_sent_only_to_a_request_that_passed_its_checks(served: Served) -> None:
    job = json.dumps({"seeds": ["http://127.0.0.1:9/"], "max_pages": 0}).encode()  # invalid: answered 422
    for lines, first in (((), b"HTTP/1.1 401 "), ((BEARER,), b"HTTP/1.1 100 ")):
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
            sock.sendall(head(served, "POST", *lines, "Expect: 100-continue", "Content-Type: application/json",
                              f"Content-Length: {len(job)}"))  # fmt: skip
            assert sock.recv(200).startswith(first)
            if first.startswith(b"HTTP/1.1 100"):
                sock.sendall(job)
                assert b"HTTP/1.1 422 " in wait_until(lambda: sock.recv(4096), 5, "the job's answer")


def test_a_chunked_job_is_read(served: Served) -> None:
    job = json.dumps({"id": "limits-chunked", "seeds": ["http://127.0.0.1:9/"], "max_pages": 1}).encode()
    chunks = [b"%x\r\n%s\r\n" % (len(job[i : i + 10]), job[i : i + 10]) for i in range(0, len(job), 10)]
    status, answer = raw(served.port, head(served, "POST", BEARER, "Transfer-Encoding: chunked",
                                           "Content-Type: application/json", "Connection: close"),
                         [*chunks, b"0\r\nX-Trailer: ignored\r\n\r\n"])  # fmt: skip
    assert status == 201, answer[:300]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["id"] == "limits-chunked"
    tasks.cancel_job("limits-chunked")


def test_a_merge_key_starts_no_job(served: Served) -> None:
    status, answer = post(served, b"id: limits-merge-2\n" + SEED + b"max_pages: 5\n<<: {max_pages: 7}\n",
                          "application/yaml")  # fmt: skip
    assert status == 422 and "merge key" in answer["error"]
    assert tasks.job_status("limits-merge-2") is None


def test_stalled_bodies_are_dropped_at_the_request_timeout(served: Served) -> None:
    # 20 clients send 3 bytes of a 1,000-byte body and wait: each gets a 408 at the shipped timeout,
    # and the server answers others meanwhile.
    started = time.monotonic()
    stalled = []
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", served.port), timeout=LIMITS.request_timeout_s + 5)
        sock.sendall(head(served, "POST", BEARER, "Content-Length: 1000") + b"abc")
        stalled.append(sock)
    try:
        assert _answers(served.port)
        answers = [sock.recv(200) for sock in stalled]
        waited = time.monotonic() - started
    finally:
        for sock in stalled:
            sock.close()
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), {a[:20] for a in answers}
    assert LIMITS.request_timeout_s - 0.5 <= waited <= LIMITS.request_timeout_s + 3, waited


def test_a_request_dripped_byte_by_byte_is_dropped_at_the_same_timeout(served: Served) -> None:
    # A per-read timeout alone would wait for ever: each byte comes well within it.
    started, dropped = time.monotonic(), False
    with socket.create_connection(("127.0.0.1", served.port), timeout=2) as sock:
        for sent, byte in enumerate(head(served, "GET", BEARER, "X-Padding: " + "a" * 1000), 1):
            if time.monotonic() - started > LIMITS.request_timeout_s + 3:
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                dropped = True
                break
            time.sleep(0.2)
            if sent % 5 == 0 and _closed(sock):
                dropped = True
                break
    waited = time.monotonic() - started
    assert dropped and waited <= LIMITS.request_timeout_s + 3, waited


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)
        sock.settimeout(2)


def _idle(port: int, count: int, source: str) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) for _ in range(count)]


def _refused_from(port: int, source: str) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as sock:
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\n\r\n")
        return sock.recv(200).startswith(b"HTTP/1.1 429 ")


def test_one_address_cannot_take_every_connection(served: Served) -> None:
    idle = _idle(served.port, LIMITS.max_connections_per_address, "127.0.0.2")
    try:
        wait_until(lambda: _refused_from(served.port, "127.0.0.2"), 5, "one more from 127.0.0.2 answered 429")
        assert not _refused_from(served.port, "127.0.0.3")  # others are still served
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: not _refused_from(served.port, "127.0.0.2"), 5, "served again once they closed")


def test_connections_past_the_limit_are_refused_with_429(served: Served) -> None:
    per_address, sources = LIMITS.max_connections_per_address, ("127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7")
    idle = [sock for source in sources for sock in _idle(served.port, min(per_address, LIMITS.max_connections // 4),
                                                         source)]  # fmt: skip
    try:
        assert len(idle) == LIMITS.max_connections
        wait_until(lambda: _refused_from(served.port, "127.0.0.8"), 5, "a connection past the limit answered 429")
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: _answers(served.port), 5, "served again once the connections closed")


def test_only_a_client_with_the_token_is_kept_alive(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:  # no token: answered, then closed
        sock.sendall(head(served, "GET"))
        answer = wait_until(lambda: _read_to_end(sock), 5, "the 401 and the connection's end")
        assert answer.startswith(b"HTTP/1.1 401 ") and b"Connection: close" in answer
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:  # the token: 2 answers on it
        for _ in range(2):
            sock.sendall(head(served, "GET", BEARER, "Content-Length: 0"))
            assert _read_answer(sock).startswith(b"HTTP/1.1 200 ")


def _read_answer(sock: socket.socket) -> bytes:
    """One whole answer on a kept-alive connection: its head, then Content-Length bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _content_length(data):
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {data[:200]!r}"
        data += chunk
    return data


def _content_length(data: bytes) -> int:
    head_part = data.partition(b"\r\n\r\n")[0].lower()
    return int(head_part.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])


def _read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_client_gone_mid_body_leaves_no_traceback(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.sendall(head(served, "POST", BEARER, "Content-Length: 1000") + b"{")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    assert _answers(served.port)
    time.sleep(0.5)  # the server's thread logs what it saw
    assert "Traceback" not in served.log.read_text(errors="replace")


def test_refusals_are_logged_with_control_characters_escaped(served: Served) -> None:
    request = urllib.request.Request(served.url + "/api/jobs", data=b"{}", method="POST",
                                     headers={"Origin": "http://evil.test\x1b[2J"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 403
    wait_until(lambda: "evil.test\\x1b[2J" in served.log.read_text(errors="replace"), 5, "the refusal logged")
    assert "\x1b" not in served.log.read_text(errors="replace")


def test_every_answer_refuses_to_be_framed(served: Served) -> None:
    many_headers = "".join(f"X-{n}: 1\r\n" for n in range(101))
    for request in ("OPTIONS / HTTP/1.1\r\n\r\n", f"GET / HTTP/1.1\r\n{many_headers}\r\n"):  # the base class's pages
        status, answer = raw(served.port, request.encode(), read_s=5)
        assert status in (501, 431) and b"X-Frame-Options: DENY" in answer, answer[:300]
        assert b"Content-Security-Policy: default-src 'none'; frame-ancestors 'none'" in answer
    for path, headers in (("/", {}), ("/dashboard.js", {}), ("/openapi.json", {}), ("/api/jobs", {}),
                          ("/api/jobs", {"Authorization": f"Bearer {TOKEN}"}), ("/nope", {})):  # fmt: skip
        request = urllib.request.Request(served.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                answer = response.headers
        except urllib.error.HTTPError as error:
            answer = error.headers
        assert answer["X-Frame-Options"] == "DENY", path
        assert "frame-ancestors 'none'" in answer["Content-Security-Policy"], path
    with urllib.request.urlopen(served.url + "/", timeout=5) as response:
        policy = response.headers["Content-Security-Policy"]
        page = response.read()
    assert "'unsafe-inline'" not in policy and "script-src 'self'" in policy
    assert b"<script>" not in page and b"<style>" not in page and b'src="/dashboard.js"' in page


def test_tokens_never_reach_the_log(served: Served) -> None:
    secret = "do-not-log-" + os.urandom(6).hex()
    with urllib.request.urlopen(f"{served.url}/?token={secret}", timeout=5) as response:
        assert response.status == 200
    request = urllib.request.Request(served.url + "/api/jobs", headers={"Authorization": f"Bearer {secret}"})
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(request, timeout=5)
    wait_until(lambda: "/?token=***" in served.log.read_text(errors="replace"), 5, "the request logged")
    assert secret not in served.log.read_text(errors="replace")
    assert TOKEN not in served.log.read_text(errors="replace")
