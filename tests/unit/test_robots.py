"""robots.txt per RFC 9309: status handling, decoding, caching.

What the rules say is in ``test_robots_matching.py``; the reference parser's own test cases are
in ``test_robots_reference.py``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import frontier.robots
import frontier.robots_groups
from frontier.robots import MAX_ROBOTS_BYTES, RobotsCache, RobotsRules, robots_url

TOKEN = "vcrawl"
SITE = "http://example.com"


def _rules(text: str) -> RobotsRules:
    return RobotsRules.from_response(200, text.encode())


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (200, b"User-agent: *\nDisallow: /x\n", "parsed"),
        (203, b"User-agent: *\nDisallow: /x\n", "parsed"),
        (200, b"", "allow_all"),
        (200, b" \n\n ", "allow_all"),
        (200, None, "allow_all"),
        (301, None, "allow_all"),
        (308, b"moved", "allow_all"),
        (400, None, "allow_all"),
        (401, b"login", "allow_all"),
        (403, b"forbidden", "allow_all"),
        (404, b"<html>not found</html>", "allow_all"),
        (410, None, "allow_all"),
        (429, None, "disallow_all"),
        (500, None, "disallow_all"),
        (503, b"busy", "disallow_all"),
        (599, None, "disallow_all"),
        (None, None, "disallow_all"),
        (100, None, "disallow_all"),
        (600, None, "disallow_all"),
    ],
)
def test_status_decides_the_kind(status: int | None, body: bytes | None, kind: str) -> None:
    assert RobotsRules.from_response(status, body).kind == kind


@pytest.mark.parametrize(
    ("kind", "path", "allowed"),
    [
        ("allow_all", "/anything", True),
        ("disallow_all", "/anything", False),
        ("disallow_all", "/", False),
        ("disallow_all", "/robots.txt", True),
    ],
)
def test_allow_all_and_disallow_all(kind: str, path: str, allowed: bool) -> None:
    rules = RobotsRules(kind)
    assert rules.can_fetch(SITE + path, TOKEN) is allowed
    assert rules.crawl_delay(TOKEN) is None


def test_a_garbage_body_does_not_crash_and_allows() -> None:
    garbage = bytes(range(256)) * 40 + b"\xff\xfe\x00<html><body>Disallow /x</body></html>"
    rules = RobotsRules.from_response(200, garbage)
    assert rules.can_fetch(SITE + "/x", TOKEN)
    assert rules.can_fetch(SITE + "/", TOKEN)
    assert rules.crawl_delay(TOKEN) is None


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    rules = RobotsRules.from_response(200, b"User-agent: *\nDisallow: /caf\xe9\nDisallow: /x\n")
    assert not rules.can_fetch(SITE + "/x", TOKEN)


@pytest.mark.parametrize("mark", [b"\xef\xbb\xbf", b"\xef\xbb", b"\xef"])
def test_a_byte_order_mark_does_not_hide_the_first_line(mark: bytes) -> None:
    # The reference skips as much of a BOM as the file starts with.
    rules = RobotsRules.from_response(200, mark + b"User-agent: *\nDisallow: /x\n")
    assert not rules.can_fetch(SITE + "/x", TOKEN)
    assert rules.text.startswith("User-agent")


def test_sitemap_lines_after_a_byte_order_mark_are_read() -> None:
    body = b"\xef\xbb\xbfSitemap: http://example.com/s.xml\nUser-agent: *\nDisallow: /x\n"
    rules = RobotsRules.from_response(200, body)
    assert rules.sitemaps(SITE + "/robots.txt") == ("http://example.com/s.xml",)
    assert not rules.can_fetch(SITE + "/x", TOKEN)


@pytest.mark.parametrize(
    ("line", "url"),
    [
        ("Sitemap: http://example.com/s.xml", "http://example.com/s.xml"),
        ("Sitemap: /sitemap.xml", "http://example.com:8080/sitemap.xml"),  # crawler-commons: new URL(base, value)
        ("sitemap:sitemaps/a.xml.gz # the products", "http://example.com:8080/sitemaps/a.xml.gz"),
        ("SITEMAP: HTTP://CDN.example.net/s.xml", "http://CDN.example.net/s.xml"),  # the host is the frontier's to fold
        ("Sitemap: //cdn.example.net/s.xml", "http://cdn.example.net/s.xml"),
        ("Site-map: https://example.com/s.xml", "https://example.com/s.xml"),  # a spelling the reference accepts
        ("Sitemap: ftp://example.com/s.xml", None),
        ("Sitemap: mailto:me@example.com", None),
        ("Sitemap:", None),
    ],
)  # fmt: skip
def test_sitemap_lines_are_made_absolute_against_the_robots_txt_url(line: str, url: str | None) -> None:
    rules = _rules(f"User-agent: *\r{line}\rDisallow: /x\r")  # CR alone ends a line too
    assert rules.sitemaps("http://example.com:8080/robots.txt") == ((url,) if url else ())


def test_only_the_first_500_kib_are_parsed() -> None:
    head = b"User-agent: *\nDisallow: /early\n"
    filler = b"# " + b"x" * 97 + b"\n"
    body = head + filler * (2 * 1024 * 1024 // len(filler) + 1) + b"Disallow: /late\n"
    assert len(body) > 2 * 1024 * 1024
    rules = RobotsRules.from_response(200, body)
    assert len(rules.text.encode()) <= MAX_ROBOTS_BYTES
    assert not rules.can_fetch(SITE + "/early", TOKEN)
    assert rules.can_fetch(SITE + "/late", TOKEN)


def test_the_line_cut_at_the_limit_is_dropped() -> None:
    head = b"User-agent: *\nDisallow: /\n"
    cut_line = b"Allow: /public-page\n"
    padding = b"#" * (MAX_ROBOTS_BYTES - len(head) - 9) + b"\n"
    body = head + padding + cut_line  # the limit falls inside "Allow: /public-page"
    assert len(head + padding) < MAX_ROBOTS_BYTES < len(body)
    rules = RobotsRules.from_response(200, body)
    assert not rules.can_fetch(SITE + "/p", TOKEN)  # "Allow: /p" would have allowed it
    assert not rules.can_fetch(SITE + "/public-page", TOKEN)


@pytest.mark.parametrize(
    "rules",
    [
        RobotsRules("allow_all"),
        RobotsRules("disallow_all"),
        _rules("User-agent: *\nDisallow: /x\nCrawl-delay: 2\n# naïve ünïcode\n"),
    ],
)
def test_cache_round_trip(rules: RobotsRules) -> None:
    again = RobotsRules.from_cache(rules.to_cache())
    assert again == rules
    assert again.can_fetch(SITE + "/x", TOKEN) == rules.can_fetch(SITE + "/x", TOKEN)
    assert again.crawl_delay(TOKEN) == rules.crawl_delay(TOKEN)


def test_cache_form_is_compact_json() -> None:
    assert RobotsRules("allow_all").to_cache() == '{"kind":"allow_all","text":""}'


@pytest.mark.parametrize(
    "text", ["", "nope", "[]", '{"kind":"bogus","text":""}', '{"kind":"allow_all"}', '{"kind":"allow_all","text":"x"}']
)
def test_from_cache_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError):
        RobotsRules.from_cache(text)


def test_robots_txt_is_read_once_per_rules_object(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    delays: list[str] = []
    real_directives, real_parse = frontier.robots_groups.directives, frontier.robots.Protego.parse

    def counting_directives(text: str) -> list[frontier.robots_groups.Directive]:
        reads.append(text)
        return real_directives(text)

    def counting_parse(text: str) -> object:
        delays.append(text)
        return real_parse(text)

    monkeypatch.setattr(frontier.robots_groups, "directives", counting_directives)
    monkeypatch.setattr(frontier.robots.Protego, "parse", counting_parse)
    rules = _rules("User-agent: *\nDisallow: /x\nCrawl-delay: 1\n")
    for path in ("/x", "/y", "/z"):
        rules.can_fetch(SITE + path, TOKEN)
        assert rules.crawl_delay(TOKEN) == 1.0
    assert len(reads) == 1
    assert delays == ["User-agent: *\nCrawl-delay: 1\n"]  # Protego sees the chosen group's Crawl-delay only


def test_can_fetch_needs_a_token() -> None:
    with pytest.raises(ValueError):
        RobotsRules("allow_all").can_fetch(SITE + "/", "")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.com/a/b?c#d", "http://example.com/robots.txt"),
        ("https://Example.com:443/x", "https://example.com/robots.txt"),
        ("http://127.0.0.1:8800/x", "http://127.0.0.1:8800/robots.txt"),
        ("http://[::1]:8080/", "http://[::1]:8080/robots.txt"),
    ],
)
def test_robots_url_is_per_origin(url: str, expected: str) -> None:
    assert robots_url(url) == expected


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RedisDouble:
    """Test double, not Redis: the get/set/pttl/pipeline subset RobotsCache uses, with expiry on a FakeClock."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self.data: dict[str, tuple[str | bytes, float | None]] = {}
        self.gets = 0

    def _live(self, key: str) -> tuple[str | bytes, float | None] | None:
        entry = self.data.get(key)
        if entry is not None and entry[1] is not None and entry[1] <= self._clock():
            del self.data[key]
            return None
        return entry

    def get(self, key: str) -> str | bytes | None:
        self.gets += 1
        entry = self._live(key)
        return None if entry is None else entry[0]

    def set(self, key: str, value: str | bytes, ex: int | None = None) -> bool:
        self.data[key] = (value, None if ex is None else self._clock() + ex)
        return True

    def pttl(self, key: str) -> int:
        entry = self._live(key)
        if entry is None:
            return -2
        return -1 if entry[1] is None else int((entry[1] - self._clock()) * 1000)

    def pipeline(self, transaction: bool = True) -> PipelineDouble:
        return PipelineDouble(self)


