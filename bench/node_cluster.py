"""Helpers of the ring benches (ring_experiment.py, scale_out.py): worker nodes as process groups,
one Redis, the CPU of process trees, the connections to the universe, the kit's scoring.

Each node is ``celery -A tasks worker -Q download,download.dynamic,analysis -P threads -c N -n
X@%h -l warning`` started with ``setsid`` (``start_new_session``), the command of the acceptance
check 12-scale-out; with a weight it gets ``VCRAWL_NODE_WEIGHT`` and joins the host ring.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))  # the project itself: its local Redis and the tasks façade
import crawl_universe  # noqa: E402  (universe start/stop helpers, shared with the other benches)

SHARED = crawl_universe.SHARED
BENCH_PY = crawl_universe.BENCH_PY
VCRAWL = crawl_universe.VCRAWL
CELERY = REPO / ".venv" / "bin" / "celery"
LOOPBACK = "127.0.0.0/8"  # the universe is on loopback, which vcrawl refuses by default
QUEUES = "download,download.dynamic,analysis"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Node:
    """One worker node in a process group of its own (its PID is its group id)."""

    def __init__(
        self, letter: str, weight: int | None, threads: int | None, env: dict[str, str], log_dir: Path
    ) -> None:
        """``threads``: the threads pool of that size; None: the shipped pool and concurrency."""
        self.letter, self.weight, self.threads = letter, weight, threads
        self.env = dict(env)
        if weight is not None:
            self.env["VCRAWL_NODE_WEIGHT"] = str(weight)
        else:
            self.env.pop("VCRAWL_NODE_WEIGHT", None)
        self.log = log_dir / f"node-{letter}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Node:
        pool = [] if self.threads is None else ["-P", "threads", "-c", str(self.threads)]
        name = f"{self.letter}@%h"
        command = [str(CELERY), "-A", "tasks", "worker", "-Q", QUEUES, *pool, "-n", name, "-l", "warning"]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                command, env=self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill_group(self) -> None:
        """SIGKILL the node's whole process group (a machine that dies)."""
        if self.process is not None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(10)

    def stop(self, grace_s: float = 15.0) -> None:
        """Warm shutdown of the group (SIGTERM), SIGKILL after ``grace_s``."""
        if self.process is None:
            return
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:  # the group, also when the leader is gone
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass


def stop_all(nodes: list[Node]) -> None:
    """Stop nodes in parallel (a warm shutdown waits for running fetches)."""
    threads = [threading.Thread(target=node.stop) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


def base_env(redis_url: str, data: Path, **extra: str) -> dict[str, str]:
    """The environment of a node: no VCRAWL_* of ours, the shipped settings, this Redis and data root."""
    from vcrawl.settings import Settings

    env = {k: v for k, v in os.environ.items() if not k.startswith("VCRAWL_")}
    env.update(Settings(redis_url=redis_url, data=str(data), allowed_networks=(LOOPBACK,)).to_env())
    env.update(extra)
    return env


def use_cluster(env: dict[str, str]) -> Any:
    """Point this process's tasks façade at the cluster of ``env`` (what the CLI reads)."""
    import tasks
    from vcrawl.settings import Settings

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        settings = Settings.from_env()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    tasks.configure(settings)
    return tasks


def vcrawl(env: dict[str, str], *args: str, timeout_s: float = 60.0) -> str:
    """Run the ``vcrawl`` command line with ``env``; its stdout."""
    done = subprocess.run([str(VCRAWL), *args], env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"vcrawl {' '.join(args)}: exit {done.returncode}: {done.stderr[-1000:]}")
    return done.stdout


def bench_module(name: str) -> ModuleType:
    """The bench script ``bench/<name>.py`` loaded from its file as ``bench_<name>``: bench/batch_analysis.py
    has the name of the project's package. Loading it puts bench/ first on sys.path, where bench/storage.py
    would hide the project's ``storage``: the path is put back."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    spec.loader.exec_module(module)
    sys.path[:] = saved
    return module


def job_for(manifest: dict[str, Any], delay_s: float, per_host: int, jitter: float = 0.0) -> dict[str, Any]:
    """A job over the whole universe, as the acceptance checks write it (lib/common.sh job_file)."""
    hosts = sorted({seed.split("/")[2].split(":")[0] for seed in manifest["seeds"]})
    return {
        "seeds": manifest["seeds"], "scope": {"hosts": hosts}, "max_depth": 100, "max_pages": 1000000,
        "politeness": {"min_interval_s": delay_s, "jitter": jitter, "per_host": per_host, "obey_robots": True},
        "allowed_networks": [LOOPBACK],
    }  # fmt: skip


def evaluate(state: Path, offset: int, delay_s: float | None) -> dict[str, Any]:
    """The kit's score of everything the universe logged since ``offset`` (``universe.py evaluate``)."""
    st = json.loads(state.read_text())
    command = [BENCH_PY, str(SHARED / "universe.py"), "evaluate", "--manifest", st["manifest"], "--log", st["log"],
               "--offset", str(offset)]  # fmt: skip
    if delay_s:
        command += ["--delay", str(delay_s)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def log_offset(state: Path) -> int:
    """The universe access log's size now (where a run's requests start)."""
    return Path(json.loads(state.read_text())["log"]).stat().st_size


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [root]
    while todo and len(out) < 1000:
        pid = todo.pop()
        out.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
    return out


def cpu_s(pids: list[int], descendants: bool = True) -> float:
    """utime + stime (seconds) of these processes and (``descendants``) of all their descendants alive now."""
    total = 0.0
    for root in pids:
        for pid in tree_pids(root) if descendants else [root]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
    return total


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / CLK_TCK, sum(values[:8]) / CLK_TCK


class ConnectionCounter:
    """Distinct TCP connections to the universe's port, from /proc/net/tcp sampled every ``interval_s``.

    A connection is a client endpoint (ip:port) facing the universe port, in any state: the client
    side while it is open, then its TIME_WAIT (60 s) when the client closes, or the server's
    TIME_WAIT when the server closes first, so one that lived less than a sample still shows.
    Endpoints already there when counting starts are left out.
    """

    def __init__(self, port: int, interval_s: float = 0.1) -> None:
        self.port_hex = f"{port:04X}"
        self.interval_s = interval_s
        self._before = self._endpoints()
        self.seen: set[str] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _endpoints(self) -> set[str]:
        found = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                parts = line.split()
                local, remote, st = parts[1], parts[2], parts[3]
                if st == "0A":  # LISTEN
                    continue
                if remote.endswith(":" + self.port_hex):
                    found.add(local)
                elif local.endswith(":" + self.port_hex):
                    found.add(remote)
        return found

    def _run(self) -> None:
        deadline = time.monotonic() + 3600
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.seen |= self._endpoints() - self._before
            self.samples += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> ConnectionCounter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.seen |= self._endpoints() - self._before
