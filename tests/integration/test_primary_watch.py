"""After the Redis primary changes (its run_id), what was taken from the old one and is held by no
worker goes back, once every live worker has said again what it holds: a real broker, messages
taken and never acknowledged (kombu's unacked hash), the watch's looks and the session worker's."""

from __future__ import annotations

import os
import socket
import time

import pytest
from celery import Celery
from kombu import Connection

import tasks
from cluster.holdings import Holder
from cluster.membership import registration_for
from tasks.broker.primary_watch import look_at_primary
from tests.waiting import wait_until
from vcrawl import redis_keys

pytestmark = [pytest.mark.redis_ha, pytest.mark.usefixtures("worker")]

QUEUE = "primary-watch-test"  # no worker consumes it: what goes back stays there to be seen


def test_a_message_taken_from_the_old_primary_goes_back_and_a_younger_one_stays() -> None:
    app, client = tasks.crawl.app, tasks.deps.redis_client()
    with Connection(app.conf.broker_url) as connection:
        queue = connection.SimpleQueue(QUEUE)
        queue.put({"n": 1})
        queue.put({"n": 2})
        old = queue.get(timeout=5)  # taken, never acknowledged: noted in kombu's unacked hash
        time.sleep(1.5)
        noted_at = time.time() - 1.2  # the old server's last note: after the first was taken
        young = queue.get(timeout=5)  # taken after that note (on the "new" server)
        assert (old.payload, young.payload) == ({"n": 1}, {"n": 2})
        try:
            client.hset(redis_keys.primary_watch(), mapping={"run_id": "the-old-server", "seen_at": repr(noted_at)})
            client.delete(redis_keys.primary_watch_lock())  # the session worker's watch may have just looked
            look_at_primary(app)
            # Once the session worker has said again what it holds (every 2 s); its watch may look first.
            wait_until(lambda: client.llen(QUEUE) or look_at_primary(app), 10, "the old message goes back", 0.05)
            back = queue.get(timeout=5)
            assert back.payload == {"n": 1}  # the old one is back on its queue
            assert client.llen(QUEUE) == 0  # the young one was left to its holder
            back.ack()
            young.ack()
            assert client.hget(redis_keys.primary_watch(), "run_id") == client.info("server")["run_id"]
        finally:
            queue.clear()
            queue.close()


def test_a_message_a_live_worker_says_it_holds_is_left_to_it() -> None:
    app, client = tasks.crawl.app, tasks.deps.redis_client()
    with Connection(app.conf.broker_url) as connection:
        queue = connection.SimpleQueue(QUEUE)
        queue.put({"n": 3})
        held = queue.get(timeout=5)
        time.sleep(1.5)
        holder = Holder("still-running@box", 0, frozenset({held.delivery_tag}), os.getpid(), socket.gethostname())
        try:
            client.hset(redis_keys.HOLDERS, holder.name, holder.to_json())
            client.hset(redis_keys.primary_watch(), mapping={"run_id": "the-old-server", "seen_at": repr(time.time())})
            client.delete(redis_keys.primary_watch_lock())
            look_at_primary(app)
            wait_for_the_change_to_settle(app)
            assert client.llen(QUEUE) == 0 and client.hexists("unacked", held.delivery_tag)
            held.ack()
        finally:
            client.hdel(redis_keys.HOLDERS, holder.name)
            queue.clear()
            queue.close()


def test_a_message_taken_after_a_workers_last_word_waits_for_its_next_word() -> None:
    """A Redis failover keeps the replica's copy of each worker's last word, from up to a heartbeat
    before the old primary went: a message taken after it is missing there, though its worker still
    runs it. Put back then, a fetch would run twice at once: two requests to one host within its
    interval (the SIGKILL failover test saw a 0.019 s gap). It waits for the worker's next word."""
    app, client = tasks.crawl.app, tasks.deps.redis_client()
    registry = tasks.deps.node_registry()
    member = registration_for("still-running@box", 0)  # a plain worker: a member, on no ring
    with Connection(app.conf.broker_url) as connection:
        queue = connection.SimpleQueue(QUEUE)
        queue.put({"n": "runs on"})
        queue.put({"n": "dropped"})
        runs_on, dropped = queue.get(timeout=5), queue.get(timeout=5)
        assert (runs_on.payload, dropped.payload) == ({"n": "runs on"}, {"n": "dropped"})
        try:
            said_at = registry.beat(member)  # its last word on the old server: before it took either
            client.hset(redis_keys.HOLDERS, member.name, Holder(member.name, said_at, frozenset()).to_json())
            time.sleep(1.5)  # both taken before the old server's last note
            client.hset(redis_keys.primary_watch(), mapping={"run_id": "the-old-server", "seen_at": repr(time.time())})
            client.delete(redis_keys.primary_watch_lock())
            assert look_at_primary(app) == 0
            until = time.monotonic() + 3.0  # the session worker says again meanwhile (every 2 s); this one not
            while time.monotonic() < until:
                look_at_primary(app)
                assert client.llen(QUEUE) == 0, "put back before the worker holding it said again what it holds"
                time.sleep(0.1)
            said_at = registry.beat(member)  # its next word: it runs one, its consumer dropped the other
            holder = Holder(member.name, said_at, frozenset({runs_on.delivery_tag}), os.getpid(), socket.gethostname())
            client.hset(redis_keys.HOLDERS, member.name, holder.to_json())
            wait_for_the_change_to_settle(app)
            back = queue.get(timeout=5)
            assert back.payload == {"n": "dropped"}
            back.ack()
            assert client.llen(QUEUE) == 0 and client.hexists("unacked", runs_on.delivery_tag)
            runs_on.ack()
        finally:
            registry.beat(member, leaving=True)
            registry.forget(member.name)
            queue.clear()
            queue.close()


def wait_for_the_change_to_settle(app: Celery) -> None:
    """Look until the watch has put back what it would (the session worker's watch may be the one)."""
    client = tasks.deps.redis_client()

    def settled() -> bool:
        look_at_primary(app)
        return not client.hexists(redis_keys.primary_watch(), "cutoff")  # nothing pending any more

    wait_until(settled, 10, "every live member said again what it holds", 0.05)
