"""A job's frontier split by host over a Redis Cluster's primaries: one partition per primary.

A script runs on one hash slot, so a job whose keys all share its hash tag ``{job}`` lives on one
primary, however many a cluster has. On a Redis Cluster a one-off job is split instead: partition 0
is the job's own tag, and each other primary gets a partition of its own, a tag ``{job~n}`` chosen
so that its slot is served by that primary. A host always belongs to the same partition, and each
partition is a frontier of its own under its tag: queues, ready heap, leases, Bloom filter,
counters, statistics. Every script keeps to one partition, so each stays exact. The seeds' hosts,
the sites a vertical crawl is about, are dealt out in turn (the n-th to partition n mod their
number, recorded with the job: its seeds never change), so each primary gets its even share of
them; a host found later goes by a hash of its name.

What spans partitions is done here, and in the frontier's rooms that ask this: an admission's links
go to their hosts' partitions (the analysed batch's own last, which finishes its pages); a batch
id names its partition (its suffix ``~n``); the job's state is set on every partition; counters
and statistics are summed; and the job completes once every partition is idle at one moment, seen
by collecting each partition's (pending, sequence) twice: equal, and nothing pending, means no URL
was in flight anywhere between the two looks, so none can come (``JobPartitions.quiet``).

A plain Redis, and a scheduled job (its cycles carry a history per URL), keep one partition.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot

from frontier.scripts import ScriptLoader
from frontier.urls import canonical_url, host_key
from vcrawl import names, redis_keys
from vcrawl.redis_replies import text

__all__ = ["PARTITION_MARK", "JobPartitions", "batch_partition"]

PARTITION_MARK = "~"
"""Joins a job id and a partition's number in the partition's tag, and ends a batch id with its number."""
_MOST_TRIES = 100_000  # tags tried for one primary: each lands on a given one of 3 primaries one time in 3


def batch_partition(batch_id: str) -> str:
    """The number of the partition that leased ``batch_id`` ('' for the job's own)."""
    head, mark, number = batch_id.rpartition(PARTITION_MARK)
    return number if mark and head else ""


class JobPartitions:
    """Which partition holds what, for every job (looked up once per job and process)."""

    def __init__(self, scripts: ScriptLoader) -> None:
        self._scripts = scripts
        self._redis = scripts.client
        self._known: dict[str, tuple[str, ...]] = {}
        self._placed: dict[str, dict[str, str]] = {}  # job -> seed host -> its partition

    def plan(self, job_id: str) -> tuple[str, ...]:
        """The partitions a new one-off job gets: its own id, then one per other primary of a cluster."""
        if not isinstance(self._redis, RedisCluster):
            return (job_id,)
        own = self._primary_of(redis_keys.job(job_id))
        primaries = sorted({node.name for node in self._redis.get_primaries()} - {own})
        ids = [job_id]
        for primary in primaries:
            for n in range(1, _MOST_TRIES):
                candidate = f"{job_id}{PARTITION_MARK}{n}"
                if candidate not in ids and self._primary_of(redis_keys.job(candidate)) == primary:
                    ids.append(candidate)
                    break
        return tuple(ids)

    def _primary_of(self, key: str) -> str:
        return str(self._redis.nodes_manager.get_node_from_slot(key_slot(key.encode())).name)

    def remember(self, job_id: str, ids: tuple[str, ...], placed: Sequence[str] = ()) -> None:
        self._known[job_id] = ids
        self._placed[job_id] = _deal(ids, placed)

    def of(self, job_id: str) -> tuple[str, ...]:
        """The job's partitions (its own id first; just it when not split)."""
        ids = self._known.get(job_id)
        if ids is None:
            raw = self._redis.hget(redis_keys.job(job_id), names.META_PARTITIONS)
            ids = tuple(json.loads(text(raw))) if raw else (job_id,)
            if raw:
                placed = self._redis.get(redis_keys.job_placed_hosts(job_id))
                self.remember(job_id, ids, json.loads(text(placed)) if placed else ())
            elif self._redis.exists(redis_keys.job(job_id)):  # a job not created yet is asked again
                self.remember(job_id, ids)
        return ids

    def for_host(self, job_id: str, host: str) -> str:
        """The partition holding ``host``'s queue: a seed host's dealt, any other's by a hash of its name."""
        ids = self.of(job_id)
        if len(ids) == 1:
            return ids[0]
        return self._placed.get(job_id, {}).get(host) or ids[zlib.crc32(host.encode()) % len(ids)]

    def for_batch(self, job_id: str, batch_id: str) -> str:
        """The partition that leased ``batch_id`` (its id ends with ``~n`` when not the job's own)."""
        number = batch_partition(batch_id)
        return f"{job_id}{PARTITION_MARK}{number}" if number else job_id

    def batch_suffix(self, job_id: str, part_id: str) -> str:
        """What ends the ids of the batches ``part_id`` leases ('' for the job's own partition)."""
        return "" if part_id == job_id else part_id[len(job_id) :]

    def split(self, job_id: str) -> bool:
        return len(self.of(job_id)) > 1

    def quiet(self, job_id: str) -> bool:
        """True when every partition of the running job had nothing pending at one moment (two
        looks at each partition's pending count and admission sequence, the second the same)."""
        ids = self.of(job_id)
        fields = [names.META_STATE, names.META_PENDING, names.META_SEQ, names.META_STARTING]

        def look() -> list[tuple[Any, ...]]:
            pipe = self._redis.pipeline(transaction=False)
            for part in ids:
                pipe.hmget(redis_keys.job(part), fields)
            return [tuple(text(value) if value is not None else None for value in row) for row in pipe.execute()]

        first = look()
        idle = all(state == names.STATE_RUNNING and int(pending or 0) <= 0 and not starting
                   for state, pending, _, starting in first)  # fmt: skip
        return idle and look() == first

    def complete_if_quiet(self, job_id: str) -> bool:
        """A split job whose partitions were all idle at one moment is completed: True if this call did it
        (each partition is marked, the job's own hash last)."""
        if not self.split(job_id) or not self.quiet(job_id):
            return False
        now = time.time()
        marked = [int(self._scripts.run("complete", [redis_keys.job(part)], [now])) for part in self.of(job_id)[::-1]]
        return marked[-1] == 1

    def started(self, job_id: str) -> bool:
        """A split job's seeds are all admitted: it may complete from now on; True if it just did (no seed was kept)."""
        if not self.split(job_id):
            return False
        self._redis.hdel(redis_keys.job(job_id), names.META_STARTING)
        return self.complete_if_quiet(job_id)

    def merged_state(self, job_id: str, own: dict[str, str]) -> dict[str, str]:
        """The job's hash as strings with its partitions' counters added (``own``: the job's own hash)."""
        ids = self.of(job_id)
        if len(ids) == 1:
            return own
        pipe = self._redis.pipeline(transaction=False)
        for part in ids[1:]:
            pipe.hgetall(redis_keys.job(part))
        merged = dict(own)
        for row in pipe.execute():
            for key, value in row.items():
                field, number = text(key), text(value)
                if field == names.META_PROGRESS_AT:
                    merged[field] = str(max(float(number), float(merged.get(field) or 0)))
                elif field not in _NOT_SUMMED and number.lstrip("-").isdigit():
                    merged[field] = str(int(merged.get(field) or 0) + int(number))
        return merged


MOST_PLACED_HOSTS = 20_000
"""Seed hosts dealt out at most (the list is read once per job and process); more go by their hash."""


def placed_hosts(seeds: Sequence[str]) -> list[str]:
    """The hosts of a job's seeds to deal out, as its admissions name them: each once, in order,
    ``MOST_PLACED_HOSTS`` at most (a seed that is no URL has none).

    >>> placed_hosts(["http://a.test/", "http://B.test:8080/x", "http://a.test/y", "not a url"])
    ['a.test', 'b.test:8080']
    """
    hosts: dict[str, None] = {}
    for seed in seeds:
        try:
            hosts.setdefault(host_key(canonical_url(seed)))
        except ValueError:
            continue
        if len(hosts) >= MOST_PLACED_HOSTS:
            break
    return list(hosts)


def _deal(ids: Sequence[str], hosts: Sequence[str]) -> dict[str, str]:
    """Seed host -> its partition: the n-th host to partition n mod their number.

    >>> _deal(("j", "j~1", "j~4"), ["a", "b", "c", "d"])
    {'a': 'j', 'b': 'j~1', 'c': 'j~4', 'd': 'j'}
    """
    return {host: ids[n % len(ids)] for n, host in enumerate(hosts)} if len(ids) > 1 else {}


_NOT_SUMMED = frozenset({names.META_CYCLE, names.META_SEQ, names.META_BATCH_SEQ, names.META_PARTITIONED,
                         names.META_SPEC_REV, names.META_STARTING})  # fmt: skip
