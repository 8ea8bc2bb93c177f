"""Which addresses vcrawl may connect to, and connections that keep to them (the SSRF guard).

By default only public addresses are fetched. Loopback, private, link-local (cloud metadata at
169.254.169.254), shared (100.64/10), reserved, unspecified and multicast addresses are refused
unless the operator lists their networks in ``VCRAWL_ALLOWED_NETWORKS``. A job's
``allowed_networks`` narrows what the cluster allows and can never widen it. IPv6 forms that
embed an IPv4 address (``::ffff:127.0.0.1``, ``::127.0.0.1``, NAT64 ``64:ff9b::/96``, 6to4,
Teredo) are judged by the IPv4 address inside.

A host name is resolved once, inside the connection: refused addresses are dropped and the
socket connects to a checked address itself, so nothing resolves the name again in between (no
DNS-rebinding window). Workers resolve through their process's DNS cache (``fetchers.dns_cache``):
the one resolution of a connection may come from there, and it is still the one checked and
used. TLS still checks the certificate against the host name. A kept-alive connection is checked
again against the policy of the request that reuses it.

Through a proxy, the proxy resolves the target itself: the target is resolved here first and
refused if any of its addresses is (a literal IP address is exact; a name that does not resolve
here is left to the proxy). The cluster's own ``VCRAWL_PROXIES`` are trusted; any other proxy (a
job's) must itself be at an address the cluster allows.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from requests.utils import select_proxy
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import allowed_gai_family
from urllib3.util.timeout import _DEFAULT_TIMEOUT

from fetchers.deadline import DeadlineAdapter, DeadlineWatch
from vcrawl.settings import Settings

__all__ = [
    "PUBLIC_ONLY",
    "BlockedAddress",
    "GuardedAdapter",
    "NetworkPolicy",
    "Resolver",
    "applying",
    "check_target",
    "connect_pinned",
    "connections_opened",
    "current_policy",
    "embedded_ipv4",
    "is_public",
    "note_connection_opened",
    "parse_networks",
]

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[..., list[tuple[Any, ...]]]  # socket.getaddrinfo's signature

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: a gateway may map it to any IPv4 address
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # RFC 4291 §2.5.5.1 (deprecated, still parsed)
_MAX_ADDRESSES = 4  # addresses of one name tried per connection: bounds the connect time


class BlockedAddress(Exception):
    """Every address of ``host`` is one the network policy refuses."""

    def __init__(self, host: str, addresses: tuple[str, ...]) -> None:
        super().__init__(host, addresses)
        self.host, self.addresses = host, addresses

    def __str__(self) -> str:
        return f"{self.host} resolves only to refused addresses {list(self.addresses)}"


def parse_networks(items: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDR strings as networks (host bits allowed: ``10.1.2.3/8`` is ``10.0.0.0/8``).

    >>> parse_networks(["127.0.0.1", "::1/128"])
    (IPv4Network('127.0.0.1/32'), IPv6Network('::1/128'))

    Raises:
        ValueError: an item that is not a network.
    """
    return tuple(ipaddress.ip_network(item.strip(), strict=False) for item in items)


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, if it embeds one.

    >>> str(embedded_ipv4(ipaddress.ip_address("::ffff:127.0.0.1")))
    '127.0.0.1'
    >>> str(embedded_ipv4(ipaddress.ip_address("2002:a9fe:a9fe::1")))
    '169.254.169.254'
    >>> embedded_ipv4(ipaddress.ip_address("2606:4700::1")) is None
    True
    """
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):  # not :: and ::1
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public(address: IPAddress) -> bool:
    """True for a globally routable unicast address (judged by the IPv4 address it embeds, if any).

    >>> [is_public(ipaddress.ip_address(a)) for a in ("93.184.215.14", "10.0.0.1", "169.254.169.254")]
    [True, False, False]
    >>> [is_public(ipaddress.ip_address(a)) for a in ("::ffff:127.0.0.1", "::7f00:1", "224.0.0.1")]
    [False, False, False]
    """
    inner = embedded_ipv4(address)
    if inner is not None:
        return is_public(inner)
    if not address.is_global or address.is_multicast or address.is_reserved or address.is_unspecified:
        return False
    # fec0::/10 was deprecated before ipaddress learnt it is not global.
    return not (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)


def _address(text: str | IPAddress) -> IPAddress:
    if isinstance(text, str):
        return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone (fe80::1%eth0)
    return text


def _within(address: IPAddress, networks: tuple[IPNetwork, ...]) -> bool:
    inner = embedded_ipv4(address)
    return any(address in network or (inner is not None and inner in network) for network in networks)


_VERDICTS_KEPT = 4096


@dataclass(frozen=True)
class NetworkPolicy:
    """Where connections may go: public addresses, plus the cluster's allowed networks, narrowed by a job's.

    An address may be fetched if it is public or inside ``allowed`` (the cluster's
    ``VCRAWL_ALLOWED_NETWORKS``), and, when ``job_networks`` is set, also inside one of those.
    """

    allowed: tuple[IPNetwork, ...] = ()
    job_networks: tuple[IPNetwork, ...] | None = None
    trusted_proxies: frozenset[str] = field(default_factory=frozenset)  # "host:port" of the cluster's proxies
    # Verdicts by address text: a kept-alive connection is checked again before every request it
    # carries, and parsing its address each time took a fifth of the pool's work.
    _verdicts: dict[str, bool] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> NetworkPolicy:
        """The cluster's policy: ``VCRAWL_ALLOWED_NETWORKS``, and ``VCRAWL_PROXIES`` trusted."""
        return cls(
            allowed=parse_networks(settings.allowed_networks),
            trusted_proxies=frozenset(filter(None, (_proxy_key(proxy) for proxy in settings.proxies))),
        )

    def narrowed(self, networks: Iterable[IPNetwork] | None) -> NetworkPolicy:
        """This policy, limited to ``networks`` as well (None: unchanged); it never allows more."""
        if networks is None:
            return self
        networks = tuple(networks)
        if self.job_networks is not None:  # narrowed twice: keep what lies inside the first list
            networks = tuple(n for n in networks if any(_subnet(n, m) for m in self.job_networks))
        return replace(self, job_networks=networks)

    def ceiling(self) -> NetworkPolicy:
        """The cluster's policy, without a job's narrowing (for the proxies a job names)."""
        return replace(self, job_networks=None)

    def permits(self, address: str | IPAddress) -> bool:
        """True if a connection to ``address`` is allowed."""
        if isinstance(address, str):
            if (verdict := self._verdicts.get(address)) is None:
                if len(self._verdicts) >= _VERDICTS_KEPT:
                    self._verdicts.clear()
                verdict = self._verdicts[address] = self._permits(_address(address))
            return verdict
        return self._permits(address)

    def _permits(self, ip: IPAddress) -> bool:
        if not (is_public(ip) or _within(ip, self.allowed)):
            return False
        return self.job_networks is None or _within(ip, self.job_networks)

    def trusts(self, proxy: str | None) -> bool:
        """True if ``proxy`` (a URL) is one of the cluster's own proxies."""
        return proxy is not None and _proxy_key(proxy) in self.trusted_proxies


