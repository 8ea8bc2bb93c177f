"""Redis memory of the frontier per queued and per seen URL, and what one 16 GiB Redis holds.

Run: ``.venv/bin/python bench/frontier_memory.py [--hosts H] [--urls N] [--fetch S] [--capacity C]``
(``make bench-memory``; about a minute). A private redis-server; the real frontier (``engine.jobs.start``,
``admit_links``, the pump, lease, release and analysis admission a polite job's workers run), no
Celery and no HTTP. Three jobs over the same H hosts, one after the other: one-off breadth-first,
one-off priority (its queued URLs are also indexed by URL), and one cycle of a scheduled job
(each fetched page leaves its history record). Each job:

* two seeds per host; the first round is fetched, so every host's structures exist; then each
  second seed's analysis admits N / H links of its host: ``INFO memory`` before and after.
* S of the queued URLs are fetched and analysed one page per batch (a polite job's batches):
  they leave the queues and stay seen. S is a sample, and costs are per URL: linear in S, up to
  the power-of-two steps of Redis's hash tables.

Memory is ``used_memory`` less client and AOF buffers. Prints one JSON line, then a table with
the projection: URLs in 16 GiB with 25 % kept free (``HEADROOM``), each with its Bloom bits.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

# This checkout's packages, not those of the checkout the venv was installed from.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cli.local_redis import LocalRedis
from engine.cycles import start_cycle
from engine.jobs import JobRuntime, Link, admit_links, lease_ms, start
from engine.runtime_cache import RuntimeCache
from fetchers import FetcherRegistry
from frontier import Batch, BatchRelease, Frontier, History, UrlHistory, content_hash
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings

SHARD_BYTES = 16 * 2**30
HEADROOM = 0.25  # fragmentation (jemalloc), replication/AOF buffers, a fork's copy-on-write
SECTIONS = ("en/news/2024/03", "products/catalog/tools", "blog/2024/03/14", "docs/reference/api/v2", "forum/general")
LAST_MODIFIED = "Tue, 14 Nov 2023 22:13:20 GMT"
JOBS = {"one_off": "one-off, breadth-first", "priority": "one-off, priority", "scheduled": "scheduled (one cycle)"}


def used_bytes(client: redis.Redis) -> int:
    """The dataset and its structures: client query/output buffers and the AOF buffer vary from call to call."""
    info = client.info("memory")
    return int(info["used_memory"]) - int(info["mem_clients_normal"]) - int(info.get("mem_aof_buffer", 0))


def key_bytes(client: redis.Redis, job_id: str) -> dict[str, int]:
    """MEMORY USAGE of the job's keys by kind (``q`` = every per-host queue), to see which structure dominates."""
    prefix = f"vcrawl:job:{{{job_id}}}"
    kinds: dict[str, int] = defaultdict(int)
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        rest = key.decode()[len(prefix) :]
        kinds[rest.split(":")[1] if rest else "meta"] += int(client.memory_usage(key, samples=0) or 0)
    return dict(sorted(kinds.items()))


def host_links(host: str, count: int) -> list[Link]:
    """``count`` links of one host (63-76 bytes, 70 on average with 1,000 hosts), as a page's analysis finds them."""
    paths = (f"{SECTIONS[n % len(SECTIONS)]}/article-{n}.html?ref=home&x={n % 7}" for n in range(count))
    return [Link(f"http://{host}/{path}", 1, 5) for path in paths]


def spec_of(job_id: str, hosts: int, capacity: int, strategy: str = "breadth-first") -> JobSpec:
    """A polite job (the defaults: 0.25 s, one request at a time per host) over ``hosts`` hosts."""
    seeds = [f"http://host-{h}.example/{page}" for page in ("", "about.html") for h in range(hosts)]
    scope, dedup = {"domains": ["example"]}, {"expected_urls": capacity}
    spec = dict(id=job_id, seeds=seeds, max_pages=10**9, sitemaps=False, strategy=strategy, scope=scope, dedup=dedup)
    return JobSpec.from_dict(spec)


