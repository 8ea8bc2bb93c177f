"""A free TCP port on loopback, for the servers the tests start (a race with another process taking it
between this call and the server's bind is possible; the harnesses that care retry their start)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