class PipelineDouble:
    """Test double: queues RedisDouble calls and runs them on execute()."""

    def __init__(self, redis: RedisDouble) -> None:
        self._redis = redis
        self._calls: list[tuple[str, str]] = []

    def get(self, key: str) -> None:
        self._calls.append(("get", key))

    def pttl(self, key: str) -> None:
        self._calls.append(("pttl", key))

    def execute(self) -> list[object]:
        return [getattr(self._redis, name)(key) for name, key in self._calls]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def redis_double(clock: FakeClock) -> RedisDouble:
    return RedisDouble(clock)


def _cache(redis_double: RedisDouble, clock: FakeClock, **kwargs: int) -> RobotsCache:
    return RobotsCache(redis_double, clock=clock, **kwargs)  # type: ignore[arg-type]


PARSED = _rules("User-agent: *\nDisallow: /x\n")


def test_unknown_origin_is_none(redis_double: RedisDouble, clock: FakeClock) -> None:
    assert _cache(redis_double, clock).get(SITE) is None


def test_put_writes_redis_with_a_ttl_by_kind(redis_double: RedisDouble, clock: FakeClock) -> None:
    cache = _cache(redis_double, clock)
    cache.put(SITE, PARSED)
    cache.put("https://down.example", RobotsRules("disallow_all"))
    cache.put("http://gone.example:8080", RobotsRules("allow_all"))
    assert redis_double.data["vcrawl:robots:http://example.com"] == (PARSED.to_cache(), clock.now + 86400)
    assert redis_double.data["vcrawl:robots:https://down.example"][1] == clock.now + 600
    assert redis_double.data["vcrawl:robots:http://gone.example:8080"][1] == clock.now + 86400


