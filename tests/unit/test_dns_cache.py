"""The per-process DNS cache as pure code: a scripted resolver and clock, no sockets, no sleeps."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from fetchers import DnsCache, DnsCacheStats
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Resolver:
    """Answers each name with its scripted addresses (others do not resolve); records every call."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, host: str, port: Any, family: int = 0, kind: int = 0, proto: int = 0, flags: int = 0) -> list:
        self.calls.append((host, port, family, kind, proto, flags))
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port or 0)) for address in self.answers[host]]


def addresses(found: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [info[4] for info in found]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def resolver() -> Resolver:
    return Resolver({"a.test": ["192.0.2.1", "192.0.2.2"], "b.test": ["192.0.2.3"], "c.test": ["192.0.2.4"]})


def test_a_fresh_answer_is_served_from_the_cache_with_each_call_s_port(resolver: Resolver, clock: Clock) -> None:
    cache = DnsCache(resolver, ttl_s=60, clock=clock)
    first = cache("a.test", 80, socket.AF_INET, socket.SOCK_STREAM)
    second = cache("A.test.", 443, socket.AF_INET, socket.SOCK_STREAM)  # one name, however spelt

    assert addresses(first) == [("192.0.2.1", 80), ("192.0.2.2", 80)]
    assert addresses(second) == [("192.0.2.1", 443), ("192.0.2.2", 443)]
    assert len(resolver.calls) == 1 and resolver.calls[0][1] is None  # resolved once, without a port
    assert cache.stats() == DnsCacheStats(lookups=1, hits=1, failures=0, names=1)


def test_an_answer_expires_after_its_ttl(resolver: Resolver, clock: Clock) -> None:
    cache = DnsCache(resolver, ttl_s=60, clock=clock)
    cache("a.test", 80)
    clock.now += 59.9
    cache("a.test", 80)
    assert len(resolver.calls) == 1
    resolver.answers["a.test"] = ["192.0.2.9"]  # the site moved
    clock.now += 0.1
    assert addresses(cache("a.test", 80)) == [("192.0.2.9", 80)]
    assert len(resolver.calls) == 2


def test_a_failed_lookup_is_kept_briefly(resolver: Resolver, clock: Clock) -> None:
    cache = DnsCache(resolver, ttl_s=60, negative_ttl_s=5, clock=clock)
    for _ in range(3):
        with pytest.raises(socket.gaierror) as failed:
            cache("dead.test", 80)
        assert failed.value.errno == socket.EAI_NONAME
    assert len(resolver.calls) == 1
    resolver.answers["dead.test"] = ["192.0.2.7"]
    clock.now += 5
    assert addresses(cache("dead.test", 80)) == [("192.0.2.7", 80)]
    assert cache.stats() == DnsCacheStats(lookups=2, hits=2, failures=1, names=1)


def test_the_least_recently_used_name_goes_first(resolver: Resolver, clock: Clock) -> None:
    cache = DnsCache(resolver, max_names=2, clock=clock)
    cache("a.test", 80)
    cache("b.test", 80)
    cache("a.test", 80)  # a.test is now the most recent
    cache("c.test", 80)  # b.test makes room
    assert cache.stats().names == 2
    cache("a.test", 80)
    assert [call[0] for call in resolver.calls] == ["a.test", "b.test", "c.test"]
    cache("b.test", 80)
    assert [call[0] for call in resolver.calls] == ["a.test", "b.test", "c.test", "b.test"]


def test_size_zero_keeps_nothing(resolver: Resolver, clock: Clock) -> None:
    cache = DnsCache(resolver, max_names=0, clock=clock)
    cache("a.test", 80)
    cache("a.test", 80)
    assert cache.stats() == DnsCacheStats(lookups=2, hits=0, failures=0, names=0)


@pytest.mark.parametrize("literal", ["192.0.2.1", "::1", "fe80::1%eth0"])
def test_ip_literals_are_never_looked_up_or_kept(literal: str, clock: Clock) -> None:
    seen: list[tuple[Any, ...]] = []

    def numeric_only(host: str, port: Any, family: int = 0, kind: int = 0, proto: int = 0, flags: int = 0) -> list:
        seen.append((host, flags))
        return [(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, 6, "", (host, port))]

    cache = DnsCache(numeric_only, clock=clock)
    assert addresses(cache(literal, 80)) == [(literal, 80)]
    cache(literal, 80)
    assert seen == [(literal, socket.AI_NUMERICHOST)] * 2  # AI_NUMERICHOST: getaddrinfo asks no server
    assert cache.stats() == DnsCacheStats(lookups=0, hits=0, failures=0, names=0)


def test_ipv6_answers_keep_flow_and_scope(clock: Clock) -> None:
    def v6(host: str, port: Any, *args: Any) -> list:
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2001:db8::1", port or 0, 0, 3))]

    assert addresses(DnsCache(v6, clock=clock)("six.test", 8443)) == [("2001:db8::1", 8443, 0, 3)]


def test_families_are_kept_apart(resolver: Resolver, clock: Clock) -> None:
    cache = DnsCache(resolver, clock=clock)
    cache("a.test", 80, socket.AF_INET, socket.SOCK_STREAM)
    cache("a.test", 80, socket.AF_UNSPEC, socket.SOCK_STREAM)
    assert len(resolver.calls) == 2


def test_an_error_that_is_no_answer_is_not_kept(clock: Clock) -> None:
    calls = []

    def bad_idna(host: str, *args: Any) -> list:
        calls.append(host)
        raise UnicodeError("label too long")

    cache = DnsCache(bad_idna, clock=clock)
    for _ in range(2):
        with pytest.raises(UnicodeError):
            cache("x" * 70 + ".test", 80)
    assert len(calls) == 2 and cache.stats().names == 0


def test_threads_missing_one_name_share_one_lookup(clock: Clock) -> None:
    release = threading.Event()
    calls = []

    def slow(host: str, port: Any, *args: Any) -> list:
        calls.append(host)
        release.wait(5)  # held until every thread has asked (no sleep: an event)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", port or 0))]

    cache = DnsCache(slow, clock=clock)
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(cache("a.test", 80))) for _ in range(8)]
    for thread in threads:
        thread.start()
    while cache.stats().hits < 7:  # the seven others are waiting for the first one's lookup
        threading.Event().wait(0.001)
    release.set()
    for thread in threads:
        thread.join(5)
    assert calls == ["a.test"]
    assert [addresses(found) for found in results] == [[("192.0.2.1", 80)]] * 8


def test_from_settings_and_its_checks() -> None:
    cache = DnsCache.from_settings(Settings(dns_cache_size=10, dns_ttl_s=30, dns_negative_ttl_s=2))
    assert cache.stats().names == 0
    env = Settings.from_env({"VCRAWL_DNS_CACHE_SIZE": "100", "VCRAWL_DNS_TTL_S": "120"})
    assert (env.dns_cache_size, env.dns_ttl_s, env.dns_negative_ttl_s) == (100, 120.0, 5.0)
    with pytest.raises(ConfigError, match="VCRAWL_DNS_TTL_S"):
        Settings(dns_ttl_s=0.5)
    with pytest.raises(ConfigError, match="VCRAWL_DNS_TTL_S"):
        Settings(dns_ttl_s=7200)
    with pytest.raises(ConfigError, match="VCRAWL_DNS_NEGATIVE_TTL_S"):
        Settings(dns_ttl_s=10, dns_negative_ttl_s=20)
    with pytest.raises(ConfigError, match="VCRAWL_DNS_CACHE_SIZE"):
        Settings.from_env({"VCRAWL_DNS_CACHE_SIZE": "-1"})
