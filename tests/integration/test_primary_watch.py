"""After the Redis primary changes (its run_id), what was taken from the old one goes back at once:
a real broker, a message taken and never acknowledged (kombu's unacked hash), the watch's look."""

from __future__ import annotations

import os
import socket
import time

import pytest
from kombu import Connection

import tasks
from engine.holdings import Holder
from tasks.primary_watch import look_at_primary
from vcrawl import redis_keys

pytestmark = pytest.mark.usefixtures("worker")

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
            deadline = time.monotonic() + 5
            while client.llen(QUEUE) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # the session worker's own watch may be the one that put it back
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
            time.sleep(1.0)  # the session worker's own watch may look too
            assert client.llen(QUEUE) == 0 and client.hexists("unacked", held.delivery_tag)
            held.ack()
        finally:
            client.hdel(redis_keys.HOLDERS, holder.name)
            queue.clear()
            queue.close()