def fetch_pages(
    frontier: Frontier,
    runtime: JobRuntime,
    pages: int,
    links_of: Callable[[Batch], Sequence[Link]],
    hosts: int,
) -> int:
    """Lease, release and analyse ``pages`` URLs the way a worker does (fetch_batch, analyze_batch), no HTTP.

    Each host is handed out once a round (one request at a time); the pause is 0 so rounds follow
    at once: pacing changes when a URL is fetched, not what it leaves in Redis.
    """
    job_id, lease, fetched = runtime.job_id, lease_ms(runtime), 0
    while fetched < pages:
        pumped = frontier.queue.pump(
            job_id,
            max_batches=min(hosts, pages - fetched),
            batch_size=runtime.batch_size,
            per_host=runtime.spec.politeness.per_host,
            interval_ms=0,
            lease_ms=lease,
            cap=hosts,
        )
        if not pumped.batches:
            break
        for batch in pumped.batches:
            frontier.queue.start_lease(job_id, batch.batch_id, lease)
            urls = [entry.url for entry in batch.entries]
            # Kept in `released` until the analysis admits (what a worker killed in between resends).
            handed = json.dumps({"job": job_id, "batch": batch.batch_id, "pages": [{"url": url} for url in urls]})
            counters = {"fetched": len(urls), "stored": len(urls), "status:200": len(urls)}
            release = BatchRelease(pause_ms=0, done=0, host_done=len(urls), handed_on=handed, counters=counters)
            frontier.queue.release(job_id, batch, release)
            history = {entry.url: visited(runtime, entry.url, entry.depth) for entry in batch.entries}
            admit_links(
                runtime,
                frontier,
                links_of(batch),
                done=len(urls),
                token=f"a:{batch.batch_id}",
                counters=Counter(analysed=len(urls)),
                history=history if runtime.cycle else None,
                analysed_batch=batch.batch_id,
            )
            fetched += len(urls)
    return fetched


def visited(runtime: JobRuntime, url: str, depth: int) -> UrlHistory:
    """A scheduled job's record of a page fetched with an ETag and a Last-Modified (what a revisit sends back)."""
    headers = {"etag": f'"{content_hash(url.encode())[:12]}"', "last-modified": LAST_MODIFIED}
    return UrlHistory(depth).after_visit(
        cycle_started_s=runtime.cycle_started_s,
        revisit=runtime.spec.revisit,
        status=200,
        headers=headers,
        digest=content_hash(url.encode()),
    )


def measure(client: redis.Redis, frontier: Frontier, runtime: JobRuntime, urls: int, fetch: int) -> dict[str, Any]:
    """Queue ``urls`` links over the job's hosts, then fetch ``fetch`` of them; bytes per queued and seen URL."""
    hosts = len(runtime.spec.seeds) // 2
    per_host = urls // hosts
    fetch_pages(frontier, runtime, hosts, lambda batch: (), hosts)  # the first seeds: every host is known
    before = used_bytes(client)
    started = time.monotonic()
    fetch_pages(frontier, runtime, hosts, lambda batch: host_links(batch.host, per_host), hosts)
    admit_s, queued = time.monotonic() - started, per_host * hosts
    after_admit = used_bytes(client)
    keys_queued = key_bytes(client, runtime.job_id)
    started = time.monotonic()
    fetched = fetch_pages(frontier, runtime, fetch, lambda batch: (), hosts)
    fetch_s, after_fetch = time.monotonic() - started, used_bytes(client)
    # Admission: +queued URLs, and the H second seeds went from queued to seen; the fetch: S URLs
    # went from queued to seen. Two equations: (seen - queued) per URL, then queued per URL.
    seen_minus_queued = (after_fetch - after_admit) / fetched
    per_queued = (after_admit - before - hosts * seen_minus_queued) / queued
    keys_fetched = key_bytes(client, runtime.job_id)
    # By key: the queues' bytes per URL they hold; what the fetches added elsewhere, per fetched URL.
    still_queued = queued + hosts - fetched
    grown = {
        kind: round((size - keys_queued.get(kind, 0)) / fetched, 1)
        for kind, size in keys_fetched.items()
        if kind not in ("q", "queued-urls", "inlinks") and abs(size - keys_queued.get(kind, 0)) >= fetched
    }
    url_bytes = sum(len(link.url) for link in host_links("host-500.example", per_host)) / per_host
    queue_bytes = sum(keys_fetched.get(kind, 0) for kind in ("q", "queued-urls"))
    return {
        "hosts": hosts, "queued_urls": queued, "fetched_urls": fetched, "url_bytes_mean": round(url_bytes, 1),
        "bytes_per_queued_url": round(per_queued, 1), "bytes_per_seen_url": round(per_queued + seen_minus_queued, 1),
        "queue_key_bytes_per_url": round(queue_bytes / still_queued, 1), "seen_key_bytes_per_url": grown,
        "admit_s": round(admit_s, 1), "fetch_s": round(fetch_s, 1), "keys": keys_fetched,
    }  # fmt: skip


def project(per_url: float, bloom_per_url: float) -> int:
    """URLs one shard holds at this cost: every URL also has its Bloom bits (sized for it)."""
    return int(SHARD_BYTES * (1 - HEADROOM) / (per_url + bloom_per_url))


