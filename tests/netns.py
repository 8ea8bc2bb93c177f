"""A network namespace joined to the test's own by a veth pair, whose link a test cuts and heals.

A process started in the namespace (``Lab.popen``) reaches only the root end of the pair
(``Lab.root_address``): serve Redis and the test sites there. ``cut()`` sets the root end down,
so the namespace's packets are dropped without a word (open TCP connections stay half-open, as
in a real partition) while the root namespace still reaches its own address; ``heal()`` sets it
up again. The addresses are a free /30 of TEST-NET-2 (RFC 5737, 198.51.100.0/24): never a real
host, and not the documentation net the machine's own interface may sit on (192.0.2.0/24 here).
Making namespaces needs root and ``ip`` (iproute2); ``unavailable_reason()`` says why not.

``use_nameserver(address)`` gives the namespace its own ``/etc/netns/<name>/resolv.conf``, which
``ip netns exec`` bind-mounts over ``/etc/resolv.conf`` for the processes it starts: they resolve
names through the system resolver (``getaddrinfo``) against a test DNS server (tests/dns_server.py),
and no query can leave the machine (the namespace's only link is the veth pair).
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

__all__ = ["Lab", "LabUnavailable", "lab_or_skip", "unavailable_reason"]

LAB_NET = ipaddress.IPv4Network("198.51.100.0/24")
NETNS_ETC = Path("/etc/netns")  # ip netns exec bind-mounts NETNS_ETC/<name>/<file> over /etc/<file>
# Two labs (two test processes, two checkouts on one machine) must not pick the same /30.
_ALLOCATION_LOCK = Path(tempfile.gettempdir()) / "vcrawl-netns.lock"
_PREFIX = "vcrawl-lab-"
_SERIAL = itertools.count()


class LabUnavailable(RuntimeError):
    """The namespace or its link could not be made here (the message says why)."""


def unavailable_reason() -> str | None:
    """Why no lab can be made on this machine, or None when one can be tried."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    return None


@contextmanager
def lab_or_skip() -> Iterator[Lab]:
    """A started lab for a test, closed after it; the test is skipped, saying why, if none can be made."""
    if (reason := unavailable_reason()) is not None:
        pytest.skip(f"no network namespace can be made: {reason}")
    try:
        lab = Lab().start()
    except LabUnavailable as e:
        pytest.skip(f"no network namespace can be made: {e}")
    try:
        yield lab
    finally:
        lab.close()


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise LabUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _remove_stale_labs() -> None:
    """Delete the labs of test processes that died without cleaning up (SIGKILL): they hold a /30."""
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        found = re.fullmatch(re.escape(_PREFIX) + r"([a-z]{0,2})(\d+)-(\d+)", name)
        if found is None or _is_alive(int(found.group(2))):
            continue
        suffix = name.removeprefix(_PREFIX)
        subprocess.run(["ip", "link", "del", f"{suffix}r"], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network on an address or a route of this namespace."""
    used = []
    for line in _ip("-o", "-4", "addr", "show").splitlines():
        fields = line.split()
        used.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show", "table", "all").splitlines():
        for word in line.split()[:2]:  # "NET dev ..." or "local|broadcast|... NET dev ..."
            try:
                used.append(ipaddress.IPv4Network(word, strict=False))
                break
            except ValueError:
                continue  # "default", a route type
    return used


class Lab:
    """A namespace ``name`` with a veth pair to this one; cleaned up on exit, also after a failure.

    Raises:
        LabUnavailable: from ``start()``, when the namespace or the link cannot be made.
    """

    def __init__(self, tag: str = "vc") -> None:
        # Unique on the machine while this process runs; interface names are at most 15 characters.
        suffix = f"{tag[:2]}{os.getpid()}-{next(_SERIAL) % 100}"
        self.name = f"{_PREFIX}{suffix}"
        self.root_dev, self.lab_dev = f"{suffix}r", f"{suffix}n"
        self.network: ipaddress.IPv4Network | None = None
        self._made: list[str] = []

    @property
    def root_address(self) -> str:
        """The root end's address: listen here to be reached from the namespace."""
        assert self.network is not None, "the lab is not started"
        return str(self.network[1])

    @property
    def lab_address(self) -> str:
        """The namespace's address (the source of its packets)."""
        assert self.network is not None, "the lab is not started"
        return str(self.network[2])

    def start(self) -> Lab:
        """Make the namespace and the link, both ends up."""
        if (reason := unavailable_reason()) is not None:
            raise LabUnavailable(reason)
        try:
            with open(_ALLOCATION_LOCK, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                _remove_stale_labs()
                self.network = self._free_network()
                _ip("netns", "add", self.name)
                self._made.append("netns")
                _ip("link", "add", self.root_dev, "type", "veth", "peer", "name", self.lab_dev)
                self._made.append("link")
                _ip("addr", "add", f"{self.root_address}/30", "dev", self.root_dev)
            _ip("link", "set", self.lab_dev, "netns", self.name)
            self._in_lab("addr", "add", f"{self.lab_address}/30", "dev", self.lab_dev)
            self._in_lab("link", "set", "lo", "up")
            self._in_lab("link", "set", self.lab_dev, "up")
            _ip("link", "set", self.root_dev, "up")
        except BaseException:
            self.close()
            raise
        return self

    def _free_network(self) -> ipaddress.IPv4Network:
        used = _networks_in_use()
        for network in LAB_NET.subnets(new_prefix=30):
            if not any(network.overlaps(other) for other in used if other.prefixlen > 0):
                return network
        raise LabUnavailable(f"no free /30 left in {LAB_NET}")

    def _in_lab(self, *args: str) -> str:
        return _ip("-n", self.name, *args)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (same files and environment, the namespace's network)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the namespace; the process is ``argv`` itself (``ip`` execs it)."""
        return subprocess.Popen(self.command(argv), **kwargs)

    def use_nameserver(self, address: str) -> None:
        """Resolve names in processes started from now on with the DNS server at ``address`` (port 53) only.

        glibc gives up after one query per server and try (``timeout:1 attempts:2``): a test waits
        seconds, not the default 10, when the server is down.
        """
        assert "netns" in self._made, "the lab is not started"
        folder = NETNS_ETC / self.name
        folder.mkdir(parents=True, exist_ok=True)
        self._made.append("etc")
        (folder / "resolv.conf").write_text(f"nameserver {address}\noptions timeout:1 attempts:2\n")

    def cut(self) -> None:
        """Drop everything between the namespace and the root namespace, both ways, silently."""
        _ip("link", "set", self.root_dev, "down")

    def heal(self) -> None:
        """Pass traffic again; connections that outlived the cut carry on."""
        _ip("link", "set", self.root_dev, "up")

    def close(self) -> None:
        """Delete the link (both ends) and the namespace; stop the processes in it first."""
        if "link" in self._made:
            subprocess.run(["ip", "link", "del", self.root_dev], capture_output=True, timeout=10)
        if "netns" in self._made:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)
        if "etc" in self._made:  # ip netns del leaves /etc/netns/<name> behind
            shutil.rmtree(NETNS_ETC / self.name, ignore_errors=True)
        self._made.clear()

    def __enter__(self) -> Lab:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
