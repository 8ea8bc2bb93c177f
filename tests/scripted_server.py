"""A loopback server that sends scripted bytes, one script per accepted connection (plain or TLS):
for tests of an HTTP client's framing, limits and timing (tests/integration/test_wire.py)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable

__all__ = ["Peer", "Script", "ScriptedServer", "answering", "echoing_target", "http_response"]

SERVER_LIFE_S = 30.0  # no server thread outlives this, even if a test forgets it
Script = Callable[["Peer"], None]


class Peer:
    """One accepted connection as the server sees it: read a request's head, send bytes, pause."""

    def __init__(self, sock: socket.socket, server: ScriptedServer) -> None:
        self.sock, self.server, self._buffer = sock, server, b""

    def request(self) -> bytes | None:
        """The next request's head (recorded by the server); None once the client closed or the test ended."""
        ends = time.monotonic() + 10
        while b"\r\n\r\n" not in self._buffer:
            if self.server.stopped.is_set() or time.monotonic() > ends:
                return None
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                return None
            self._buffer += data
            self.server.received += data
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        self.server.requests.append(head)
        return head

    def send(self, data: bytes) -> bool:
        """Send ``data``; False if the client has gone."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds``; False if the test ended meanwhile."""
        return not self.server.stopped.wait(seconds)


class ScriptedServer:
    """A loopback server: its n-th connection runs ``scripts[n]`` (the last one for any beyond)."""

    def __init__(self, scripts: tuple[Script, ...], tls: ssl.SSLContext | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.scheme = "https" if tls else "http"
        self.accepts, self.finished = 0, 0
        self.requests: list[bytes] = []
        self.received = b""
        self.stopped = threading.Event()
        self._scripts, self._tls, self._socks = scripts, tls, []
        self._threads = [threading.Thread(target=self._accept_loop, daemon=True)]
        self._threads[0].start()

    def url(self, target: str = "/") -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{target}"

    def _accept_loop(self) -> None:
        ends = time.monotonic() + SERVER_LIFE_S
        while not self.stopped.is_set() and time.monotonic() < ends and self.accepts < 50:
            try:
                sock, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            self._socks.append(sock)
            script = self._scripts[min(self.accepts, len(self._scripts) - 1)]
            self.accepts += 1
            thread = threading.Thread(target=self._serve, args=(sock, script), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket, script: Script) -> None:
        try:
            sock.settimeout(2)  # bounds a TLS handshake; then recv polls the stop event
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_side=True)
                self._socks.append(sock)
            sock.settimeout(0.05)
            script(Peer(sock, self))
        except OSError:  # ssl.SSLError too: a client that refused our certificate
            pass
        finally:
            sock.close()
            self.finished += 1

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
        for sock in self._socks:
            sock.close()
        for thread in self._threads:
            thread.join(timeout=2)
        assert not any(thread.is_alive() for thread in self._threads), "a server thread did not end"


def http_response(body: bytes = b"", *fields: str, status: str = "200 OK", length: bool = True) -> bytes:
    head = [f"HTTP/1.1 {status}", *fields] + ([f"Content-Length: {len(body)}"] if length else [])
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def answering(*responses: bytes, then_close: bool = False) -> Script:
    """A script that answers each request with the next of ``responses`` (the last one for any beyond)."""

    def script(peer: Peer) -> None:
        for n in range(20):
            if peer.request() is None or not peer.send(responses[min(n, len(responses) - 1)]) or then_close:
                return

    return script


def echoing_target(peer: Peer) -> None:
    """Answers each request with its own target as the body."""
    for _ in range(20):
        if (head := peer.request()) is None or not peer.send(http_response(head.split(b" ")[1])):
            return
