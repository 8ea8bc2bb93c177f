"""The host ring's arithmetic: weighted shares, and only the hosts that must move do.

The shares are checked against the spread a correct ring has: with k virtual nodes among K, a
node's fraction of the circle is Beta(k, K - k); the hosts add a binomial spread. The hash is
fixed, so each assertion is deterministic; the bounds (4 standard deviations) say how far off a
correct ring may be, so a ring that ignored weights would fail them.
"""

from __future__ import annotations

import math

import pytest

from cluster.ring import HostRing, ring_point

HOSTS = [f"127.0.{i // 250}.{i % 250 + 1}:8800" for i in range(4000)]
SLIDES = {"A": 150, "B": 80, "C": 200, "D": 40}


def shares(ring: HostRing, hosts: list[str]) -> dict[str, float]:
    owners = ring.owners(hosts)
    return {name: sum(1 for owner in owners.values() if owner == name) / len(hosts) for name in ring.members}


def spread(weight: int, total: int, hosts: int) -> float:
    """Standard deviation of a node's host share: Beta(k, K-k) of the circle, binomial of the hosts."""
    p = weight / total
    circle = p * (1 - p) / (total + 1)
    return math.sqrt(circle + p * (1 - p) / hosts)


def test_hosts_are_shared_by_weight() -> None:
    ring = HostRing(SLIDES)
    total = sum(SLIDES.values())
    for name, share in shares(ring, HOSTS).items():
        ideal = SLIDES[name] / total
        assert abs(share - ideal) < 4 * spread(SLIDES[name], total, len(HOSTS)), (name, share, ideal)


def test_equal_weights_would_not_pass_for_the_slides_nodes() -> None:
    # The bounds above have teeth: a ring that ignored weights (100 points each) is far off.
    ring = HostRing(dict.fromkeys(SLIDES, 100))
    total = sum(SLIDES.values())
    got = shares(ring, HOSTS)
    assert abs(got["D"] - SLIDES["D"] / total) > 4 * spread(SLIDES["D"], total, len(HOSTS))


def test_a_node_leaving_moves_only_its_own_hosts() -> None:
    before = HostRing(SLIDES)
    after = before.without(["C"])
    old, new = before.owners(HOSTS), after.owners(HOSTS)
    moved = [host for host in HOSTS if old[host] != new[host]]
    assert moved and all(old[host] == "C" for host in moved)
    assert len(moved) == sum(1 for owner in old.values() if owner == "C")  # all of C's, no more
    # C's hosts spread over the others by weight, not onto one neighbour.
    receivers = {new[host] for host in moved}
    assert receivers == {"A", "B", "D"}


def test_a_node_joining_takes_about_its_share_and_only_from_others() -> None:
    before = HostRing({name: weight for name, weight in SLIDES.items() if name != "C"})
    after = HostRing({**before.members, "E": 300})
    old, new = before.owners(HOSTS), after.owners(HOSTS)
    moved = [host for host in HOSTS if old[host] != new[host]]
    assert all(new[host] == "E" for host in moved)  # hosts move only to the newcomer
    ideal = 300 / 570
    assert abs(len(moved) / len(HOSTS) - ideal) < 4 * spread(300, 570, len(HOSTS))


def test_owners_are_the_same_in_every_process() -> None:
    # BLAKE2b, not hash(): no per-process salt. Fixed values pin the function down.
    assert ring_point("example.com") == ring_point("example.com")
    assert ring_point("a#0") != ring_point("a#1")
    assert HostRing(SLIDES).owners(HOSTS[:50]) == HostRing(dict(reversed(SLIDES.items()))).owners(HOSTS[:50])


def test_no_nodes_no_owner_and_weight_zero_is_off_the_ring() -> None:
    assert HostRing({}).owner("h") is None and HostRing({}).owners(["h"]) == {}
    ring = HostRing({"a": 100, "b": 0})
    assert ring.members == {"a": 100} and ring.owner("h") == "a"


@pytest.mark.parametrize("weight", [1, 7, 100])
def test_a_single_node_owns_everything(weight: int) -> None:
    ring = HostRing({"only": weight})
    assert set(ring.owners(HOSTS[:100]).values()) == {"only"}
