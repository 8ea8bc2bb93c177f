"""Browser actions as a rule gives them: validated at submit, bounded, named where wrong."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vcrawl.browser_actions import MAX_ACTIONS, MAX_REPEATS, BrowserAction, parse_actions
from vcrawl.errors import InvalidTask
from vcrawl.payloads import DownloadTask, Rule

ISSUE_FORM = [
    {"click": "#more", "until_gone": True, "max": 10},
    {"scroll": "end", "times": 3},
    {"type": "input[name=q]", "text": "shoes", "submit": True},
    {"wait_for": "a.found"},
    {"script": "open-details"},
]


def test_the_issue_form_parses_and_round_trips_through_a_rule() -> None:
    rule = Rule.from_dict({"pattern": "/list$", "page_type": "dynamic", "actions": ISSUE_FORM})
    assert rule.actions is not None
    assert [a.verb for a in rule.actions] == ["click", "scroll", "type", "wait_for", "script"]
    assert rule.actions[0] == BrowserAction("click", "#more", until_gone=True, repeat=10)
    assert rule.to_dict()["actions"] == ISSUE_FORM
    assert Rule.from_dict(rule.to_dict()) == rule


def test_defaults_one_click_one_scroll_and_ten_clicks_until_gone() -> None:
    click, until_gone, scroll = parse_actions([{"click": "a"}, {"click": "b", "until_gone": True}, {"scroll": 400}])
    assert (click.repeat, until_gone.repeat, scroll.repeat, scroll.target) == (1, 10, 1, "400")


def test_a_single_task_takes_actions_too() -> None:
    task = DownloadTask.from_dict({"url": "http://example.com/", "page_type": "dynamic", "actions": ISSUE_FORM[:2]})
    assert DownloadTask.from_dict(task.to_dict()) == task


@pytest.mark.parametrize(
    ("actions", "field", "problem"),
    [
        ("click #more", "rules[1].actions", "must be a list"),
        ([], "rules[1].actions", "at least one"),
        ([{"click": "a"}] * (MAX_ACTIONS + 1), "rules[1].actions", f"at most {MAX_ACTIONS}"),
        ([{"scroll": "end"}, "click"], "rules[1].actions[1]", "must be an object"),
        ([{"click": "a", "scroll": "end"}], "rules[1].actions[0]", "exactly one of"),
        ([{"press": "a"}], "rules[1].actions[0]", "exactly one of"),
        ([{"click": "a", "times": 2}], "rules[1].actions[0].times", "unknown key for click"),
        ([{"click": ""}], "rules[1].actions[0].click", "non-empty CSS selector"),
        ([{"click": "a", "max": MAX_REPEATS + 1}], "rules[1].actions[0].max", "from 1 to"),
        ([{"click": "a", "max": True}], "rules[1].actions[0].max", "from 1 to"),
        ([{"click": "a", "until_gone": "yes"}], "rules[1].actions[0].until_gone", "true or false"),
        ([{"scroll": "top"}], "rules[1].actions[0].scroll", '"end" or a number'),
        ([{"scroll": "end", "times": 0}], "rules[1].actions[0].times", "from 1 to"),
        ([{"type": "input"}], "rules[1].actions[0].text", "is required"),
        ([{"type": "input", "text": "x" * 1001}], "rules[1].actions[0].text", "at most 1000"),
        ([{"script": "alert(1)"}], "rules[1].actions[0].script", "registered page script"),
    ],
)
def test_a_wrong_action_is_refused_naming_its_key(actions: Any, field: str, problem: str) -> None:
    with pytest.raises(InvalidTask) as refused:
        Rule.from_dict({"pattern": "", "page_type": "dynamic", "actions": actions}, "rules[1]")
    assert refused.value.field == field
    assert problem in refused.value.problem


def test_only_dynamic_pages_act() -> None:
    with pytest.raises(InvalidTask) as refused:
        Rule.from_dict({"pattern": "", "actions": [{"click": "a"}]}, "rules[0]")
    assert refused.value.field == "rules[0].actions"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.sampled_from(["end", "#more", "click"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["click", "scroll", "type", "wait_for", "script", "max", "times", "text", "submit", "until_gone", "x"]), inner,
        max_size=4),
    max_leaves=12,
)  # fmt: skip


@given(_json)
def test_any_json_is_parsed_or_refused_with_a_field_never_a_crash(value: Any) -> None:
    try:
        actions = parse_actions(value)
    except InvalidTask as refused:
        assert refused.field.startswith("actions")
        return
    assert parse_actions([a.to_dict() for a in actions]) == actions