def _subnet(inner: IPNetwork, outer: IPNetwork) -> bool:
    return inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]


def _proxy_key(proxy: str) -> str | None:
    try:
        parts = urlsplit(proxy)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return f"{(parts.hostname or '').lower()}:{port}"


PUBLIC_ONLY = NetworkPolicy()
"""The policy with nothing allowed beyond public addresses: the default everywhere."""

_CURRENT: ContextVar[NetworkPolicy] = ContextVar("vcrawl_network_policy", default=PUBLIC_ONLY)


def current_policy() -> NetworkPolicy:
    """The policy of the request the calling thread is making (default: public addresses only)."""
    return _CURRENT.get()


@contextmanager
def applying(policy: NetworkPolicy) -> Iterator[None]:
    """Make ``policy`` the one the calling thread's connections obey inside the block."""
    token = _CURRENT.set(policy)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _permitted(host: str, port: int, policy: NetworkPolicy, resolver: Resolver) -> list[tuple[Any, ...]]:
    """Resolve ``host`` once; return the addresses the policy permits.

    Raises:
        BlockedAddress: it resolved, but only to refused addresses.
        socket.gaierror: it did not resolve.
    """
    found = resolver(host.strip("[]"), port, allowed_gai_family(), socket.SOCK_STREAM)
    permitted = [info for info in found if policy.permits(info[4][0])]
    if not permitted:
        raise BlockedAddress(host, tuple(dict.fromkeys(str(info[4][0]) for info in found)))
    return permitted


