"""`celery worker` subprocesses on a private redis-server, for tests that kill or time workers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from cli.local_redis import LocalRedis
from engine.trail import StatusTrail
from tests.celery_setup import REPO, LocalWorkerProcess
from tests.conftest import TEST_ALLOWED_NETWORKS
from tests.site import TestSite
from vcrawl.settings import Settings

__all__ = [
    "REPO",
    "cluster_env",
    "identify_clients",
    "ring_listing",
    "socket_owner",
    "start_job",
    "start_worker",
    "stop_worker",
    "submit",
    "wait_all",
]


def cluster_env(settings: Settings) -> dict[str, str]:
    """The environment that gives subprocesses exactly ``settings``.

    Settings that allow no network get the session's loopback networks (tests/conftest.py):
    the test sites are on loopback, which vcrawl refuses by default.
    """
    if not settings.allowed_networks:
        settings = replace(settings, allowed_networks=TEST_ALLOWED_NETWORKS)
    return {**os.environ, **settings.to_env(), "PYTHONPATH": str(REPO)}


def start_worker(
    env: dict[str, str],
    name: str,
    log: Path,
    concurrency: int = 2,
    loglevel: str = "INFO",
    queues: str = "download,download.dynamic,analysis",
    run_in: Sequence[str] = (),
    pool: str = "threads",
) -> subprocess.Popen[bytes]:
    """Start ``celery -A tasks worker`` on ``queues`` (threads pool, or ``pool``: ``prefork`` is Celery's
    default); wait until it answers a ping.

    The same worker process as the ``celery_setup`` fixture's nodes (tests/celery_setup.py), for
    tests that hold the process itself; ``run_in`` as there (e.g. a network namespace).
    """
    worker = LocalWorkerProcess(env, log, name, queues.split(","), concurrency, loglevel, run_in=run_in, pool=pool)
    return worker.start().process  # type: ignore[return-value]


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker we started (by PID), and its pool's processes (prefork), and reap it."""
    if process.poll() is None:
        try:
            children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        except OSError:
            children = []
        process.kill()
        process.wait(10)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)


def submit(env: dict[str, str], payloads: list[dict[str, Any]]) -> list[str]:
    """Submit payloads with ``crawl.delay`` from another process (a separate producer); return ids."""
    code = "import json, sys, tasks\nfor p in json.loads(sys.argv[1]): print(tasks.crawl.delay(p).id)"
    import json

    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(payloads)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.split()


def wait_all(env: dict[str, str], ids: list[str], states: set[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Poll the trails until every task is in one of ``states``; return them."""
    trail = StatusTrail(redis.Redis.from_url(env["VCRAWL_REDIS_URL"], decode_responses=True), 3600)
    deadline = time.monotonic() + timeout_s
    while True:
        records = trail.get_many(ids)
        if all(r is not None and r["state"] in states for r in records.values()):
            return records  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"not all tasks reached {states} in {timeout_s}s: {records}")
        time.sleep(0.1)


def worker_start_with_plugins(tmp_path: Path, plugin_path: Path) -> subprocess.CompletedProcess[str]:
    """Start a worker (own Redis) with ``plugin_path`` first on its PYTHONPATH; it should refuse to start."""
    with LocalRedis(tmp_path / "redis") as server:
        env = cluster_env(Settings(redis_url=server.url, data=str(tmp_path / "data")))
        env["PYTHONPATH"] = f"{plugin_path}{os.pathsep}{env['PYTHONPATH']}"
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "download", "-P", "threads",
             "--without-mingle", "--without-gossip"],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip


def socket_owner(local_port: int, pids: list[int], peer: tuple[str, int] | None = None) -> int | None:
    """Which of ``pids`` holds the open TCP socket bound to ``local_port`` (a client's end), if any.

    ``peer``: the server's address and port at the socket's other end. Give it: Linux hands one
    ephemeral port to several connections at once when their servers differ, so a port alone may
    name another process's socket.

    Linux only: /proc/net/tcp gives the socket's inode, /proc/<pid>/fd the process that holds it.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == local_port and (peer is None or _endpoint(fields[2]) == peer):
                inodes.add(fields[9])
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:  # a file closed since the listing (the process works on): not the socket wanted
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return pid
            except OSError:
                continue
    return None


def _endpoint(field: str) -> tuple[str, int]:
    """An address:port of /proc/net/tcp (IPv4, or IPv4-mapped IPv6: its last 32 bits), host order.

    >>> _endpoint("0104007F:9B79"), _endpoint("0000000000000000FFFF00000104007F:0050")
    (('127.0.4.1', 39801), ('127.0.4.1', 80))
    """
    address, port = field.rsplit(":", 1)
    return socket.inet_ntoa(struct.pack("<I", int(address[-8:], 16))), int(port, 16)


def identify_clients(site: TestSite, owners: dict[int, Any]) -> None:
    """Have ``site`` note which of ``owners`` (pid -> name; read at each request) sent each request."""
    peer = site.address
    site.identify = lambda port: owners.get(socket_owner(port, list(owners), peer) or 0)


def start_job(env: dict[str, str], job: dict[str, Any]) -> str:
    """Start a crawl job from another process (``tasks.start_job``); return its id."""
    code = "import json, sys, tasks; print(tasks.start_job(json.loads(sys.argv[1])))"
    done = subprocess.run([sys.executable, "-c", code, json.dumps(job)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.split()[-1]


def ring_listing(env: dict[str, str]) -> dict[str, Any]:
    """``vcrawl nodes --json`` as the cluster's operator sees it."""
    done = subprocess.run([sys.executable, "-m", "cli", "nodes", "--json"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])
