"""A worker's boot: the Celery signals a worker (and beat) wires when it starts, and nothing else does.

``tasks.app`` lists this module in the app's ``include``: Celery imports it when a worker starts
(``WorkController`` calls ``loader.init_worker`` before any worker signal is sent and before logging
is set up), and beat likewise. The façade (``import tasks``) never imports it, so importing the
façade, as the command line and the API do, wires nothing.

At start a worker checks its configuration and plug-ins (``worker_init``), consumes its node's own
queue (``celeryd_after_setup``), and once ready starts its frontier pump, output shipper, membership
keeper and watchers (``worker_ready``); it stops them at shutdown, and every process releases its
browser and ships its outputs when it ends.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from celery.signals import (
    celeryd_after_setup,
    task_received,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from analyzers import load_plugins
from cluster.fence import SentinelFence
from cluster.membership import RingKeeper, node_queue
from cluster.periodic import Periodic
from engine.analyze_batch import ANALYSIS_ID_PREFIX
from engine.fetch_batch import FETCH_ID_PREFIX
from frontier import load_filters
from tasks import check_settings, deps
from tasks import log_setup as _log_setup  # noqa: F401 - connects the logging signals
from tasks import pool as _pool  # noqa: F401 - registers the vcrawl_resize remote control command
from tasks.app import app
from tasks.batch_analysis import run_watchdog
from tasks.batches import dispatch_batches
from tasks.broker.amqp_holdings import AmqpHoldings
from tasks.broker.holdings import BrokerHoldings
from tasks.broker.primary_watch import primary_watch
from tasks.broker.redis_check import check_redis_persistence
from tasks.redis_clients import make_fence
from vcrawl.errors import ConfigError

__all__: list[str] = []


@worker_init.connect
def _check_configuration(**_: Any) -> None:
    # Fail at start-up, naming the variable or plugin, rather than on the first task.
    # Celery logs and swallows exceptions from signal handlers, but not SystemExit.
    try:
        check_settings()
        load_plugins()
        load_filters()  # vcrawl.filters: a name taken twice stops the worker here
        deps.fetchers()  # vcrawl.fetchers: the same
        check_redis_persistence(deps.redis_client())  # warns loudly; a worker still starts
        if deps.settings().frontier_url is not None:
            check_redis_persistence(deps.frontier_client())  # the frontier's own Redis, the same warnings
    except ConfigError as exc:
        logging.getLogger("vcrawl").critical("vcrawl cannot start: %s", exc)
        raise SystemExit(f"vcrawl: configuration error: {exc}") from exc


_node: dict[str, str] = {}  # this worker's node name (Celery's -n), once it is known
_keeper: dict[str, RingKeeper] = {}  # this worker's membership thread, once it runs
_watchdog = run_watchdog()
_primary_watch = primary_watch(app)
_fence: dict[str, SentinelFence] = {}  # this worker's, once it is ready (behind Sentinel only)


@celeryd_after_setup.connect
def _consume_own_queue(sender: str, instance: Any, **_: Any) -> None:
    # A ring node also consumes its own queue: the batches of the hosts it owns.
    _node["name"] = str(sender)
    if deps.settings().ring_weight > 0:
        instance.app.amqp.queues.select_add(node_queue(str(sender)))


@worker_process_init.connect
def _fresh_clients_after_fork(**_: Any) -> None:
    # A pool child must not share the parent's sockets; it takes up the cluster's live settings itself.
    deps.reset(deps.base_settings())
    deps.live_settings_keeper().start()
    if name := _node.get("name"):  # a prefork child: its fetches count for its node, written every 2 s
        _child_stats["flusher"] = Periodic("vcrawl-node-stats", _CHILD_FLUSH_S, lambda: _flush_stats(name)).start()


_child_stats: dict[str, Periodic] = {}
_CHILD_FLUSH_S = 2.0


def _flush_stats(name: str) -> None:
    deps.node_stats_writer().flush(name, int(time.time() * 1000))


def _pool_size(consumer: Any) -> int:
    # The worker's pool size now (``vcrawl nodes resize`` changes it): threads, or prefork processes.
    return int(getattr(getattr(consumer, "pool", None), "num_processes", 0) or 0)


@worker_ready.connect
def _start_pump(sender: Any = None, **_: Any) -> None:
    # The cluster's live settings (vcrawl config set) first: the pump and the first tasks use them.
    deps.live_settings_keeper().start()
    # Every worker pumps the frontier; the scripts keep concurrent pumps exact.
    if deps.settings().pump:
        deps.pump(dispatch_batches).start()
    # A job's WARC files and record parts ship when it completes (a prefork child starts its own).
    deps.output_shipper().start()
    # A member (on the ring if a ring node): it beats, says which messages it holds, watches for
    # members that went silent and sweeps messages nobody holds. A dead predecessor's go back first.
    # On RabbitMQ the broker hands a closed connection's messages back itself, and never loses one between
    # queue and consumer: the keepers of Redis's broker (holdings sweep, watchdog, primary watch) stay off;
    # a worker says only which fetch batches it holds: their leases go back when it is declared down.
    redis_broker = not deps.settings().amqp_broker
    name = _node.get("name") or str(getattr(sender, "hostname", "") or "") or None
    holdings = BrokerHoldings(app, consumer=sender) if redis_broker else AmqpHoldings()
    if isinstance(holdings, AmqpHoldings):
        _amqp_holdings["holdings"] = holdings
    keeper = deps.ring_keeper(name, holdings, pool_size=lambda: _pool_size(sender))
    if name and isinstance(holdings, BrokerHoldings):
        try:
            holdings.reclaim_own(name, hand_back=keeper.hand_back)
        except Exception:
            logging.getLogger("vcrawl").exception("could not put back what the previous %s held", name)
    _keeper["keeper"] = keeper.start()
    if redis_broker:
        _watchdog.start()  # batch analysis runs and crawl analyses that lost a message with a killed worker
        _primary_watch.start()  # after a Redis failover or restart: what was taken from the old server goes back
    if (fence := make_fence(deps.settings())) is not None:  # Redis behind Sentinel
        _fence["fence"] = fence.start()  # no write lands on an old primary about to be wiped
    try:  # records and WARC files a killed worker on this machine spooled but never shipped
        deps.recover_spools()
    except Exception:
        logging.getLogger("vcrawl").exception("could not ship the spools of stopped workers")


_amqp_holdings: dict[str, AmqpHoldings] = {}  # this worker's on RabbitMQ, once it is ready


@task_received.connect
def _say_a_task_is_held(request: Any = None, **_: Any) -> None:
    # On RabbitMQ, also as each fetch or analysis message is received, not only with the next heartbeat: a
    # worker killed within a second of taking one is known to hold it when it is declared down. In the
    # main process, whatever the pool: a prefork child has no keeper (task_prerun missed it there, and the
    # acceptance check's kill then waited for a lease to run out).
    holdings, name = _amqp_holdings.get("holdings"), _node.get("name")
    task_id = str(getattr(request, "id", "") or "")
    if holdings is not None and name and task_id.startswith((FETCH_ID_PREFIX, ANALYSIS_ID_PREFIX)):
        holdings.report(name, int(time.time() * 1000), also=(task_id,))


@worker_ready.connect
def _spare_the_collector(**_: Any) -> None:
    # What a worker built to start (the app, its modules, settings and clients) lives as long as it
    # does: frozen, the cyclic collector stops walking it at every full collection, and a young
    # generation of 10,000 objects (700 by default) makes collections rarer. They took about a
    # tenth of a crawling worker's CPU (py-spy: gc_collect_main, mostly in the consumer's thread).
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


@worker_ready.connect
def _notice_a_shutdown_soon(sender: Any = None, **_: Any) -> None:
    # Celery's event loop looks for a warm shutdown between polls, and a poll waits up to a second
    # when no timer is due sooner: a local run's workers took 1.2 s to stop after its job ended.
    # A timer every 0.1 s bounds the wait (ten empty wake-ups a second).
    hub = getattr(sender, "hub", None)
    if hub is not None:
        hub.call_repeatedly(_SHUTDOWN_NOTICED_S, _nothing)


_SHUTDOWN_NOTICED_S = 0.1


def _nothing() -> None:
    pass


@worker_shutdown.connect
def _stop_pump(**_: Any) -> None:
    # The threads that wait on Redis are told first, then joined: their waits end side by side.
    if deps.settings().pump:
        deps.pump(dispatch_batches).stop_soon()
    deps.output_shipper().stop_soon()
    if deps.settings().pump:
        deps.pump(dispatch_batches).stop()
    if (keeper := _keeper.pop("keeper", None)) is not None:
        keeper.stop(leave=True)
    _watchdog.stop()
    _primary_watch.stop()
    if (fence := _fence.pop("fence", None)) is not None:
        fence.stop()
    deps.output_shipper().stop()
    _release_process_resources()


@worker_process_shutdown.connect
def _quit_browser(**_: Any) -> None:
    # A prefork child (recycled by max_tasks_per_child, or at shutdown) quits its own browser
    # and ships its records and WARC files, and writes its last fetch counters.
    _release_process_resources()
    if (flusher := _child_stats.pop("flusher", None)) is not None and (name := _node.get("name")):
        flusher.stop(timeout_s=1.0)
        try:
            _flush_stats(name)
        except Exception:
            logging.getLogger("vcrawl").exception("could not write the last fetch counters of %s", name)


def _release_process_resources() -> None:
    # Each step on its own: a store that fails must not keep the browser alive or the WARC unshipped.
    # Last: clearing this process's notes of unshipped output, once it is shipped.
    for step in (deps.fetchers().close, deps.flush_records, deps.close_warc, deps.output_shipper().ship_all):
        try:
            step()
        except Exception:
            logging.getLogger("vcrawl").exception("shutdown step %s failed", step.__name__)
