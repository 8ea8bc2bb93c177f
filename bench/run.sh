#!/usr/bin/env bash
# The benchmark: vcrawl against Scrapy, Crawlee and the ceiling client on the shared synthetic web
# and on a real documentation site, cases (a)-(e) side by side with their ratios; then browser
# pages, storage, re-crawl and the Bloom filter. Prints JSON lines and tables. Not part of
# `make test`; about 25 minutes. `bench/run.sh compare [--cases a e]` runs only the comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT="${VCRAWL_BENCH_KIT:-$(pwd)/../shared/bench}"
BENCH_PY="${BENCH_PY:-/tmp/venv-bench/bin/python}"
export BENCH_PY VCRAWL_BENCH_KIT="$KIT"
OUT="${BENCH_OUT:-/tmp/vcrawl-bench.jsonl}"

# `bench/run.sh memory [options]` (make bench-memory): Redis bytes per queued and per seen URL, and
# what a 16 GiB Redis holds. A private redis-server only: none of the kit below is needed.
if [ "${1:-}" = memory ]; then
  shift
  exec .venv/bin/python bench/frontier_memory.py "$@"
fi

# The kit's own requirements (Scrapy baseline, aiohttp/nginx servers, psutil), as its README says.
if [ ! -x "$BENCH_PY" ]; then
  python3 -m venv "$(dirname "$(dirname "$BENCH_PY")")"
  "$BENCH_PY" -m pip install -q -r "$KIT/requirements.txt"
fi
command -v nginx >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light; }
# Case (e) crawls Debian's Python documentation; without it compare.py skips (e) and says why.
DOC=/usr/share/doc/python3.11/html/index.html
[ -f "$DOC" ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11-doc; } ||
  echo "bench/run.sh: could not install python3.11-doc; case (e) will not run" >&2
# The kit's Crawlee baseline, in its own venv (its pins differ from Scrapy's); (a) notes it as skipped without it.
CRAWLEE_PY="${CRAWLEE_PY:-/tmp/venv-crawlee/bin/python}"
export CRAWLEE_PY
if [ ! -x "$CRAWLEE_PY" ]; then
  { python3 -m venv "$(dirname "$(dirname "$CRAWLEE_PY")")" &&
    "$CRAWLEE_PY" -m pip install -q -r "$KIT/crawlee_baseline/requirements.txt"; } ||
    echo "bench/run.sh: could not set up the Crawlee baseline venv; (a) runs without Crawlee" >&2
fi

# `bench/run.sh soak [bench/soak.py options]` (make soak): the long soak alone, not the matrix below.
if [ "${1:-}" = soak ]; then
  shift
  echo ">>> soak: bench/soak.py $* (default: 20 concurrent jobs for 10 minutes)" >&2
  exec .venv/bin/python bench/soak.py "$@"
fi

# `bench/run.sh ring [options]` (make ring-experiment): the host ring experiment A150 B80 C200 D40, -C, +E300.
if [ "${1:-}" = ring ]; then
  shift
  exec .venv/bin/python bench/ring_experiment.py "$@"
fi

# `bench/run.sh scale [options]` (make scale-out): pages/s with 1, 2 and 4 nodes, ring and shared queue.
if [ "${1:-}" = scale ]; then
  shift
  exec .venv/bin/python bench/scale_out.py "$@"
fi

# `bench/run.sh polite [options]` (make bench-polite): a polite page against an impolite one, per Redis.
if [ "${1:-}" = polite ]; then
  shift
  exec .venv/bin/python bench/polite.py "$@"
fi

# `bench/run.sh analysis [options]` (make bench-analysis): batch analysis pages/s with 1 and 2 analysis processes.
if [ "${1:-}" = analysis ]; then
  shift
  exec .venv/bin/python bench/batch_analysis.py "$@"
fi

# `bench/run.sh engines [options]`: batch analysis pages/s on the chord and on Spark local[2], one cached 20k-page crawl.
if [ "${1:-}" = engines ]; then
  shift
  exec .venv/bin/python bench/analysis_engines.py "$@"
