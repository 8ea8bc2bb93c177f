"""A real Spark standalone cluster on loopback for tests: one master and one worker, started from the
pyspark in this venv (``bin/spark-class``), stopped afterwards, also on failure."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from batch_analysis.spark import spark_problem
from tests.ports import free_port
from tests.services import Service

__all__ = ["SPARK_MISSING", "StandaloneSpark"]

SPARK_MISSING = spark_problem()  # None where PySpark and Java are installed (make setup does both)
_START_TIMEOUT_S = 60.0


class StandaloneSpark(Service):
    """``spark-class org.apache.spark.deploy.master.Master`` and a ``Worker`` (2 cores, 1 GiB) registered with it."""

    def __init__(self, directory: Path) -> None:
        import pyspark

        self.directory = directory
        self.spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        self.port = free_port()
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the master, then the worker, each waited for until its log says it is up."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                    str(self.port), "--webui-port", str(free_port()))  # fmt: skip
        self._wait_for("master", "I have been elected leader")
        self._start("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port",
                    str(free_port()), "--cores", "2", "--memory", "1g", "--work-dir",
                    str(self.directory / "work"), self.master_url)  # fmt: skip
        self._wait_for("worker", "Successfully registered with master")

    def executor_ran(self) -> bool:
        """True once the worker has launched an executor for an application."""
        return "Launching executor app-" in self._log("worker") or any((self.directory / "work").glob("app-*"))

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # its own session: the JVM and what it started
        for process in self._processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        self._processes.clear()

    def _start(self, name: str, *args: str) -> None:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(self.directory / "logs"),
               "SPARK_NO_DAEMONIZE": "1"}  # fmt: skip
        with open(self.directory / f"{name}.log", "wb") as log:
            process = subprocess.Popen([str(self.spark_class), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)  # fmt: skip
        self._processes.append(process)

    def _wait_for(self, name: str, line: str) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if line in self._log(name):
                return
            if any(process.poll() is not None for process in self._processes):
                break
            time.sleep(0.2)
        raise AssertionError(f"Spark {name} did not start: {self._log(name)[-2000:]}")

    def _log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""
