"""A worker cut off from Redis and the sites by a real network partition, then let back in.

The worker runs in a network namespace of its own (tests/netns.py) and reaches Redis and the test
sites over a veth pair; cutting the link drops its packets without a word, as a real partition
does (its TCP connections stay half-open). To the others it is a dead worker: it stops beating,
so after the node timeout (the shipped 30 s) its messages and leases are taken over and the job
completes without it. When the link heals it beats again (listed up) and whatever it still had
in hand (a fetch answered after the cut, an admission, records) must store and admit nothing
twice. Default settings otherwise: nothing about visibility is set. `make test-faults` runs it.

On RabbitMQ (``[rabbitmq]``: `make test-rabbitmq`) the namespaced worker reaches the node at the link's
root address and the others at loopback. There the worker's messages go back when RabbitMQ closes its
half-open connection for missed heartbeats (``broker_heartbeat`` is the node timeout): the test keeps the
link cut until then, reads the moment from the node's log and checks it came after the ring had declared
the worker down and handed its leases over, so the messages put back fetch nothing twice.

The cut comes while the worker is in the middle of fetching pages that the sites answer it slowly
on purpose (``HELD_S``): it has held their messages across heartbeats, so they go back when it is
declared down (the hand-over), not only through the sweep that catches what it took since its
last heartbeat.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from warcio.archiveiterator import ArchiveIterator

from cli.local_redis import LocalRedis
from cluster.members import NodeRegistry
from frontier import Frontier
from storage import Storage
from storage.records import read_records
from tests.brokers import BROKERS, broker_node, on_broker
from tests.celery_setup import LocalWorkerProcess
from tests.cluster import cluster_env, ring_listing, start_job
from tests.conftest import TEST_ALLOWED_NETWORKS
from tests.netns import Lab, lab_or_skip
from tests.rabbitmq import LocalRabbitMQ
from tests.site import NOT_PAGES, Response, Seen, TestSite, link_page
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = [pytest.mark.slow, pytest.mark.faults]

SITES = 6
PAGES = 30  # per site, besides its home page: 186 pages
PAGE_DELAY_S = 0.05  # besides the slow answers below: pages take a moment, as on the web
HELD_S = 7.0  # the namespaced worker's fetches at the cut: longer than a heartbeat (2-3 s) and then some
HELD_AT_CUT_S = 4.5  # cut once one of them has been held this long: a heartbeat since said it holds it
INTERVAL_S = 0.1
DOWNLOAD = ["download", "download.dynamic"]
# One record per page: the job's output to check for repeats besides its pages and WARC files.
RECORD_RULE = {"pattern": "", "analyzer": "fields", "fields": {"first_link": "a"}}
Note = Callable[..., None]  # the fault_report fixture (tests/faults/conftest.py)


@pytest.fixture
def lab() -> Iterator[Lab]:
    with lab_or_skip() as made:
        yield made


class Sites:
    """Slow sites on the root end of the link (both sides fetch the same URLs), noting who asks.

    Once ``slow_down_the_lab`` is set, every page the namespaced worker asks for answers after
    ``HELD_S``: it holds that fetch's message across heartbeats, so what it said it holds names it.
    """

    def __init__(self, lab: Lab, stack: ExitStack) -> None:
        self.lab_address = lab.lab_address
        self.hosts = [stack.enter_context(TestSite(lab.root_address)) for _ in range(SITES)]
        self.slow_down_the_lab = threading.Event()
        self.held: list[tuple[str, float]] = []  # (URL, arrival) of the namespace's slow fetches
        for site in self.hosts:
            site.add_page("/", link_page(*[f"/p{i}" for i in range(PAGES)]))
            for i in range(PAGES):
                site.add_answer(f"/p{i}", self._answer(site, link_page("/").encode()))

    def _answer(self, site: TestSite, body: bytes) -> Callable[[Seen], Response]:
        def answer(seen: Seen) -> Response:
            if seen.client_host == self.lab_address and self.slow_down_the_lab.is_set():
                self.held.append((site.url(seen.path), seen.at))
                return Response(body, delay_s=HELD_S)
            return Response(body, delay_s=PAGE_DELAY_S)

        return answer


@pytest.fixture
def sites(lab: Lab) -> Iterator[Sites]:
    with ExitStack() as stack:
        yield Sites(lab, stack)


def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def requests_from(sites: list[TestSite], address: str, since: float = 0.0) -> list[tuple[str, float]]:
    """(URL, arrival) of the page requests that came from ``address`` at or after ``since``."""
    return [(site.url(seen.path), seen.at) for site in sites for seen in list(site.seen)
            if seen.client_host == address and seen.at >= since and seen.path not in NOT_PAGES]  # fmt: skip


def expected_pages(sites: list[TestSite]) -> set[str]:
    return {site.url(path) for site in sites for path in ["/", *(f"/p{i}" for i in range(PAGES))]}


def listed(env: dict[str, str], name: str) -> dict[str, Any] | None:
    """The member ``name`` as ``vcrawl nodes --json`` lists it (the operator's view; ~1 s a call)."""
    return next((row for row in ring_listing(env)["nodes"] if row["name"] == name), None)


def warc_responses(root: Path) -> Counter[str]:
    """Target URI -> how many ``response`` records the job's WARC files hold."""
    found: Counter[str] = Counter()
    for path in sorted(root.rglob("*.warc.gz")):
        with path.open("rb") as stream:  # warcio reads the gzip members itself
            for record in ArchiveIterator(stream):
                if record.rec_type == "response":
                    found[record.rec_headers.get_header("WARC-Target-URI")] += 1
    return found


# RabbitMQ's log: "<time> [error] <pid> closing AMQP connection <pid> (PEER -> NODE):", then, from the same
# process, "<time> [error] <pid> missed heartbeats from client, timeout: 30s".
_CLOSING = re.compile(r"^(\S+ \S+) \[\w+\] (<[\d.]+>) closing AMQP connection <[\d.]+> \((\S+) -> ", re.M)
_MISSED_HEARTBEATS = re.compile(r"^\S+ \S+ \[\w+\] (<[\d.]+>) missed heartbeats from client", re.M)
# A Celery worker's "[2026-01-02 10:11:12,345: INFO/MainProcess] Task NAME[ID] received".
_RECEIVED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/MainProcess\] Task \S+\[([^\]]+)\] received",
                       re.M)  # fmt: skip


