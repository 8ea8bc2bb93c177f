"""A job's strategy and priorities: validation, the score formula, and the frontier's copy of its constants."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frontier.scripts import lua_source
from vcrawl.errors import InvalidTask
from vcrawl.jobs import JobSpec
from vcrawl.names import INLINK_BONUS, INLINK_CAP, SCORE_INLINK
from vcrawl.priorities import PrioritySpec

SEED = {"seeds": ["http://a.test/"]}


def _written_strategy(spec: JobSpec) -> str:
    """The strategy the spec's JSON says (what a worker reading it from Redis gets)."""
    return str(json.loads(spec.to_json()).get("strategy", "breadth-first"))


@pytest.mark.parametrize("strategy", ["breadth-first", "depth-first", "priority"])
def test_each_strategy_is_kept_and_round_trips(strategy: str) -> None:
    priorities = [{"pattern": "/x", "priority": -2.5}] if strategy == "priority" else []
    spec = JobSpec.from_dict({**SEED, "strategy": strategy, "priorities": priorities})

    assert spec.strategy == strategy and spec.priorities == tuple(PrioritySpec(**p) for p in priorities)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert _written_strategy(spec) == strategy


def test_breadth_first_is_the_default() -> None:
    assert JobSpec.from_dict(SEED).strategy == "breadth-first"


def test_a_default_spec_is_written_without_strategy_or_priorities_for_older_workers() -> None:
    spec = JobSpec.from_dict({**SEED, "strategy": "breadth-first", "priorities": []})

    data = spec.to_dict()

    assert "strategy" not in data and "priorities" not in data
    assert JobSpec.from_dict(data) == spec and _written_strategy(spec) == "breadth-first"
    assert JobSpec.from_dict({**SEED, "strategy": "depth-first"}).to_dict()["strategy"] == "depth-first"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"strategy": "bogus"}, "strategy"),
        ({"strategy": 3}, "strategy"),
        ({"strategy": None}, "strategy"),
        ({"priorities": {"pattern": "/x"}}, "priorities"),
        ({"priorities": ["/x"]}, "priorities[0]"),
        ({"priorities": [{"pattern": "/x", "priority": 1, "weight": 2}]}, "priorities[0].weight"),
        ({"priorities": [{"priority": 1}]}, "priorities[0].pattern"),
        ({"priorities": [{"pattern": "(unclosed", "priority": 1}]}, "priorities[0].pattern"),
        ({"priorities": [{"pattern": "/x"}]}, "priorities[0].priority"),
        ({"priorities": [{"pattern": "/x", "priority": 101}]}, "priorities[0].priority"),
        ({"priorities": [{"pattern": "/x", "priority": True}]}, "priorities[0].priority"),
        # Silently unused otherwise: only a priority job scores its URLs.
        ({"priorities": [{"pattern": "/x", "priority": 1}]}, "priorities"),
        ({"strategy": "depth-first", "priorities": [{"pattern": "/x", "priority": 1}]}, "priorities"),
    ],
)
def test_a_bad_strategy_or_priority_is_refused_naming_its_key(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidTask) as refused:
        JobSpec.from_dict({**SEED, **extra})

    assert refused.value.field == field


@pytest.mark.parametrize(
    ("url", "depth", "sitemap", "score"),
    [
        ("http://a.test/shop/1", 1, None, 10.4),  # the first matching pattern counts
        ("http://a.test/shop/sale/1", 1, None, 10.4),
        ("http://a.test/blog/1", 3, None, 0.2),  # no pattern: the sitemap's default and depth only
        ("http://a.test/blog/1", 0, 0.9, 0.9),  # the sitemap's own priority
        ("http://a.test/old/1", 2, 0.0, -5.2),
    ],
)
def test_the_priority_score_adds_pattern_sitemap_and_depth(
    url: str, depth: int, sitemap: float | None, score: float
) -> None:
    spec = JobSpec.from_dict(
        {
            **SEED,
            "strategy": "priority",
            "priorities": [
                {"pattern": "/shop/", "priority": 10},
                {"pattern": "/sale/", "priority": 50},
                {"pattern": "/old/", "priority": -5},
            ],
        }
    )

    assert spec.priority_of(url, depth, sitemap) == score


def test_the_admission_script_raises_in_links_by_the_documented_bonus_and_cap() -> None:
    admit = lua_source("admit")  # with vcrawl.names' values filled in

    assert f"<= {INLINK_CAP} then" in admit  # the in-link count is capped in the script
    assert f"'INCR', -{SCORE_INLINK!r}" in admit and INLINK_BONUS * 1e12 == SCORE_INLINK == 1e11  # score units (x 1e12)
