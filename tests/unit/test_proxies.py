"""Proxy pool health as plain functions: whose fault a failure is, which proxy is drawn, the counts."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import requests
import urllib3.exceptions

from fetchers import FetchResult
from fetchers.proxies import (
    PROXY_FAULTS,
    ProxyHealth,
    is_proxy_fault,
    pick_proxy,
    proxy_counter,
    proxy_error_reason,
    proxy_stats,
    response_fault,
)
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings

POOL = ["http://a.proxy:3128", "http://user:pw@b.proxy:3128", "http://c.proxy:3128"]


def test_a_proxy_cooling_off_is_never_drawn() -> None:
    cooling = {"http://user:***@b.proxy:3128": 50.0}  # keyed as masked, like the bench in Redis
    drawn = Counter(pick_proxy(POOL, cooling, now=10.0, rng=random.Random(seed)) for seed in range(300))
    assert set(drawn) == {POOL[0], POOL[2]} and min(drawn.values()) > 100


def test_a_proxy_whose_cooloff_ended_is_drawn_again() -> None:
    cooling = {"http://a.proxy:3128": 9.0, "http://c.proxy:3128": 9.0}
    assert {pick_proxy(POOL, cooling, now=10.0, rng=random.Random(seed)) for seed in range(50)} == set(POOL)


def test_with_every_proxy_cooling_off_the_one_back_first_is_drawn() -> None:
    cooling = {"http://a.proxy:3128": 30.0, "http://user:***@b.proxy:3128": 20.0, "http://c.proxy:3128": 40.0}
    assert {pick_proxy(POOL, cooling, now=10.0, rng=random.Random(seed)) for seed in range(20)} == {POOL[1]}


def test_an_empty_pool_draws_no_proxy() -> None:
    assert pick_proxy([], {}, now=0.0) is None


def result(status: int, **headers: str) -> FetchResult:
    return FetchResult(url="http://x.test/", final_url="http://x.test/", status=status,
                       headers={k.replace("_", "-"): v for k, v in headers.items()})  # fmt: skip


@pytest.mark.parametrize(
    ("status", "proxy_status", "fault"),
    [
        (407, None, "proxy_auth"),  # RFC 9110 §15.5.8: only a proxy sends 407
        (502, None, None),  # could be the origin's, or the proxy not reaching it: the origin's trouble
        (504, None, None),
        (502, "squid; error=proxy_internal_error", "proxy_5xx"),
        (503, "envoy; error=proxy_configuration_error", "proxy_5xx"),
        (502, "px; error=connection_limit_reached", "proxy_5xx"),
        (502, "px; error=connection_refused", None),  # the destination refused: the origin's trouble
        (504, "px; error=connection_timeout", None),
        (502, "px; error=dns_error; rcode=NXDOMAIN", None),
        (502, "inner; error=proxy_internal_error, outer; error=http_response_incomplete", None),  # the nearest one
        (502, 'outer; error=proxy_loop_detected; details="a, b; c"', "proxy_5xx"),
        (502, 'px; details="error=proxy_internal_error"', None),  # not the error parameter
        (200, "px; error=proxy_internal_error", None),  # not a failure at all
        (404, None, None),
        (200, None, None),
    ],
)
def test_response_fault(status: int, proxy_status: str | None, fault: str | None) -> None:
    headers = {} if proxy_status is None else {"proxy_status": proxy_status}
    assert response_fault(result(status, **headers)) == fault


def proxy_error(original: Exception) -> requests.exceptions.ProxyError:
    """A ProxyError as requests raises it: MaxRetryError(reason=urllib3 ProxyError(msg, original))."""
    wrapped = urllib3.exceptions.ProxyError("Unable to connect to proxy", original)
    return requests.exceptions.ProxyError(urllib3.exceptions.MaxRetryError(None, "http://x.test/", wrapped))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("original", "reason", "status"),
    [
        (urllib3.exceptions.NewConnectionError(None, "Failed to establish a new connection: [Errno 111]"),  # type: ignore[arg-type]
         "proxy_error", None),
        (urllib3.exceptions.ConnectTimeoutError(None, "Connection to 127.0.0.1 timed out"), "proxy_timeout", None),
        (TimeoutError("timed out"), "proxy_timeout", None),
        (OSError("Tunnel connection failed: 407 Proxy Authentication Required"), "proxy_auth", 407),
        (OSError("Tunnel connection failed: 403 Forbidden"), "proxy_refused", 403),
        (OSError("Tunnel connection failed: 503 Service Unavailable"), "proxy_refused", 503),
        (OSError("Tunnel connection failed: 502 Bad Gateway"), "http_502", 502),
        (OSError("Tunnel connection failed: 504 Gateway Timeout"), "http_504", 504),
        (ConnectionResetError(104, "Connection reset by peer"), "proxy_error", None),
        (OSError("Your proxy appears to only use HTTP and not HTTPS"), "proxy_error", None),
    ],
)  # fmt: skip
def test_proxy_error_reason(original: Exception, reason: str, status: int | None) -> None:
    assert proxy_error_reason(proxy_error(original)) == (reason, status)


def test_a_bare_proxy_error_is_a_proxy_error() -> None:
    assert proxy_error_reason(requests.exceptions.ProxyError("no details")) == ("proxy_error", None)


def test_proxy_faults_are_the_proxy_reasons_and_nothing_of_the_origin() -> None:
    assert all(is_proxy_fault(reason) for reason in PROXY_FAULTS)
    for reason in ("timeout", "connection_error", "http_502", "http_407", "incomplete_body", "no_healthy_proxy"):
        assert not is_proxy_fault(reason)


def test_proxy_counts_round_trip_through_job_counters_with_the_password_masked() -> None:
    counters: Counter[str] = Counter()
    outcomes = [(POOL[0], None)] * 5 + [(POOL[1], None)] * 2 + [(POOL[1], "proxy_auth")] * 3
    outcomes += [(POOL[1], "proxy_error"), (POOL[1], "timeout"), (POOL[2], "proxy_5xx")]
    for proxy, reason in outcomes:
        counters[proxy_counter(proxy, reason)] += 1
    counters.update({"fetched": 7, "failed:http_404": 1, "status:200": 7})  # the job's other counters
    assert all("pw" not in name for name in counters)
    assert proxy_stats(counters) == {
        "http://a.proxy:3128": {"ok": 5, "failed": 0, "errors": 0, "reasons": {}},
        "http://user:***@b.proxy:3128": {"ok": 2, "failed": 4, "errors": 1,
                                         "reasons": {"proxy_auth": 3, "proxy_error": 1}},
        "http://c.proxy:3128": {"ok": 0, "failed": 1, "errors": 0, "reasons": {"proxy_5xx": 1}},
    }  # fmt: skip


def test_cooloff_settings() -> None:
    settings = Settings.from_env({"VCRAWL_PROXY_COOLOFF_S": "5", "VCRAWL_PROXY_COOLOFF_MAX_S": "40"})
    assert (settings.proxy_cooloff_s, settings.proxy_cooloff_max_s) == (5.0, 40.0)
    assert (Settings().proxy_cooloff_s, Settings().proxy_cooloff_max_s) == (60.0, 900.0)
    with pytest.raises(ConfigError, match="VCRAWL_PROXY_COOLOFF_MAX_S"):
        Settings.from_env({"VCRAWL_PROXY_COOLOFF_S": "1000"})  # over the default cap


class BenchDouble:
    """Test double, not Redis: the bench hash and clock ProxyHealth reads, and its mark script.

    A pipeline's round trip takes ``round_trip_s`` on the local clock; Redis reads its own clock
    halfway through it, as a real server does somewhere between the send and the answer.
    """

    def __init__(self, clock: list[float], round_trip_s: float = 0.0) -> None:
        self.clock, self.round_trip_s = clock, round_trip_s
        self.bench: dict[str, str] = {}  # masked proxy -> "<until ms>:<strikes>" on Redis's clock
        self.server_offset_s = 5000.0  # Redis's clock is not the local one

    def server_ms(self) -> int:
        return round((self.clock[0] + self.server_offset_s) * 1000)

    def register_script(self, source: str) -> object:
        def mark(keys: list[str], args: list[object]) -> list[int]:
            name, base_ms = str(args[0]), int(args[1])  # a fresh mark, as proxy_mark.lua makes it
            self.bench[name] = f"{self.server_ms() + base_ms}:1"
            return [base_ms, 0, 1]

        return mark if "strikes" in source else (lambda keys, args: 1)  # proxy_mark.lua; proxy_clear.lua

    def pipeline(self, transaction: bool = True) -> BenchDouble:
        return self

    def time(self) -> None:
        pass

    def hgetall(self, key: str) -> None:
        pass

    def execute(self) -> list[object]:
        self.clock[0] += self.round_trip_s / 2
        now_ms = self.server_ms()
        answer = [(now_ms // 1000, (now_ms % 1000) * 1000), dict(self.bench)]
        self.clock[0] += self.round_trip_s / 2
        return answer


def health_on(bench: BenchDouble, **options: float) -> ProxyHealth:
    return ProxyHealth(bench, clock=lambda: bench.clock[0], **options)


def test_a_cooloff_read_from_redis_ends_late_by_the_round_trip_never_early() -> None:
    bench = BenchDouble([100.0], round_trip_s=0.2)
    bench.bench["http://p.proxy:1"] = f"{bench.server_ms() + 5000}:1"  # benched by another worker: ends at 105.0
    left = health_on(bench).cooling()["http://p.proxy:1"]  # read over a 0.2 s round trip: now 100.2
    assert 4.8 <= left <= 4.9 + 1e-6  # 4.8 true; up to 4.9 (Redis read its clock 0.1 s in); 4.7 had `now` been early


def test_forget_local_drops_this_processs_marks_and_reads_redis_again() -> None:
    bench = BenchDouble([100.0])
    health = health_on(bench, cooloff_s=30.0, refresh_s=1.0)
    pool = ["http://a.proxy:1", "http://b.proxy:1"]
    health.record(pool[0], "proxy_error")
    health.record(pool[1], "proxy_error")
    bench.bench.clear()  # the Redis hash deleted (as a test's fixture does): the marks stay in this process
    assert set(health.cooling()) == {"http://a.proxy:1", "http://b.proxy:1"}
    health.forget_local(pool[0])
    assert set(health.cooling()) == {"http://b.proxy:1"}
    health.forget_local()
    assert health.cooling() == {} and health.has_healthy(pool)
    bench.bench["http://a.proxy:1"] = f"{bench.server_ms() + 9000}:1"  # benched elsewhere since
    health.forget_local()
    assert set(health.cooling()) == {"http://a.proxy:1"}  # read from Redis at once, not after refresh_s
