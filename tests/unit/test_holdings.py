"""The sweep's rule: which unacknowledged messages nobody holds (cluster/holdings.py)."""

from __future__ import annotations

from cluster.holdings import GRACE_S, SKEW_S, HeldMessage, Holder, held_fetch_batches, orphans
from cluster.members import Membership, NodeInfo, NodeRegistration

NOW_MS = 1_000_000


def node(name: str, alive: bool = True, down_at_ms: int | None = None) -> NodeInfo:
    return NodeInfo(NodeRegistration(name, 0, f"q.{name}"), alive, NOW_MS if alive else NOW_MS - 40_000, down_at_ms)


def holder(name: str, said_s_ago: float, *tags: str) -> Holder:
    return Holder(name, int(NOW_MS - said_s_ago * 1000), frozenset(tags))


def at(seconds_ago: float) -> float:
    return NOW_MS / 1000 - seconds_ago


def test_an_old_message_nobody_claims_is_an_orphan_and_a_claimed_one_is_not() -> None:
    members = Membership(NOW_MS, 30_000, (node("a"), node("b")))
    holders = {"a": holder("a", 1, "t1"), "b": holder("b", 0.5)}
    assert orphans({"t1": at(20), "t2": at(20)}, holders, members) == ["t2"]


def test_a_young_message_waits_for_the_grace_and_for_every_member_to_speak_after_it() -> None:
    members = Membership(NOW_MS, 30_000, (node("a"),))
    assert orphans({"t": at(GRACE_S - 1)}, {"a": holder("a", 0)}, members) == []
    # Taken before a's last word, but within the skew allowed for clocks: a may not have seen it yet.
    assert orphans({"t": at(GRACE_S + 1)}, {"a": holder("a", GRACE_S + 1 - SKEW_S + 0.5)}, members) == []
    assert orphans({"t": at(GRACE_S + 1)}, {"a": holder("a", 0)}, members) == ["t"]


def test_a_live_member_that_never_spoke_blocks_the_sweep() -> None:
    members = Membership(NOW_MS, 30_000, (node("a"), node("new")))
    assert orphans({"t": at(60)}, {"a": holder("a", 0)}, members) == []


def test_a_silent_member_keeps_its_claims_until_it_is_declared_down() -> None:
    silent = node("s", alive=False)
    members = Membership(NOW_MS, 30_000, (node("a"), silent))
    holders = {"a": holder("a", 0), "s": holder("s", 40, "t")}
    assert orphans({"t": at(60)}, holders, members) == []  # the declaration hands it over, with its lease
    down = Membership(NOW_MS, 30_000, (node("a"), node("s", alive=False, down_at_ms=NOW_MS - 1000)))
    assert orphans({"t": at(60)}, holders, down) == ["t"]


def test_a_holder_the_registry_no_longer_lists_still_claims() -> None:
    # A worker forgotten from the listing but still running says what it holds: never taken from it.
    members = Membership(NOW_MS, 30_000, (node("a"),))
    assert orphans({"t": at(60)}, {"a": holder("a", 0), "gone": holder("gone", 0, "t")}, members) == []


def test_fetch_batches_are_read_from_the_task_ids() -> None:
    messages = [HeldMessage("1", "vcrawl-fetch:job-x:12.ab", "download"),
                HeldMessage("2", "vcrawl-fetch:job-x:13.cd", "download.node.a@h"),
                HeldMessage("3", "vcrawl-analysis:job-x:12.ab", "analysis"), HeldMessage("4", "", "")]  # fmt: skip
    assert held_fetch_batches(messages) == {"job-x": ["12.ab", "13.cd"]}


def test_a_holder_round_trips_through_json() -> None:
    said = Holder("a@h", 5, frozenset({"x", "y"}), 42, "h")
    assert Holder.from_json("a@h", said.to_json()) == said
