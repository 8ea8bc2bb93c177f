"""Benchmark of frontier.dedup.BloomFilter on a private redis-server; prints one JSON line.

Run: ``.venv/bin/python bench/bloom.py [--items N] [--error-rate P] [--batch B]``.
Inserts N distinct URLs in batches (timing check+adds/s and the server's CPU), then probes
N never-inserted URLs read-only to measure the false-positive rate at full capacity.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Iterator

import redis

from cli.local_redis import LocalRedis
from frontier.dedup import DEFAULT_SEGMENT_BITS, BloomFilter, expected_fpr

logger = logging.getLogger("bench.bloom")


def _urls(prefix: str, count: int) -> Iterator[str]:
    for i in range(count):
        yield f"http://{prefix}.{i % 250 + 1}:8800/page/{i}.html"


def _batches(urls: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for url in urls:
        batch.append(url)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _server_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


def run(items: int, error_rate: float, batch: int, segment_bits: int = DEFAULT_SEGMENT_BITS) -> dict[str, object]:
    """Fill a fresh filter with ``items`` URLs on a private server and return the figures."""
    with LocalRedis() as server:  # a fresh temp dir, removed on stop
        client = redis.Redis.from_url(server.url)
        bloom = BloomFilter(client, "bench", capacity=items, error_rate=error_rate, segment_bits=segment_bits)
        batches = 0
        reported_seen = 0  # distinct URLs a crawl would have dropped as duplicates
        cpu_before, evalsha_before = _server_cpu_s(client), _calls(client, "evalsha")
        started = time.perf_counter()
        for chunk in _batches(_urls("127.0.1", items), batch):
            reported_seen += sum(bloom.seen_before_many(chunk))
            batches += 1
        insert_s = time.perf_counter() - started
        cpu_s = _server_cpu_s(client) - cpu_before
        evalsha = _calls(client, "evalsha") - evalsha_before
        script_loads = _calls(client, "script|load")

        probe_started = time.perf_counter()
        hits = sum(sum(bloom.has_seen_many(chunk)) for chunk in _batches(_urls("127.0.2", items), batch))
        probe_s = time.perf_counter() - probe_started
        memory = bloom.memory_bytes()
        client.close()
    return {
        "items": items,
        "error_rate": error_rate,
        "batch": batch,
        "bits": bloom.bits,
        "hashes": bloom.hashes,
        "segments": bloom.segments,
        "memory_bytes": memory,
        "bytes_per_url": round(memory / items, 3),
        "theoretical_fpr": round(expected_fpr(bloom.bits, bloom.hashes, items), 6),
        "measured_fpr": round(hits / items, 6),
        "new_urls_reported_seen": reported_seen,
        "adds_per_s": round(items / insert_s),
        "probes_per_s": round(items / probe_s),
        "redis_cpu_us_per_url": round(cpu_s / items * 1e6, 2),
        # One pipeline per batch, plus once per server: the NOSCRIPT reply and the SCRIPT LOAD.
        "round_trips": batches + 2 * script_loads,
        "evalsha_calls": evalsha,
        "script_loads": script_loads,
        "insert_s": round(insert_s, 2),
        "probe_s": round(probe_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the benchmark and print its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000, help="distinct URLs to insert (and to probe)")
    parser.add_argument("--error-rate", type=float, default=0.01, help="target false-positive rate at --items")
    parser.add_argument("--batch", type=int, default=500, help="URLs per seen_before_many call")
    parser.add_argument("--segment-bits", type=int, default=DEFAULT_SEGMENT_BITS, help="bits per segment key")
    args = parser.parse_args(argv)
    if args.items < 1 or args.batch < 1:
        parser.error("--items and --batch must be >= 1")
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(run(args.items, args.error_rate, args.batch, args.segment_bits)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
