"""The Redis Bloom filter against a real redis-server: atomic check-and-add, segments, FPR."""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier.dedup import BloomFilter, bloom_bits, expected_fpr


@pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
def client(request: pytest.FixtureRequest, redis_server: LocalRedis) -> Iterator[redis.Redis]:
    """A client of the session server, with and without ``decode_responses``."""
    with redis.Redis.from_url(redis_server.url, decode_responses=request.param) as connection:
        yield connection


def _name() -> str:
    return f"test-{uuid.uuid4().hex}"


def _urls(prefix: str, count: int) -> list[str]:
    return [f"http://{prefix}.test/page/{i}.html" for i in range(count)]


def test_new_url_is_unseen_once_then_seen(client: redis.Redis) -> None:
    bloom = BloomFilter(client, _name(), capacity=1000)

    assert bloom.seen_before("http://a.test/") is False
    assert bloom.seen_before("http://a.test/") is True
    assert bloom.seen_before("http://a.test/") is True
    assert bloom.seen_before("http://b.test/") is False


def test_batch_results_follow_input_order(client: redis.Redis) -> None:
    bloom = BloomFilter(client, _name(), capacity=1000, segment_bits=1024)
    old = _urls("old", 20)
    new = _urls("new", 20)
    bloom.seen_before_many(old)
    mixed = [url for pair in zip(old, new, strict=True) for url in pair]

    assert bloom.seen_before_many(mixed) == [True, False] * 20


def test_duplicate_inside_one_batch_is_new_only_the_first_time(client: redis.Redis) -> None:
    bloom = BloomFilter(client, _name(), capacity=1000)
    urls = ["http://a.test/1", "http://a.test/2", "http://a.test/1", "http://a.test/1", "http://a.test/2"]

    assert bloom.seen_before_many(urls) == [False, False, True, True, True]


def test_empty_batch_returns_empty_list(client: redis.Redis) -> None:
    bloom = BloomFilter(client, _name(), capacity=1000)

    assert bloom.seen_before_many([]) == []
    assert bloom.has_seen_many([]) == []


def test_unicode_urls_are_distinct_and_remembered(client: redis.Redis) -> None:
    bloom = BloomFilter(client, _name(), capacity=1000)
    urls = ["http://例え.テスト/パス", "http://xn--r8jz45g.xn--zckzah/", "http://a.test/é", "http://a.test/e\u0301"]

    assert bloom.seen_before_many(urls) == [False] * 4
    assert bloom.seen_before_many(urls) == [True] * 4


def test_has_seen_many_never_adds(client: redis.Redis) -> None:
    bloom = BloomFilter(client, _name(), capacity=1000)
    bloom.seen_before("http://a.test/in")

    assert bloom.has_seen_many(["http://a.test/in", "http://a.test/out", "http://a.test/out"]) == [True, False, False]
    assert bloom.seen_before("http://a.test/out") is False


def test_one_url_sets_k_bits_in_one_segment(client: redis.Redis) -> None:
    bloom = BloomFilter(client, _name(), capacity=5000, segment_bits=4096)
    bloom.seen_before("http://a.test/only")

    written = [key for key in bloom.keys if client.exists(key)]
    assert len(written) == 1
    assert client.bitcount(written[0]) == bloom.hashes


def test_segments_use_one_hash_tag_each_and_lose_no_url(client: redis.Redis) -> None:
    name = _name()
    bloom = BloomFilter(client, name, capacity=5000, segment_bits=4096)
    urls = _urls("seg", 5000)

    first = bloom.seen_before_many(urls)
    again = [found for start in range(0, 5000, 500) for found in bloom.seen_before_many(urls[start : start + 500])]

    assert bloom.segments == 12  # 47,926 bits needed, at most 4,096 per segment
    assert bloom.bits >= bloom_bits(5000, 0.01)
    assert bloom.keys == tuple(f"vcrawl:bloom:{{{name}:{i}}}" for i in range(12))
    assert all(client.exists(key) for key in bloom.keys)
    assert sorted(_text(key) for key in client.scan_iter(match=f"vcrawl:bloom:{{{name}:*")) == sorted(bloom.keys)
    assert first.count(True) < 5000 * 0.01  # false positives while filling stay below the final rate
    assert all(again)  # never a false negative
    assert bloom.memory_bytes() == sum(client.strlen(key) for key in bloom.keys) <= bloom.bits // 8