def run(hosts: int, urls: int, fetch: int, capacity: int) -> dict[str, Any]:
    """The three jobs on one private redis-server, one after the other; the figures."""
    settings, fetchers = Settings(), FetcherRegistry({})
    with tempfile.TemporaryDirectory(prefix="vcrawl-memory-") as directory, LocalRedis(directory) as server:
        client = redis.Redis.from_url(server.url)
        frontier = Frontier(client)
        runtimes = RuntimeCache(frontier, settings, None, client)

        def cycle_of(job_id: str, strategy: str = "breadth-first") -> JobRuntime:
            spec = spec_of(job_id, hosts if job_id != "warm-cycle" else 2, capacity, strategy)
            started = start_cycle(spec, frontier=frontier, runtimes=runtimes, fetchers=fetchers,
                                  history=History(client), client=client, firing="f1")  # fmt: skip
            return runtimes.get(job_id, started.cycle)

        # A tiny job of each kind first: the scripts are loaded (and counted) before anything is measured.
        warm = start(spec_of("warm", 2, capacity), frontier, runtimes, fetchers)
        fetch_pages(frontier, runtimes.get(warm), 2, lambda batch: (), 2)
        fetch_pages(frontier, cycle_of("warm-cycle"), 2, lambda batch: (), 2)
        runtime = runtimes.get(start(spec_of("one-off", hosts, capacity), frontier, runtimes, fetchers))
        bloom = runtime.bloom  # allocated whole by the seeds' admission: a BITFIELD near its end
        result: dict[str, Any] = {
            "bloom_capacity": capacity, "bloom_error_rate": runtime.spec.dedup.error_rate, "bloom_bits": bloom.bits,
            "bloom_hashes": bloom.hashes, "bloom_bytes": sum(client.memory_usage(key, samples=0) for key in bloom.keys),
        }  # fmt: skip
        result["one_off"] = measure(client, frontier, runtime, urls, fetch)
        priority = runtimes.get(start(spec_of("priority", hosts, capacity, "priority"), frontier, runtimes, fetchers))
        result["priority"] = measure(client, frontier, priority, urls, fetch)
        result["scheduled"] = measure(client, frontier, cycle_of("scheduled"), urls, fetch)
        memory = client.info("memory")
        result["redis"] = {key: memory[key] for key in ("used_memory", "used_memory_rss", "mem_fragmentation_ratio")}
        result["redis"]["version"] = client.info("server")["redis_version"]
    bloom_per_url = result["bloom_bytes"] / capacity
    result["bloom_bytes_per_capacity_url"] = round(bloom_per_url, 2)
    result["shard"] = {"bytes": SHARD_BYTES, "headroom": HEADROOM}
    for job in JOBS:
        for state in ("queued", "seen"):
            result["shard"][f"{state}_urls_{job}"] = project(result[job][f"bytes_per_{state}_url"], bloom_per_url)
    return result


def table(result: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    bloom, shard = result["bloom_bytes_per_capacity_url"], result["shard"]
    lines = ["| job | bytes per queued URL | per seen URL | queued URLs in 16 GiB | seen URLs in 16 GiB |",
             "|---|---|---|---|---|"]  # fmt: skip
    for job, name in JOBS.items():
        figures = result[job]
        lines.append(
            f"| {name} | {figures['bytes_per_queued_url']} | {figures['bytes_per_seen_url']} "
            f"| {shard[f'queued_urls_{job}'] / 1e6:,.0f} M | {shard[f'seen_urls_{job}'] / 1e6:,.0f} M |"
        )
    lines.append(
        f"\nPlus the Bloom filter: {result['bloom_bytes']:,} bytes for {result['bloom_capacity']:,} URLs "
        f"at {result['bloom_error_rate']} ({bloom} bytes per URL of capacity, {result['bloom_hashes']} "
        f"hashes), allocated whole at the job's first admission; counted per URL in the projection."
    )
    lines.append(
        f"16 GiB with {HEADROOM:.0%} kept free: {SHARD_BYTES * (1 - HEADROOM) / 2**30:g} GiB for the frontier."
    )
    for job, name in JOBS.items():  # MEMORY USAGE's estimates, to tell which structure it is
        figures = result[job]
        lines.append(f"{name}: queues {figures['queue_key_bytes_per_url']} bytes per queued URL; "
                     f"added per fetched URL: {figures['seen_key_bytes_per_url']}")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    """Parse the options, run, print the JSON line and the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--urls", type=int, default=200_000, help="URLs each job queues")
    parser.add_argument("--fetch", type=int, default=20_000, help="of them fetched: the seen sample")
    parser.add_argument("--capacity", type=int, default=1_000_000, help="the Bloom filter's (DedupSpec's default)")
    args = parser.parse_args()
    result = run(args.hosts, args.urls, args.fetch, args.capacity)
    print(json.dumps(result), flush=True)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