def check_target(host: str, port: int, policy: NetworkPolicy, resolver: Resolver) -> None:
    """Refuse a target that a proxy will resolve itself, if any address it has here is refused.

    Best effort: the proxy resolves the name again. A name that does not resolve here is left
    to the proxy (it may know names the workers do not).

    Raises:
        BlockedAddress: ``host`` is, or resolves to, a refused address.
    """
    try:
        found = resolver(host.strip("[]"), port, allowed_gai_family(), socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        logger.debug("target %s does not resolve here; left to the proxy", host)
        return
    refused = tuple(dict.fromkeys(str(info[4][0]) for info in found if not policy.permits(info[4][0])))
    if refused or not found:
        raise BlockedAddress(host, refused)


def connect_pinned(
    host: str,
    port: int,
    policy: NetworkPolicy,
    resolver: Resolver,
    timeout: Any = _DEFAULT_TIMEOUT,
    source_address: tuple[str, int] | None = None,
    socket_options: Iterable[tuple[int, int, Any]] | None = None,
) -> socket.socket:
    """Resolve ``host`` once and connect to the first permitted address that answers.

    Raises:
        BlockedAddress: every address is refused (nothing was sent anywhere).
        socket.gaierror: the name did not resolve.
        OSError: no permitted address accepted the connection (TimeoutError if the last timed out).
    """
    error: OSError | None = None
    for family, kind, proto, _, address in _permitted(host, port, policy, resolver)[:_MAX_ADDRESSES]:
        sock = socket.socket(family, kind, proto)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            if timeout is not _DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(address)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    assert error is not None
    raise error


class _Pinned:
    """Mixed into urllib3's connections: connect only to an address the current policy permits."""

    resolver: Resolver
    pinned_address: str | None = None

    def _new_conn(self) -> socket.socket:
        proxy = getattr(self, "proxy", None)
        policy = current_policy()
        if proxy is not None:  # this connection goes to a proxy
            if policy.trusts(proxy.url):
                return super()._new_conn()  # type: ignore[misc]
            policy = policy.ceiling()  # a job's proxy: anywhere the cluster allows
        conn: Any = self
        try:
            sock = connect_pinned(
                conn._dns_host, conn.port, policy, self.resolver, conn.timeout, conn.source_address, conn.socket_options
            )
        except socket.gaierror as exc:
            raise NameResolutionError(conn.host, conn, exc) from exc
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})"
            ) from exc
        except OSError as exc:
            raise NewConnectionError(conn, f"Failed to establish a new connection: {exc}") from exc
        except BlockedAddress as exc:
            logger.info("refused a connection to %s port %s: %s", conn.host, conn.port, exc)
            raise
        self.pinned_address = sock.getpeername()[0]
        _OPENED.add()
        sys.audit("http.client.connect", self, conn.host, conn.port)
        return sock


class _Count:
    """A counter the threads of a process share."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self) -> None:
        with self._lock:
            self.value += 1


_OPENED = _Count()


def note_connection_opened() -> None:
    """Count a connection opened outside urllib3's pools (``fetchers.wire``)."""
    _OPENED.add()


def connections_opened() -> int:
    """Connections this process opened to sites so far (kept-alive ones are reused, not counted again)."""
    return _OPENED.value


class _Rechecked:
    """Mixed into urllib3's pools: a kept-alive connection must suit the policy of the request reusing it."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        address = getattr(conn, "pinned_address", None)
        if address is not None and conn.sock is not None:
            policy = current_policy()
            if getattr(conn, "proxy", None) is not None:
                policy = policy.ceiling()
            if not policy.permits(address):
                logger.debug("kept-alive connection to %s not allowed for this request; reconnecting", address)
                conn.close()  # connects afresh, under this request's policy
        return conn


def guarded_pools(resolver: Resolver) -> dict[str, type]:
    """urllib3 pool classes whose connections resolve with ``resolver`` and obey the current policy."""
    http = type("PinnedHTTPConnection", (_Pinned, HTTPConnection), {"resolver": staticmethod(resolver)})
    https = type("PinnedHTTPSConnection", (_Pinned, HTTPSConnection), {"resolver": staticmethod(resolver)})
    return {
        "http": type("GuardedHTTPPool", (_Rechecked, HTTPConnectionPool), {"ConnectionCls": http}),
        "https": type("GuardedHTTPSPool", (_Rechecked, HTTPSConnectionPool), {"ConnectionCls": https}),
    }


class GuardedAdapter(DeadlineAdapter):
    """A DeadlineAdapter whose connections (and proxied targets) obey the current NetworkPolicy."""

    def __init__(self, watch: DeadlineWatch, resolver: Resolver = socket.getaddrinfo, **kwargs: Any) -> None:
        self._resolver = resolver
        super().__init__(watch, pools=guarded_pools(resolver), **kwargs)

    def send(self, request: Any, stream: bool = False, timeout: Any = None, verify: Any = True,
             cert: Any = None, proxies: Any = None) -> Any:  # fmt: skip
        """Send ``request``; through a proxy, check its target first (the proxy will resolve it).

        Raises:
            BlockedAddress: the target (or, without a proxy, every address of it) is refused.
        """
        if proxies and select_proxy(request.url, proxies):
            parts = urlsplit(request.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            check_target(parts.hostname or "", port, current_policy(), self._resolver)
        return super().send(request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies)