fi

# `bench/run.sh dead-worker [options]`: seconds from a killed worker or a restarted Redis to the job's completion.
if [ "${1:-}" = dead-worker ]; then
  shift
  exec .venv/bin/python bench/dead_worker.py "$@"
fi

# `bench/run.sh brokers [options]`: the Redis broker against RabbitMQ on one job: pages/s, a killed worker, a broker restart.
if [ "${1:-}" = brokers ]; then
  shift
  exec .venv/bin/python bench/brokers.py "$@"
fi

if [ "${1:-}" = compare ]; then
  shift
  exec .venv/bin/python bench/compare.py "$@"
fi

: > "$OUT"
echo ">>> vcrawl vs Scrapy, Crawlee and the ceiling client: cases (a) (d) (b) (c) (e), side by side" >&2
.venv/bin/python bench/compare.py --cases u t l a d b c e p --rounds 1 --out /tmp/vcrawl-compare.jsonl
echo ">>> dynamic: one browser on the universe's lazy-loading pages" >&2
.venv/bin/python bench/dynamic.py --pages 100 | tee -a "$OUT"
echo ">>> storage: pages to tmpfs, disk, the WebHDFS test server, and WARC" >&2
.venv/bin/python bench/storage.py --pages 2000 | tee -a "$OUT"
echo ">>> re-crawl: 10 hosts x 5000 pages, cycle 2 after editing 10 % of the pages" >&2
.venv/bin/python bench/recrawl.py --hosts 10 --pages 5000 --changed 0.1 | tee -a "$OUT"
echo ">>> dedup: Bloom filter, 1M URLs at 1 %" >&2
.venv/bin/python bench/bloom.py --items 1000000 --error-rate 0.01 | tee -a "$OUT"

.venv/bin/python - "$OUT" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
crawl = [r for r in rows if "pages_saved" in r and "case" not in r]
bloom = [r for r in rows if "bytes_per_url" in r]
dynamic = [r for r in rows if "dynamic_pages" in r]
if crawl:
    print("\n| run | pages/s (server) | CPU ms/page | recall | robots violations | duplicate fetches | crawl-delay violated | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
for r in crawl:
    print(f"| {r['label']} | {r['fetched_per_s']} | {r['cpu_ms_per_page']} | {r['recall']} | {r['robots_violations']} "
          f"| {r['duplicate_page_fetches']} | {r['crawl_delay_violated_hosts']} | {r['peak_rss_mb']} |")
for d in dynamic:
    print(f"\nDynamic pages: {d['pages_per_s_per_browser']} pages/s per browser ({d['markers_found']}/{d['dynamic_pages']} "
          f"markers), {d['browser_ms_per_page_median']} ms median vs {d['static_ms_per_page_median']} ms static, "
          f"browser start {d['browser_start_s']} s, memory {d['browser_pss_mb_max']} MB PSS "
          f"({d['browser_rss_mb_max']} MB summed RSS)")
for r in (r for r in rows if r.get("label") == "recrawl"):
    c1, c2 = r["cycle1"], r["cycle2"]
    print(f"\nRe-crawl ({r['pages']} pages, {r['edited_pages']} edited): cycle 2 vs 1: requests {c2['requests']}/"
          f"{c1['requests']}, bytes {c2['bytes_sent']}/{c1['bytes_sent']} ({r['bytes_ratio']}), analyses "
          f"{c2['analysed']}/{c1['analysed']} ({r['analyses_ratio']}), 304s {c2['responses_304']}, wall "
          f"{c2['wall_s']}/{c1['wall_s']} s; history {r['history_bytes_per_url']} Redis bytes/URL")
for b in bloom:
    print(f"\nBloom filter: {b['items']} URLs at {b['error_rate']}: {b['bytes_per_url']} bytes/URL, "
          f"FPR measured {b['measured_fpr']} vs theory {b['theoretical_fpr']}, {b['adds_per_s']} adds/s, "
          f"{b['redis_cpu_us_per_url']} us Redis CPU/URL")
PY