def closed_for_missed_heartbeats(node: LocalRabbitMQ) -> dict[str, float]:
    """Peer ("address:port") -> when (epoch seconds) RabbitMQ closed its connection for missed heartbeats."""
    log = (node.directory / "log" / f"{node.node}.log").read_text(errors="replace")
    missed = set(_MISSED_HEARTBEATS.findall(log))
    return {peer: datetime.fromisoformat(at).timestamp() for at, pid, peer in _CLOSING.findall(log) if pid in missed}


def consuming_channels(node: LocalRabbitMQ, address: str) -> dict[str, int]:
    """Peer ("address:port") -> unacknowledged messages on its consuming channels, of the connections from
    ``address`` (the node's view: for a half-open connection, what it still counts as delivered)."""
    listing = node.ctl("list_channels", "name", "consumer_count", "messages_unacknowledged", "--no-table-headers", "-q")
    held: Counter[str] = Counter()
    for line in listing.stdout.decode().splitlines():
        name, consumers, unacked = [*line.split("\t"), "", "", ""][:3]  # name: "PEER -> NODE (CHANNEL)"
        peer = name.split(" -> ")[0]
        if peer.rpartition(":")[0] == address and consumers.isdigit() and int(consumers) > 0:
            held[peer] += int(unacked or 0)
    return dict(held)


