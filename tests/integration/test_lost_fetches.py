"""Finding fetch batch messages by their task id, as kombu writes them: on the shared download
queue, on a ring node's own queue, and unacknowledged. The watchdog that hands back a lease whose
message was lost runs with real workers in tests/faults/test_failover.py (a replica behind)."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from celeryconfig import DOWNLOAD_QUEUE
from cluster.membership import node_queue
from engine.fetch_batch import fetch_task_id
from tasks.batches import fetch_batch
from tasks.broker.lost_fetches import fetch_ids_present


@pytest.mark.parametrize("decoded", [True, False], ids=["vcrawl's client (str)", "raw (bytes)"])
def test_fetch_ids_are_found_on_shared_and_node_queues_and_unacknowledged(spare_broker: str, decoded: bool) -> None:
    client = redis.Redis.from_url(spare_broker, decode_responses=decoded)
    queues = {"1.a": DOWNLOAD_QUEUE, "2.a": node_queue("w1@host"), "3.a": DOWNLOAD_QUEUE}
    with Connection(spare_broker) as connection:
        for batch_id, queue in queues.items():
            fetch_batch.apply_async(("job-x", {"id": batch_id}), task_id=fetch_task_id("job-x", batch_id),
                                    connection=connection, queue=queue)  # fmt: skip
        everything = {fetch_task_id("job-x", batch_id) for batch_id in queues}
        assert fetch_ids_present(client) == everything

        consumer = connection.SimpleQueue(DOWNLOAD_QUEUE)
        taken = consumer.get(timeout=5)  # held by a consumer: in kombu's unacked hash, off the queue
        assert fetch_ids_present(client) == everything
        taken.ack()
        assert fetch_ids_present(client) == everything - {taken.headers["id"]}
        consumer.close()