def test_false_positive_rate_matches_theory(client: redis.Redis) -> None:
    bloom = BloomFilter(client, _name(), capacity=20_000, error_rate=0.01)
    inserted = _urls("in", 20_000)
    for start in range(0, len(inserted), 1000):
        bloom.seen_before_many(inserted[start : start + 1000])

    probes = _urls("out", 20_000)
    hits = sum(sum(bloom.has_seen_many(probes[start : start + 1000])) for start in range(0, len(probes), 1000))

    measured = hits / len(probes)
    assert 0.003 < measured < 0.02, (measured, expected_fpr(bloom.bits, bloom.hashes, 20_000))
    assert bloom.memory_bytes() <= bloom.bits // 8


def test_concurrent_writers_each_url_is_new_exactly_once(redis_server: LocalRedis) -> None:
    name = _name()
    urls = _urls("race", 2000)
    barrier = threading.Barrier(8)
    news: Counter[str] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        order = urls[:]
        random.Random(seed).shuffle(order)
        try:
            with redis.Redis.from_url(redis_server.url) as own_client:
                bloom = BloomFilter(own_client, name, capacity=2000, error_rate=1e-9, segment_bits=8192)
                barrier.wait(timeout=10)
                for start in range(0, len(order), 100):
                    batch = order[start : start + 100]
                    fresh = [url for url, seen in zip(batch, bloom.seen_before_many(batch), strict=True) if not seen]
                    with lock:
                        news.update(fresh)
        except BaseException as exc:  # handed to the main thread, which fails the test
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors
    assert len(news) == len(urls)
    assert set(news.values()) == {1}  # exactly one False per URL over all threads


def test_script_flushed_on_server_is_loaded_again(tmp_path: Path) -> None:
    with LocalRedis(tmp_path / "redis") as server, redis.Redis.from_url(server.url) as own_client:
        bloom = BloomFilter(own_client, _name(), capacity=1000, segment_bits=1024)
        assert bloom.seen_before_many(_urls("a", 50)) == [False] * 50
        own_client.script_flush()

        assert bloom.seen_before_many(_urls("a", 50)) == [True] * 50
        assert bloom.seen_before("http://b.test/") is False


def test_clear_forgets_everything(client: redis.Redis) -> None:
    bloom = BloomFilter(client, _name(), capacity=1000, segment_bits=1024)
    bloom.seen_before_many(_urls("c", 100))

    bloom.clear()

    assert not any(client.exists(key) for key in bloom.keys)
    assert bloom.memory_bytes() == 0
    assert bloom.seen_before_many(_urls("c", 100)) == [False] * 100


def test_custom_segment_keys_and_locate_for_inline_scripts(client: redis.Redis) -> None:
    name = _name()
    bloom = BloomFilter(client, name, capacity=5000, segment_bits=4096, segment_key=lambda i: f"{{{name}}}:seg:{i}")
    segment, offsets = bloom.locate("http://a.test/x")

    assert bloom.keys == tuple(f"{{{name}}}:seg:{i}" for i in range(bloom.segments))
    assert bloom.seen_before("http://a.test/x") is False
    assert [client.getbit(bloom.keys[segment], int(offset)) for offset in offsets] == [1] * bloom.hashes
    assert client.bitcount(bloom.keys[segment]) == bloom.hashes == len(set(offsets))


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": 10, "error_rate": 0.0}, "error_rate"),
        ({"capacity": 10, "error_rate": 1.0}, "error_rate"),
        ({"capacity": 10, "segment_bits": 2**32 + 8}, "segment_bits"),
        ({"capacity": 10, "segment_bits": 1001}, "segment_bits"),
        ({"capacity": 10, "name": "a{b}"}, "name"),
        ({"capacity": 10, "name": ""}, "name"),
    ],
)
def test_bad_sizing_is_refused(client: redis.Redis, kwargs: dict[str, object], problem: str) -> None:
    arguments: dict[str, object] = {"name": "bad", **kwargs}
    with pytest.raises(ValueError, match=problem):
        BloomFilter(client, **arguments)  # type: ignore[arg-type]


def _text(key: str | bytes) -> str:
    return key.decode() if isinstance(key, bytes) else key