def test_put_then_get_is_served_from_the_process(redis_double: RedisDouble, clock: FakeClock) -> None:
    cache = _cache(redis_double, clock)
    cache.put(SITE, PARSED)
    assert cache.get(SITE) is PARSED
    assert redis_double.gets == 0


def test_another_process_reads_redis_once(redis_double: RedisDouble, clock: FakeClock) -> None:
    _cache(redis_double, clock).put(SITE, PARSED)
    other = _cache(redis_double, clock)
    first = other.get(SITE)
    assert first == PARSED
    assert other.get(SITE) is first
    assert redis_double.gets == 1
    assert not first.can_fetch(SITE + "/x", TOKEN)


def test_entries_expire_with_the_redis_key(redis_double: RedisDouble, clock: FakeClock) -> None:
    _cache(redis_double, clock).put(SITE, RobotsRules("disallow_all"))
    clock.now += 590
    other = _cache(redis_double, clock)
    assert other.get(SITE) == RobotsRules("disallow_all")
    clock.now += 11  # the Redis key had 10 s left when `other` read it
    assert other.get(SITE) is None


def test_local_expiry_follows_the_ttl(redis_double: RedisDouble, clock: FakeClock) -> None:
    cache = _cache(redis_double, clock, ttl_s=100)
    cache.put(SITE, PARSED)
    clock.now += 99
    assert cache.get(SITE) is PARSED
    clock.now += 2
    assert cache.get(SITE) is None


