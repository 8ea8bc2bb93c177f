"""The cluster log stream end to end: a `celery worker` subprocess ships its lines to Redis, `vcrawl logs` reads them.

One worker for the module (JSON lines, shipped defaults otherwise), on the session's Redis; every
job here has an id of its own, so lines of other tests in the shared stream never match.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

import tasks
from engine.log_context import ContextFilter, log_context
from engine.log_stream import JOB_STREAM_TTL_S, StreamShipper
from tasks.redis_clients import make_redis_client
from tests.cluster import REPO, cluster_env, start_job, start_worker, stop_worker
from tests.integration.conftest import api_server
from vcrawl.settings import Settings

_CELERY_TEXT_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+: (DEBUG|INFO|WARNING|ERROR|CRITICAL)/")


@pytest.fixture(scope="module")
def log_worker(vcrawl_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A plain worker at -l warning writing JSON lines; its environment and log file."""
    env = cluster_env(replace(vcrawl_settings, log_format="json"))
    log = tmp_path_factory.mktemp("cluster-logs") / "worker.log"
    process = start_worker(env, "logs-test", log, concurrency=4, loglevel="WARNING")
    try:
        yield {"env": env, "log": log}
    finally:
        stop_worker(process)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _vcrawl(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=30, check=True)  # fmt: skip
    return done.stdout


def _wait_for_line(env: dict[str, str], job: str, needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        out = _vcrawl(env, "logs", "--job", job)
        if needle in out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"no line with {needle!r} for job {job} in {timeout_s} s; got:\n{out}")
        time.sleep(0.5)


def _messages(job: str) -> str:
    """The job's lines in the stream, read in this process (the CLI's own reading is tested above)."""
    return "\n".join(f"{fields['level']} {fields['msg']}" for _, fields in tasks.read_logs(job=job))


