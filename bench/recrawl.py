"""Incremental re-crawl on the shared synthetic web: cycle 2 against cycle 1, 10 % of pages changed.

Run: ``.venv/bin/python bench/recrawl.py [--hosts 10] [--pages 5000] [--changed 0.1]``.
It serves a universe (../shared/bench/universe.py, nginx: real ETag / Last-Modified / 304)
from a private cache directory, runs cycle 1 of a scheduled job with local workers, edits
a fraction of the HTML pages on disk (a comment inside <body>: new bytes, same links), runs
cycle 2, restores the pages, and prints one JSON line: per cycle the requests the server
saw, the bytes it sent, 304s, analyses, wall time; and the Redis bytes per URL of history.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(HERE))  # after the project: bench/storage.py must not shadow storage/

from crawl_universe import start_universe, stop_universe  # noqa: E402

import tasks  # noqa: E402
from cli.cluster import LocalWorkers  # noqa: E402
from cli.local_redis import LocalRedis  # noqa: E402
from vcrawl.settings import Settings  # noqa: E402

JOB = "recrawl-bench"


def main() -> int:
    """Serve the universe, run two cycles around an edit, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--changed", type=float, default=0.10, help="fraction of HTML pages edited before cycle 2")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=600.0, help="per cycle")
    parser.add_argument("--root", default="/tmp/vcrawl-recrawl-universe", help="private universe cache (edited)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vcrawl-recrawl-"))
    state = work / "state.json"
    args.latency_ms = args.jitter_ms = 0.0
    server = start_universe(args, state, work, extra=["--root", args.root])
    backups: dict[Path, Path] = {}
    try:
        served = json.loads(state.read_text())
        manifest = json.loads(Path(served["manifest"]).read_text())
        site_dir = Path(served["manifest"]).parent / "site"
        access_log = Path(served["log"])
        with ExitStack() as stack:
            local = stack.enter_context(LocalRedis(work / "redis"))
            settings = Settings(
                redis_url=local.url,
                data=str(Path("/dev/shm") / f"vcrawl-recrawl-{os.getpid()}"),
                allowed_networks=("127.0.0.0/8",),  # the universe is on loopback, refused by default
            )
            tasks.configure(settings)
            env = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")} | settings.to_env()
            stack.enter_context(LocalWorkers(args.workers, args.threads, env, work / "logs", tasks.ping_workers))
            spec = {
                "id": JOB,
                "seeds": manifest["seeds"],
                "max_depth": 1000,
                "max_pages": 10 * len(manifest["reachable_pages"]) + 1000,
                "politeness": {"min_interval_s": 0.0, "jitter": 0.0, "per_host": 16},
                "limits": {"retries": 1},
                "revisit": {"initial_s": 0, "min_s": 0, "max_s": 0},  # every known URL is due in cycle 2
                "rules": [{"pattern": "", "analyzer": "fields", "fields": {"title": "title"}}],
            }
            first = run_cycle(spec, access_log, args.timeout)
            backups = edit_pages(manifest["reachable_pages"], site_dir, args.changed, work / "originals")
            # nginx caches file metadata (open_file_cache_valid 600s): restart it to serve the edits.
            stop_universe(server)
            server = start_universe(args, state, work, extra=["--root", args.root])
            second = run_cycle(spec, access_log, args.timeout)
            history = tasks.deps.history()
            urls, history_bytes = history.size(JOB), history.memory_bytes(JOB)
        print(
            json.dumps(
                {
                    "label": "recrawl",
                    "hosts": args.hosts,
                    "pages": args.pages,
                    "edited_pages": len(backups),
                    "cycle1": first,
                    "cycle2": second,
                    "requests_ratio": round(second["requests"] / first["requests"], 3),
                    "bytes_ratio": round(second["bytes_sent"] / first["bytes_sent"], 4),
                    "analyses_ratio": round(second["analysed"] / first["analysed"], 4),
                    "history_urls": urls,
                    "history_bytes_per_url": round(history_bytes / max(1, urls), 1),
                }
            ),
            flush=True,
        )
        shutil.rmtree(settings.data, ignore_errors=True)
        return 0
    finally:
        for original, saved in backups.items():
            shutil.copy2(saved, original)  # the private universe is byte-identical again
        stop_universe(server)


def run_cycle(spec: dict[str, Any], access_log: Path, timeout_s: float) -> dict[str, Any]:
    """Fire one cycle, wait for it, and count what the server saw meanwhile."""
    time.sleep(1.2)  # the access log is flushed every second: a clean boundary
    offset = access_log.stat().st_size
    began = time.monotonic()
    tasks.start_cycle.apply_async((JOB, spec), task_id=str(uuid.uuid4()))
    deadline = began + timeout_s
    time.sleep(0.5)
    while (status := tasks.job_status(JOB)) is None or status["state"] == "running":
        if time.monotonic() > deadline:
            raise SystemExit(f"cycle did not finish in {timeout_s}s: {status}")
        time.sleep(0.2)
    wall_s = time.monotonic() - began
    time.sleep(1.5)
    requests = bytes_sent = not_modified = 0
    with open(access_log, "rb") as log:
        log.seek(offset)
        for line in log:
            fields = line.split()
            if len(fields) >= 6:
                requests += 1
                bytes_sent += int(fields[4])
                not_modified += fields[3] == b"304"
    return {
        "cycle": status["cycle"],
        "wall_s": round(wall_s, 2),
        "requests": requests,
        "bytes_sent": bytes_sent,
        "responses_304": not_modified,
        **{name: status[name] for name in ("fetched", "not_modified", "unchanged", "changed", "new", "analysed")},
        "stored": status["pages_stored"],
        "bytes_stored": status["bytes"],
    }


def edit_pages(pages: list[str], site_dir: Path, fraction: float, saved_dir: Path) -> dict[Path, Path]:
    """Edit ``fraction`` of the HTML pages (files, not query aliases); return originals to restore."""
    files = sorted({site_dir / urlsplit(url).hostname / (urlsplit(url).path.lstrip("/") or "index.html")
                    for url in pages})  # fmt: skip
    files = [f for f in files if f.suffix == ".html" and f.is_file()]
    chosen = random.Random(7).sample(files, round(len(files) * fraction))
    saved_dir.mkdir(parents=True, exist_ok=True)
    backups = {}
    for index, path in enumerate(chosen):
        saved = saved_dir / f"{index}.html"
        shutil.copy2(path, saved)
        backups[path] = saved
        body = path.read_bytes()
        path.write_bytes(body.replace(b"</body>", f"<!-- edited {time.time()} -->\n</body>".encode(), 1))
    return backups


if __name__ == "__main__":
    sys.exit(main())