def received(log: Path) -> dict[str, float]:
    """Task id -> when (epoch seconds, the worker's first line) the worker logging to ``log`` received it."""
    first: dict[str, float] = {}
    for at, task_id in _RECEIVED.findall(log.read_text(errors="replace")):
        first.setdefault(task_id, datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return first


@pytest.fixture
def rabbitmq(broker: str, lab: Lab, tmp_path: Path) -> Iterator[LocalRabbitMQ | None]:
    """The test's RabbitMQ node for ``broker`` "rabbitmq" (None for "redis"); it serves AMQP on the link's
    root address too, where the namespaced worker reaches it (tests/faults/conftest.py's listens on loopback)."""
    with broker_node(broker, tmp_path / "rabbitmq", listen_also=[lab.root_address]) as node:
        yield node


@pytest.mark.parametrize("broker", BROKERS)
def test_a_partitioned_worker_is_taken_over_and_rejoins_storing_nothing_twice(
    tmp_path: Path, lab: Lab, sites: Sites, fault_report: Note, rabbitmq: LocalRabbitMQ | None
) -> None:
    data, hosts = tmp_path / "data", sites.hosts
    with LocalRedis(tmp_path / "redis", bind=("127.0.0.1", lab.root_address)) as server:
        settings = Settings(redis_url=server.url, data=str(data),
                            allowed_networks=(*TEST_ALLOWED_NETWORKS, str(lab.network)))  # fmt: skip
        env = cluster_env(on_broker(settings, rabbitmq))
        # The same Redis (and RabbitMQ), reached over the link from inside the namespace.
        lab_settings = replace(settings, redis_url=f"redis://{lab.root_address}:{server.port}/0")
        lab_env = cluster_env(on_broker(lab_settings, rabbitmq, lab.root_address))
        client = redis.Redis.from_url(server.url)
        frontier = Frontier(client)
        registry = NodeRegistry(frontier.scripts, settings.node_timeout_s)
        workers: list[LocalWorkerProcess] = []
        held_at_cut: dict[str, int] = {}
        requeued_s: float | None = None
        try:
            steady = LocalWorkerProcess(env, tmp_path / "steady.log", "steady", DOWNLOAD)
            cut = LocalWorkerProcess(lab_env, tmp_path / "cut.log", "cut", DOWNLOAD, run_in=lab.command([]))
            analyst = LocalWorkerProcess(env, tmp_path / "analyst.log", "analyst", ["analysis"])
            workers = [steady, cut, analyst]
            with ThreadPoolExecutor(len(workers)) as pool:  # ~4 s each to start: side by side
                list(pool.map(LocalWorkerProcess.start, workers))
            job_id = start_job(env, {"seeds": [site.url("/") for site in hosts], "warc": True, "rules": [RECORD_RULE],
                                     "politeness": {"min_interval_s": INTERVAL_S, "jitter": 0}})  # fmt: skip
            wait_for(lambda: len(requests_from(hosts, lab.lab_address)) >= 10, 30, "the namespaced worker fetching")
            sites.slow_down_the_lab.set()

            def mid_fetch() -> bool:
                now = time.monotonic()
                return any(HELD_AT_CUT_S <= now - at <= HELD_AT_CUT_S + 1 for _, at in list(sites.held))

            wait_for(mid_fetch, 30, f"a fetch of the namespaced worker {HELD_AT_CUT_S} s under way")
            lab.cut()
            cut_at, cut_epoch = time.monotonic(), time.time()
            seconds, micros = client.time()
            cut_ms = seconds * 1000 + micros // 1000  # the Redis clock, the one down records are noted on
            # Answered after the cut had surely taken effect, so never received: in flight.
            in_flight = {url for url, at in sites.held if at > cut_at - HELD_S}
            in_flight |= {url for url, at in requests_from(hosts, lab.lab_address) if at > cut_at - PAGE_DELAY_S}
            assert in_flight, "the cut came too late: every fetch of the namespaced worker was answered"
            fetched_before_cut = len(requests_from(hosts, lab.lab_address))
            if rabbitmq is not None:  # what RabbitMQ counts as delivered to the cut worker, unacknowledged
                held_at_cut = consuming_channels(rabbitmq, lab.lab_address)

            def taken_over() -> bool:
                again = {url for url, _ in requests_from(hosts, lab.root_address, since=cut_at)}
                return in_flight <= again

            wait_for(taken_over, settings.node_timeout_s + 30, f"{sorted(in_flight)} fetched by the others")
            taken_over_s = time.monotonic() - cut_at
            listed_down = listed(env, cut.name)
            down = registry.membership().node(cut.name)
            down_s = None if down is None or down.down_at_ms is None else (down.down_at_ms - cut_ms) / 1000

            def done() -> dict[str, Any] | None:
                status = job_status(frontier, job_id)
                return status if status is not None and status["state"] != "running" else None

            status = wait_for(done, settings.node_timeout_s + 60, f"job {job_id} done")
            completed_s = time.monotonic() - cut_at
            if rabbitmq is not None:
                # The link stays cut until RabbitMQ closes the half-open connection: it checks for data from
                # the client every heartbeat interval and gives up after two checks saw none, so 2 to 3
                # intervals after the client's last word (rabbit_heartbeat's receiver).
                consumer = max(held_at_cut, key=held_at_cut.__getitem__, default="")
                closed_at = wait_for(lambda: closed_for_missed_heartbeats(rabbitmq).get(consumer),
                                     3 * settings.node_timeout_s + 20, f"RabbitMQ closing {consumer}")  # fmt: skip
                requeued_s = closed_at - cut_epoch
            # From a second after the cut: a request sent just before it may be noted just after it.
            during_cut = requests_from(hosts, lab.lab_address, since=cut_at + 1.0)
            lab.heal()
            healed_at = time.monotonic()

            def rejoined() -> bool:
                node = registry.membership().node(cut.name)
                return node is not None and node.alive

            wait_for(rejoined, 30, "the cut worker beating again")
            rejoined_s = time.monotonic() - healed_at
            back = listed(env, cut.name)
            consuming = wait_for(cut.ready, 10, "the cut worker answering a ping through the broker")
            time.sleep(3)  # what it still had in hand runs out now: its stale fetches, their analyses
            after = job_status(frontier, job_id)
        finally:
            for worker in workers:  # SIGTERM: each ships its records and rolls its WARC files
                if worker.status == "running":
                    os.kill(worker.pid, signal.SIGTERM)
            for worker in workers:
                try:
                    worker.process.wait(20)  # type: ignore[union-attr]
                except subprocess.TimeoutExpired:
                    worker.teardown()
    expected = expected_pages(hosts)
    fetched = Counter(url for url, _ in requests_from(hosts, lab.lab_address) + requests_from(hosts, lab.root_address))
    records = Counter(record["url"] for record in read_records(Storage(str(data)), f"jobs/{job_id}/records"))
    stored = [path for path in (data / "jobs" / job_id / "pages").rglob("*") if path.is_file()
              and not path.name.startswith(".")]  # fmt: skip
    responses = warc_responses(data / "jobs" / job_id)
    handed = (listed_down or {}).get("taken_over") or {}
    # The cut worker's messages that a worker on the root side received after the cut: put back to the queue.
    cut_received = received(tmp_path / "cut.log")
    redelivered = {task_id: at - cut_epoch for task_id, at in received(tmp_path / "steady.log").items()
                   if task_id in cut_received and at >= cut_epoch}  # fmt: skip
    fault_report(fault="a download worker cut off by a network partition mid-fetch, healed after the job completed",
                 state=status["state"], pages_expected=len(expected), pages_stored=status["pages_stored"],
                 down_s_after_cut=down_s, taken_over_s=round(taken_over_s, 1),
                 completed_s_after_cut=round(completed_s, 1), rejoined_s_after_heal=round(rejoined_s, 1),
                 fetched_before_cut=fetched_before_cut, in_flight_at_cut=len(in_flight),
                 refetched=sum(fetched.values()) - len(fetched), handed_over_batches=handed.get("batches"),
                 held_messages_put_back=handed.get("restored"), redelivered=len(redelivered),
                 redelivered_s_after_cut=sorted(round(s, 1) for s in redelivered.values()))  # fmt: skip
    if rabbitmq is not None:
        fault_report(unacked_at_cut=sum(held_at_cut.values()),
                     requeued_by_rabbitmq_s_after_cut=round(requeued_s or 0, 1))  # fmt: skip
    print(
        f"cut -> down {down_s} s, taken over {taken_over_s:.1f} s, -> completed {completed_s:.1f} s; heal -> rejoined "
        f"{rejoined_s:.1f} s; in flight at the cut {len(in_flight)}, fetched before it {fetched_before_cut}, "
        f"fetched twice {sum(fetched.values()) - len(fetched)}; its down record: {handed}; RabbitMQ: unacked at the "
        f"cut {held_at_cut}, connection closed {requeued_s} s after the cut; redelivered {redelivered}"
    )
    assert status["state"] == "completed", status
    assert not during_cut  # nothing reached the sites from the namespace while cut
    assert listed_down is not None and listed_down["state"] == "down", listed_down
    # Its messages back within the node timeout, the grace and a sweep (~1 s): not the visibility timeout.
    # On RabbitMQ: its leases handed back when it is declared down, its batches refetched from the frontier.
    assert taken_over_s <= settings.node_timeout_s + 10
    if rabbitmq is None:
        # What it said it holds went back when it was declared down, its batches' leases with it.
        assert handed.get("batches", 0) >= 1 and handed.get("restored", 0) >= 1, handed
    else:
        # Its leases went back when it was declared down, and the analyses of what its messages had released
        # were sent again then (``restored``: how many; AmqpHoldings.restore). The messages themselves vcrawl
        # puts back nowhere on RabbitMQ: RabbitMQ does, when it closes the half-open connection.
        assert handed.get("batches", 0) >= 1 and handed.get("restored", 0) >= 0, handed
        assert sum(held_at_cut.values()) >= 1, held_at_cut  # the fetch in flight, unacknowledged
        # RabbitMQ notices the silence 2-3 heartbeats (a third of the node timeout) after its last word, about
        # when the ring declares the worker down, and hands its messages back then: a copy of the fetch it
        # had started finds it taken and skips it (its URLs come back with the hand-over), one delivered into
        # the dead connection and never started is fetched at once. Each page is still stored once (below).
        heartbeat_s = settings.node_timeout_s / 3
        assert requeued_s is not None and 2 * heartbeat_s - 1 <= requeued_s <= 3 * heartbeat_s + 5, requeued_s
        assert redelivered and min(redelivered.values()) >= requeued_s - 1, (redelivered, requeued_s)
        # The job waited for nothing past the hand-over: at the node timeout as heartbeat, a message delivered
        # into the dead connection held its batch 60-90 s (completed 86.8 s after the cut), and before the
        # worker's holdings named its bundles' refills, 84 s.
        assert completed_s <= settings.node_timeout_s + 15, (completed_s, requeued_s)
    assert back is not None and back["state"] == "up" and consuming, back
    assert set(fetched) == expected
    # Each page once in the job's output, nothing admitted twice, before the heal and after it.
    assert status["pages_stored"] == len(expected) and status["admitted"] == len(expected), status
    assert after is not None and after["state"] == "completed", after
    assert (after["pages_stored"], after["admitted"]) == (status["pages_stored"], status["admitted"]), after
    assert set(records) == expected and max(records.values()) == 1, records.most_common(3)
    assert len(stored) == len(expected)
    assert set(responses) == expected and max(responses.values()) == 1, responses.most_common(3)
