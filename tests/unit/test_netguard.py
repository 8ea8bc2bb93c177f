"""The network policy (SSRF guard) as pure code: which addresses, which lists, which settings."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from fetchers.netguard import (
    PUBLIC_ONLY,
    BlockedAddress,
    NetworkPolicy,
    check_target,
    embedded_ipv4,
    is_public,
    parse_networks,
)
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings


def policy(allowed: tuple[str, ...] = (), job: tuple[str, ...] | None = None) -> NetworkPolicy:
    return NetworkPolicy(allowed=parse_networks(allowed)).narrowed(None if job is None else parse_networks(job))


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.215.14", True),
        ("2606:4700::6810:84e5", True),
        ("127.0.0.1", False),
        ("127.255.255.254", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # shared address space (carrier-grade NAT)
        ("0.0.0.0", False),
        ("255.255.255.255", False),
        ("224.0.0.1", False),  # multicast counts as global to ipaddress
        ("240.0.0.1", False),
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("fec0::1", False),  # site-local (deprecated)
        ("ff0e::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:169.254.169.254", False),
        ("::127.0.0.1", False),  # IPv4-compatible: ipaddress calls it global
        ("64:ff9b::7f00:1", False),  # NAT64 of 127.0.0.1: ipaddress calls it global
        ("64:ff9b::808:808", True),  # NAT64 of 8.8.8.8
        ("2002:7f00:1::1", False),  # 6to4 of 127.0.0.1: ipaddress calls it global
        ("2002:808:808::1", True),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", False),  # Teredo of 127.0.0.1
    ],
)
def test_which_addresses_are_public(address: str, public: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is public


def test_embedded_ipv4_forms() -> None:
    for text in ("::ffff:127.0.0.1", "::127.0.0.1", "64:ff9b::127.0.0.1", "2002:7f00:1::"):
        assert embedded_ipv4(ipaddress.ip_address(text)) == ipaddress.IPv4Address("127.0.0.1"), text
    assert embedded_ipv4(ipaddress.ip_address("::1")) is None
    assert embedded_ipv4(ipaddress.ip_address("127.0.0.1")) is None


def test_by_default_only_public_addresses_are_permitted() -> None:
    assert PUBLIC_ONLY.permits("93.184.215.14")
    for refused in ("127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "::ffff:127.0.0.1", "fe80::1%eth0"):
        assert not PUBLIC_ONLY.permits(refused), refused


def test_the_cluster_list_allows_exactly_its_networks() -> None:
    cluster = policy(("127.0.0.0/8", "::1/128"))
    assert cluster.permits("127.0.0.1") and cluster.permits("127.9.9.9") and cluster.permits("::1")
    assert cluster.permits("::ffff:127.0.0.1")  # the mapped form of an allowed address
    assert not cluster.permits("10.0.0.1") and not cluster.permits("169.254.169.254")
    assert cluster.permits("93.184.215.14")  # public stays allowed


def test_a_job_list_narrows_and_never_widens() -> None:
    narrowed = policy(("127.0.0.2/32",), job=("127.0.0.0/8",))
    assert narrowed.permits("127.0.0.2")
    assert not narrowed.permits("127.0.0.3")  # in the job's list, not in the cluster's
    assert not narrowed.permits("93.184.215.14")  # public, but outside the job's list
    metadata = policy(job=("169.254.0.0/16",))
    assert not metadata.permits("169.254.169.254")  # the operator never allowed it


def test_narrowing_twice_keeps_the_intersection() -> None:
    twice = policy(("10.0.0.0/8",), job=("10.1.0.0/16",)).narrowed(parse_networks(["10.0.0.0/8", "10.1.2.0/24"]))
    assert twice.permits("10.1.2.3")
    assert not twice.permits("10.2.0.1") and not twice.permits("10.1.3.1")
    assert twice.ceiling() == policy(("10.0.0.0/8",))


def test_the_cluster_proxies_are_trusted_and_nothing_else() -> None:
    settings = Settings(proxies=("http://user:pw@Proxy.Internal:3128", "https://10.0.0.5"), allowed_networks=())
    cluster = NetworkPolicy.from_settings(settings)
    assert cluster.trusts("http://proxy.internal:3128") and cluster.trusts("https://10.0.0.5:443")
    assert not cluster.trusts("http://proxy.internal:8080") and not cluster.trusts("http://169.254.169.254")
    assert not cluster.trusts(None)


def test_the_setting_takes_commas_spaces_or_json_and_names_itself_when_wrong() -> None:
    assert Settings.from_env({"VCRAWL_ALLOWED_NETWORKS": "127.0.0.0/8, ::1/128"}).allowed_networks == (
        "127.0.0.0/8",
        "::1/128",
    )
    assert Settings.from_env({"VCRAWL_ALLOWED_NETWORKS": '["10.0.0.0/8"]'}).allowed_networks == ("10.0.0.0/8",)
    assert Settings.from_env({}).allowed_networks == ()
    settings = Settings(allowed_networks=("10.0.0.0/8", "fd00::/8"))
    assert Settings.from_env(settings.to_env()) == settings
    for bad in ("10.0.0.0/33", "localhost", "10.0.0.0/8;rm"):
        with pytest.raises(ConfigError, match="VCRAWL_ALLOWED_NETWORKS"):
            Settings.from_env({"VCRAWL_ALLOWED_NETWORKS": bad})
    with pytest.raises(ConfigError, match="VCRAWL_ALLOWED_NETWORKS"):
        Settings(allowed_networks=("nope",))


class ScriptedResolver:
    """A scripted resolver (no real DNS here): answers a fixed list of addresses per call."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls: list[str] = []

    def __call__(self, host: str, port: int, *args: Any) -> list[tuple[Any, ...]]:
        self.calls.append(host)
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if not answer:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answer]


def test_a_proxied_target_is_refused_if_any_address_is() -> None:
    cluster = policy(("127.0.0.2/32",))
    check_target("site.test", 80, cluster, ScriptedResolver(["127.0.0.2"]))
    with pytest.raises(BlockedAddress) as blocked:
        check_target("site.test", 80, cluster, ScriptedResolver(["127.0.0.2", "127.0.0.3"]))
    assert blocked.value.addresses == ("127.0.0.3",)
    check_target("unknown.test", 80, cluster, ScriptedResolver([]))  # the proxy may know it: left to it