def _wait_for_message(job: str, needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while needle not in (out := _messages(job)):
        assert time.monotonic() < deadline, f"no line with {needle!r} for job {job} in {timeout_s} s; got:\n{out}"
        time.sleep(0.2)
    return out


def _wait_completed(job: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while tasks.job_state(job) != "completed":
        assert time.monotonic() < deadline, f"job {job} is {tasks.job_state(job)} after {timeout_s} s"
        time.sleep(0.2)


def test_a_warning_in_a_task_is_read_back_with_vcrawl_logs(log_worker: dict[str, Any]) -> None:
    env, port, job = log_worker["env"], _free_port(), f"logs-{uuid.uuid4().hex[:8]}"
    start_job(env, {"id": job, "seeds": [f"http://127.0.0.1:{port}/nothing-listens-here"],
                    "scope": {"hosts": ["127.0.0.1"]}, "allowed_networks": ["127.0.0.0/8"]})  # fmt: skip

    out = _wait_for_line(env, job, f":{port}", timeout_s=30)

    line = next(line for line in out.splitlines() if f":{port}" in line)
    assert "WARNING" in line and f"job={job}" in line and "robots.txt" in line
    assert "logs-test@" in line  # the worker's node name
    entries = [json.loads(row) for row in _vcrawl(env, "logs", "--job", job, "--json").splitlines()]
    assert entries and all(entry["job"] == job and entry["task"] for entry in entries)
    with api_server("secret") as base:  # the job API's view of the same lines
        request = urllib.request.Request(f"{base}/api/jobs/{job}/logs?level=warning",
                                         headers={"Authorization": "Bearer secret"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as answer:
            lines = json.load(answer)["lines"]
    assert any(f":{port}" in line["url"] and line["level"] == "WARNING" and line["id"] for line in lines)


def test_a_level_changed_live_takes_effect_without_a_restart(log_worker: dict[str, Any]) -> None:
    env = log_worker["env"]
    # A job narrowed to another address: its host is refused, logged at INFO ("refused by the network policy").
    refused = {"seeds": [f"http://127.0.0.1:{_free_port()}/x"], "scope": {"hosts": ["127.0.0.1"]},
               "allowed_networks": ["127.0.0.2/32"]}  # fmt: skip
    before = f"lv-{uuid.uuid4().hex[:8]}"
    try:
        tasks.start_job({"id": before, **refused})
        _wait_completed(before)
        time.sleep(1.0)  # a shipped line is in Redis within half a second
        assert "refused by the network policy" not in _messages(before)

        assert "INFO" in _vcrawl(env, "log-level", "engine.fetch_step", "INFO")
        changed = time.monotonic()
        time.sleep(Settings().log_levels_poll_s)  # the workers' poll, at its shipped default
        # One job after another until one's INFO line is shipped: a loaded machine may delay the poll.
        out, jobs_run = "", 0
        while "refused by the network policy" not in out and jobs_run < 5:
            after, jobs_run = f"lv-{uuid.uuid4().hex[:8]}", jobs_run + 1
            tasks.start_job({"id": after, **refused})
            _wait_completed(after)
            deadline = time.monotonic() + 2.0
            while "refused by the network policy" not in (out := _messages(after)) and time.monotonic() < deadline:
                time.sleep(0.1)
        assert "INFO job" in out, f"no INFO line shipped after {jobs_run} jobs"
        assert time.monotonic() - changed < 15  # within seconds, the worker never restarted
        assert tasks.log_levels()["engine.fetch_step"] == "INFO"
    finally:
        tasks.set_log_level("engine.fetch_step", None)
    worker_log = Path(log_worker["log"]).read_text()
    assert "refused by the network policy" not in worker_log  # the console keeps the worker's -l warning


def test_worker_lines_are_json_with_context(log_worker: dict[str, Any]) -> None:
    port, job = _free_port(), f"json-{uuid.uuid4().hex[:8]}"
    tasks.start_job({"id": job, "seeds": [f"http://127.0.0.1:{port}/x"], "scope": {"hosts": ["127.0.0.1"]},
                    "allowed_networks": ["127.0.0.0/8"]})  # fmt: skip
    _wait_for_message(job, f":{port}", timeout_s=30)

    rows = Path(log_worker["log"]).read_text().splitlines()
    assert not [row for row in rows if _CELERY_TEXT_LINE.match(row)]
    lines = [json.loads(row) for row in rows if row.startswith("{")]
    ours = [line for line in lines if line.get("job") == job]
    assert ours, rows[-20:]
    assert {"time", "level", "logger", "message", "node", "job", "task_id", "url"} <= set(ours[0])
    assert f":{port}/" in ours[0]["url"] and ours[0]["node"].startswith("logs-test@")


def _spare_db(url: str) -> redis.Redis:
    # Another database of the session's Redis: the stream key there is this test's own.
    return redis.Redis.from_url(url.rsplit("/", 1)[0] + "/9", decode_responses=True)


def _shipper(client: Any, **overrides: Any) -> StreamShipper:
    options: dict[str, Any] = {"maxlen": 100, "queue_size": 10_000, "default_level": logging.WARNING, "poll_s": 2.0}
    return StreamShipper(client, **{**options, **overrides})


def _logger_with(name: str, *handlers: logging.Handler) -> logging.Logger:
    target = logging.getLogger(name)
    target.propagate = False
    target.handlers = list(handlers)
    target.setLevel(logging.WARNING)
    return target


def test_the_stream_and_a_jobs_stream_are_bounded(vcrawl_settings: Settings) -> None:
    client = _spare_db(vcrawl_settings.redis_url)
    client.delete("vcrawl:logs", "vcrawl:logs:job:{bounded}")
    shipper = _shipper(lambda: _spare_db(vcrawl_settings.redis_url), maxlen=200)
    shipper.addFilter(ContextFilter("t@box"))
    target = _logger_with("tests.logs.bounded", shipper)
    try:
        with log_context(job="bounded"):
            for index in range(3000):
                target.warning("line %d", index)
        shipper.flush(timeout_s=10)
        assert shipper.shipped == 3000 and shipper.dropped == 0
        # MAXLEN ~ trims whole stream nodes (100 entries each by default): about the cap, never the lot.
        assert 200 <= client.xlen("vcrawl:logs") <= 400
        assert 100 <= client.xlen("vcrawl:logs:job:{bounded}") <= 300  # a job's own: a tenth, at least 100
        assert 0 < client.ttl("vcrawl:logs:job:{bounded}") <= JOB_STREAM_TTL_S
        last = client.xrevrange("vcrawl:logs:job:{bounded}", count=1)[0][1]
        assert last["msg"] == "line 2999" and last["job"] == "bounded" and last["node"] == "t@box"
    finally:
        shipper.close()
        client.delete("vcrawl:logs", "vcrawl:logs:job:{bounded}")


def test_redis_down_drops_lines_and_local_logging_goes_on() -> None:
    dead = f"redis://127.0.0.1:{_free_port()}/0"  # nobody listens: Redis is down for the shipper
    shipper = _shipper(lambda: redis.Redis.from_url(dead, socket_connect_timeout=1), queue_size=100)
    local: list[logging.LogRecord] = []
    capture = logging.Handler()
    capture.emit = local.append  # type: ignore[method-assign]
    target = _logger_with("tests.logs.down", capture, shipper)
    try:
        started = time.monotonic()
        for index in range(2000):  # a task that logs a lot while Redis is away
            target.warning("still working %d", index)
        elapsed = time.monotonic() - started
        assert elapsed < 2.0  # never waits for Redis
        assert len(local) == 2000
        deadline = time.monotonic() + 10
        while shipper.dropped < 1900 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shipper.dropped >= 1900 and shipper.shipped == 0  # the queue holds 100: the rest are counted drops
    finally:
        shipper.close()


def test_follow_prints_new_lines_and_stops_cleanly_on_ctrl_c(vcrawl_settings: Settings) -> None:
    job = f"follow-{uuid.uuid4().hex[:8]}"
    follower = subprocess.Popen([sys.executable, "-m", "cli", "logs", "--job", job, "--follow"],
                                env=cluster_env(vcrawl_settings), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(iter(follower.stdout.readline, "")), daemon=True)
    reader.start()
    shipper = _shipper(lambda: make_redis_client(vcrawl_settings), maxlen=100_000)
    shipper.addFilter(ContextFilter("f@box"))
    source = _logger_with("tests.logs.follow", shipper)

    def ship(message: str) -> None:
        with log_context(job=job, url="http://127.0.0.1:9/followed"):
            source.warning(message)
        shipper.flush(timeout_s=5)

    def wait_printed(message: str) -> None:
        deadline = time.monotonic() + 20
        while not any(message in line for line in printed):
            assert time.monotonic() < deadline and follower.poll() is None, f"{message!r} not printed: {printed}"
            time.sleep(0.1)

    try:
        ship("the first line")
        wait_printed("the first line")  # the command runs: what comes now, only following shows
        ship("a line that came later")
        wait_printed("a line that came later")
        follower.send_signal(signal.SIGINT)
        follower.wait(10)
        err = follower.stderr.read()
    finally:
        shipper.close()
        if follower.poll() is None:
            follower.kill()
            follower.wait(5)
    assert follower.returncode == 130 and "Traceback" not in err
    assert "url=http://127.0.0.1:9/followed" in printed[-1] and "f@box" in printed[-1]
