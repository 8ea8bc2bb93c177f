"""The frontier's Redis Cluster client (tasks.redis_clients.make_frontier_client) while a slot moves onto
a primary just added, before that primary serves any slot: the source answers ASK with an address
``CLUSTER SLOTS`` does not list yet.

Real processes: a cluster of 3 primaries and 3 replicas plus one empty primary (tests/redis_cluster.py).
The slot is moved by hand, as ``redis-cli --cluster reshard`` does, and left half moved.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from frontier.scripts import ScriptLoader
from tasks.redis_clients import make_frontier_client
from tests.redis_cluster import RedisCluster, _client
from vcrawl import names, redis_keys
from vcrawl.settings import Settings

pytestmark = [pytest.mark.redis_ha, pytest.mark.slow]


def test_an_ask_to_a_primary_without_slots_is_followed_for_commands_and_frontier_scripts(tmp_path: Path) -> None:
    """Before the fix, each of these failed: redis-py looked the new primary up, found nothing and
    raised an AttributeError (redis-py issue 4015); a script, once that was fixed, met NOSCRIPT there."""
    with RedisCluster(tmp_path / "cluster") as cluster:
        client = make_frontier_client(Settings(redis_url="redis://127.0.0.1:9/0", frontier_url=cluster.url))
        try:
            meta, leases, renewals = redis_keys.job("ask"), redis_keys.job_leases("ask"), redis_keys.job_renewals("ask")
            client.hset(meta, names.META_STATE, names.STATE_RUNNING)
            client.hset(leases, "b1", '{"o":"run-1","e":[]}')
            client.set(renewals, 0)
            kept = "vcrawl:test:{ask}:kept"
            client.set(kept, "here")
            scripts = ScriptLoader(client)
            assert scripts.run("renew_leases", [meta, leases, renewals], ["b1", 0, "run-1"]) == [1]  # loaded
            slot, source_port = cluster.slot_of(meta)
            new_port = cluster.add_primary()
            assert new_port not in {node.port for node in client.get_nodes()}  # the client never heard of it
            with _client(source_port) as source, _client(new_port) as target:
                ids = {port: node.execute_command("CLUSTER", "MYID") for port, node in
                       ((source_port, source), (new_port, target))}  # fmt: skip
                target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source_port])
                source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[new_port])
                source.execute_command("MIGRATE", "127.0.0.1", new_port, "", 0, 5000, "KEYS", meta, leases, renewals)

                assert client.hget(meta, names.META_STATE) == names.STATE_RUNNING  # ASK, ASKING, the command
                assert client.get(kept) == "here"  # still at the source
                codes = scripts.run("renew_leases", [meta, leases, renewals], ["b1", 0, "run-1", "b2", 0, ""])
                assert codes == [1, 0]  # run where the keys now are: b1 held, b2 gone
                assert client.get(renewals) == "2"  # the script wrote where the keys are
                pipe = client.pipeline(transaction=False)
                pipe.hget(meta, names.META_STATE)
                pipe.lpush("vcrawl:test:{ask}:new", 1)  # a key that does not exist yet goes where it will live
                assert pipe.execute() == [names.STATE_RUNNING, 1]
                assert client.llen("vcrawl:test:{ask}:new") == 1
        finally:
            client.close()
