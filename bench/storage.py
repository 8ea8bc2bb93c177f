"""Storage throughput: pages to local disk, to the WebHDFS test server, and into WARC; one JSON line.

Run: ``.venv/bin/python bench/storage.py [--pages 2000]`` (``make bench`` runs it). Compare
with the crawl's own request rate (bench/crawl_universe.py) to see whether storage could be
the bottleneck. The WebHDFS figures are against tests/webhdfs_server.py, a
Python stand-in for Hadoop: they bound the client's cost, not a real cluster's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage import LocalBackend, Storage, WarcWriter, WebHdfsBackend
from tests.webhdfs_server import WebHdfsTestServer


def _pages(count: int, size: int) -> list[bytes]:
    rng = random.Random(7)
    words = [f"word{n}" for n in range(500)]
    return [(" ".join(rng.choice(words) for _ in range(size // 8))).encode()[:size] for _ in range(count)]


def _rate(label: str, pages: list[bytes], write) -> dict[str, float]:
    started = time.monotonic()
    for n, body in enumerate(pages):
        write(n, body)
    elapsed = time.monotonic() - started
    total = sum(len(p) for p in pages)
    return {
        f"{label}_pages_per_s": round(len(pages) / elapsed, 1),
        f"{label}_mb_per_s": round(total / elapsed / 2**20, 1),
    }


def main() -> int:
    """Time the three ways of storing pages and a static fetch of the same pages."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=30_000, help="bytes per page (the universe's mean)")
    args = parser.parse_args()
    pages = _pages(args.pages, args.size)
    result: dict[str, float] = {"pages": args.pages, "page_bytes": args.size}
    with tempfile.TemporaryDirectory(
        prefix="vcrawl-bench-storage-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    ) as root:
        local = Storage(root)
        result |= _rate("local_tmpfs", pages, lambda n, body: local.write_bytes(f"pages/p{n}.html", body))
        with WarcWriter(local, "warc", max_file_bytes=256 * 2**20) as warc:
            now = datetime.now(UTC)
            result |= _rate("warc", pages, lambda n, body: warc.write_exchange(
                f"http://bench.test/p{n}.html", request_headers={"User-Agent": "bench"}, status=200, reason="OK",
                response_headers={"Content-Type": "text/html"}, body=body, fetched_at=now))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="vcrawl-bench-disk-") as root:
        disk = Storage(root)
        result |= _rate("local_disk", pages, lambda n, body: disk.write_bytes(f"pages/p{n}.html", body))
    with WebHdfsTestServer() as server:
        factory = partial(WebHdfsBackend, user="bench", allowed_namenodes=[server.namenode])
        hdfs = Storage(f"hdfs://{server.namenode}/crawl", backends={"file": LocalBackend, "hdfs": factory})
        subset = pages[: max(200, args.pages // 4)]
        result |= _rate("webhdfs_test_server", subset, lambda n, body: hdfs.write_bytes(f"pages/p{n}.html", body))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
