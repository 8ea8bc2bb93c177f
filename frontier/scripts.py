"""The frontier's Lua scripts: read from ``frontier/lua/*.lua``, named, and run over one client.

A script's text is made by ``vcrawl.lua.script_text`` (every ``{{NAME}}`` filled in from
``vcrawl.names``); scripts that keep time or finish a job's URLs start with the shared prelude
``frontier/lua/_common.lua`` (``clock_ms``, ``settle``, ``live_priority``, ``requeue``);
``_WITH_COMMON`` says which.

``ScriptLoader`` registers each script on the client the first time it is used (no Redis call:
redis-py only hashes the text) and runs it; a script Redis lost (restart, SCRIPT FLUSH) is loaded
again on the next call.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from vcrawl import redis_keys
from vcrawl.lua import script_text

__all__ = ["ScriptLoader", "job_keys", "lua_source"]

_WITH_COMMON = frozenset(
    {
        "admit",
        "pump",
        "start_lease",
        "release",
        "reclaim",
        "new_cycle",
        "resume",
        "hand_over",
        "hold",
        "node_beat",
        "node_down",
    }
)


@functools.cache
def lua_source(name: str) -> str:
    """The text of the script ``frontier/lua/<name>.lua``, with its prelude and names filled in.

    Raises:
        ValueError: the script names a ``{{NAME}}`` that ``vcrawl.names`` does not define.
    """
    return script_text(resources.files("frontier") / "lua", name, "_common" if name in _WITH_COMMON else None)


class ReplicaWait:
    """Wait (``WAIT 1 timeout_ms``) for a replica to have the frontier's writes that must survive a
    failover: admissions (the analysis that made them is acknowledged next) and releases (the fetch
    is acknowledged and its analysis sent next).

    Redis replicates asynchronously: a primary that dies takes its last writes with it, and the
    replica Sentinel promotes has a consistent prefix of what happened. A task acknowledged after a
    write the replica never got would be done by nobody: its message is gone from the queue, and
    its unacknowledged copy waits out the visibility timeout. With the WAIT in the same round trip
    as the write, the acknowledgement comes after the replica has the write (or ``timeout_ms``
    passed: a lagging replica slows the crawl by that much, never stops it). Only while the primary
    reports a connected replica (asked every ``recheck_s``): a lone Redis waits for nothing.
    """

    def __init__(self, client: Any, timeout_ms: int, recheck_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.timeout_ms = timeout_ms
        self._client = client
        self._recheck_s = recheck_s
        self._clock = clock
        self._looks: dict[int, tuple[float, int]] = {}  # id(server client) -> (asked at, its connected replicas)

    def wanted(self, server: redis.Redis | None = None) -> bool:
        """True when ``server`` (the loader's own, when not given: one server) has a replica connected,
        as of the last look; a Redis Cluster's primaries are asked one by one."""
        server = self._client if server is None else server
        name = id(server)  # the loader's own, or a cluster node's: clients that live as long as the loader
        now = self._clock()
        asked_at, replicas = self._looks.get(name, (None, 0))
        if asked_at is None or now - asked_at >= self._recheck_s:
            try:
                replicas = int(server.info("replication").get("connected_slaves", 0))
            except (redis.RedisError, ValueError, AttributeError):
                replicas = 0  # asked again at the next look
            self._looks[name] = (now, replicas)
        return replicas > 0


class ScriptLoader:
    """The frontier's scripts registered on one Redis client, each the first time it is used."""

    def __init__(self, client: redis.Redis, replica_wait: ReplicaWait | None = None) -> None:
        self.client = client
        self._scripts: dict[str, Script] = {}
        self._lock = threading.Lock()
        self._replica_wait = replica_wait

    def script(self, name: str) -> Script:
        """The registered script ``frontier/lua/<name>.lua``."""
        script = self._scripts.get(name)
        if script is None:
            with self._lock:
                script = self._scripts.setdefault(name, self.client.register_script(lua_source(name)))
        return script

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script (EVALSHA; loaded again if Redis lost it); its reply."""
        return self._call(self.script(name), keys, args)

    def _call(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return script(keys=list(keys), args=list(args))
        except NoScriptError:
            if not isinstance(self.client, RedisCluster):
                raise
            # A primary added after the scripts were loaded, reached by ASK while a slot moves onto it:
            # SCRIPT LOAD went to the primaries the client knew. EVAL carries the body (and caches it there).
            return self.client.eval(script.script, len(keys), *keys, *args)

    def run_with_wake(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        wake: bool,
        also: Sequence[tuple[Any, ...]] = (),
    ) -> Any:
        """Run a script and (with ``wake``) wake a waiting pump: one round trip; the script's reply.

        The wake-up list is not one of the job's keys (they share a hash tag; it is global), so it
        is pipelined, not written by the script; ``also`` are more commands for the same round
        trip. redis-py would check with SCRIPT EXISTS before every pipeline that runs a script, one
        more round trip each time; here a missing script (Redis restarted empty, or flushed) is
        loaded once and the pipeline sent again.
        """
        script = self.script(name)
        if isinstance(self.client, RedisCluster):
            return self._run_on_cluster(script, keys, args, wake=wake, also=also)
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            if wake:
                pipe.lpush(redis_keys.FRONTIER_WAKE, 1)
                pipe.ltrim(redis_keys.FRONTIER_WAKE, 0, 63)
            for command in also:
                pipe.execute_command(*command)
            if self._replica_wait is not None and self._replica_wait.wanted():
                pipe.execute_command("WAIT", 1, self._replica_wait.timeout_ms)
            try:
                return pipe.execute()[0]
            except NoScriptError:
                if attempt == 2:
                    raise
                self.client.script_load(script.script)
        raise AssertionError("unreachable")

    def _run_on_cluster(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], *, wake: bool, also: Sequence[tuple[Any, ...]]
    ) -> Any:
        """``run_with_wake`` on a Redis Cluster: the script and its WAIT in one round trip to the primary
        that holds the job's slot (redis-py refuses a script in a cluster pipeline, and WAIT waits for
        the writes of its own connection), then the wake-up where that key lives."""
        cluster = self.client
        server = cluster.get_redis_connection(cluster.get_node_from_key(keys[0]))
        reply: Any = None
        try:
            for attempt in (1, 2):
                pipe = server.pipeline(transaction=False)
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                if self._replica_wait is not None and self._replica_wait.wanted(server):
                    pipe.execute_command("WAIT", 1, self._replica_wait.timeout_ms)
                try:
                    reply = pipe.execute()[0]
                    break
                except NoScriptError:
                    if attempt == 2:
                        raise
                    server.script_load(script.script)
        except (MovedError, AskError, TryAgainError, RedisConnectionError):
            # The slot moved, or its primary is gone: through the cluster client, which follows the
            # slot to its owner and waits out a failover (a script run twice is harmless: each checks
            # its lease, token or state first).
            reply = self._call(script, keys, args)
        if wake or also:
            pipe = cluster.pipeline(transaction=False)
            if wake:
                pipe.lpush(redis_keys.FRONTIER_WAKE, 1)
                pipe.ltrim(redis_keys.FRONTIER_WAKE, 0, 63)
            for command in also:
                pipe.execute_command(*command)
            pipe.execute()
        return reply


def job_keys(job_id: str, *parts: str) -> list[str]:
    """The keys of a job's frontier structures named by ``parts`` (meta, ready, next, busy, leases, delays,
    queued_urls, inlinks)."""
    makers = {
        "meta": redis_keys.job,
        "ready": redis_keys.job_ready,
        "next": redis_keys.job_next,
        "busy": redis_keys.job_busy,
        "leases": redis_keys.job_leases,
        "delays": redis_keys.job_delays,
        "queued_urls": redis_keys.job_queued_urls,
        "inlinks": redis_keys.job_inlinks,
    }
    return [makers[part](job_id) for part in parts]