def test_forget_local_makes_the_next_get_ask_redis(redis_double: RedisDouble, clock: FakeClock) -> None:
    cache = _cache(redis_double, clock)
    cache.put(SITE, PARSED)
    redis_double.data.clear()  # e.g. an operator deleted the key
    assert cache.get(SITE) is PARSED  # the process's copy still answers
    cache.forget_local(SITE)
    assert cache.get(SITE) is None
    cache.put("http://a.example", PARSED)
    cache.put("http://b.example", PARSED)
    redis_double.data.clear()
    cache.forget_local()
    assert cache.get("http://a.example") is None and cache.get("http://b.example") is None


def test_the_process_cache_is_an_lru(redis_double: RedisDouble, clock: FakeClock) -> None:
    cache = _cache(redis_double, clock, local_size=2)
    for name in ("a", "b"):
        cache.put(f"http://{name}.example", RobotsRules("allow_all"))
    cache.get("http://a.example")  # a is now the most recent
    cache.put("http://c.example", RobotsRules("allow_all"))  # evicts b
    assert redis_double.gets == 0
    cache.get("http://a.example")
    cache.get("http://c.example")
    assert redis_double.gets == 0
    assert cache.get("http://b.example") == RobotsRules("allow_all")
    assert redis_double.gets == 1


def test_the_process_cache_bounds_the_text_it_holds(redis_double: RedisDouble, clock: FakeClock) -> None:
    cache = _cache(redis_double, clock, local_max_chars=len(PARSED.text) + 1)
    cache.put("http://a.example", PARSED)
    cache.put("http://b.example", PARSED)  # evicts a: both texts do not fit
    cache.get("http://b.example")
    assert redis_double.gets == 0
    cache.get("http://a.example")
    assert redis_double.gets == 1


def test_bytes_from_redis_are_accepted(redis_double: RedisDouble, clock: FakeClock) -> None:
    redis_double.set("vcrawl:robots:http://example.com", PARSED.to_cache().encode(), ex=60)
    assert _cache(redis_double, clock).get(SITE) == PARSED


def test_an_unreadable_redis_value_means_unknown(redis_double: RedisDouble, clock: FakeClock) -> None:
    redis_double.set("vcrawl:robots:http://example.com", "not json", ex=60)
    assert _cache(redis_double, clock).get(SITE) is None


@pytest.mark.parametrize("origin", ["example.com", "http://example.com/", "http://example.com/robots.txt", "ftp://x"])
def test_the_cache_takes_origins_only(redis_double: RedisDouble, clock: FakeClock, origin: str) -> None:
    cache = _cache(redis_double, clock)
    with pytest.raises(ValueError):
        cache.get(origin)
    with pytest.raises(ValueError):
        cache.put(origin, PARSED)


def test_the_cache_is_safe_across_threads(redis_double: RedisDouble, clock: FakeClock) -> None:
    cache = _cache(redis_double, clock, local_size=8)

    def work(n: int) -> None:
        for i in range(300):
            origin = f"http://h{(n + i) % 16}.example"
            if cache.get(origin) is None:
                cache.put(origin, PARSED)

    with ThreadPoolExecutor(max_workers=8) as pool:
        for future in [pool.submit(work, n) for n in range(8)]:
            future.result()  # re-raises anything a thread hit
    assert len(cache._local) <= 8
    assert cache._local_chars == sum(len(rules.text) for rules, _ in cache._local.values())
