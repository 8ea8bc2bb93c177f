"""Browser actions: what a dynamic page's rule has the browser do, as a user would, before the page is read.

A rule lists its actions in order (docs/task-graph.md, "Browser actions")::

    "actions": [{"click": "#more", "until_gone": true, "max": 10}, {"scroll": "end", "times": 3},
                {"type": "input[name=q]", "text": "shoes", "submit": true}, {"wait_for": "a.found"},
                {"script": "open-details"}]

Each action is data: CSS selectors, text to type and the name of a page script the operator registered
(``vcrawl.page_scripts``), never code from the job. Every count is bounded here, and the whole list runs
within the browser's actions budget (``fetchers.browser_actions``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vcrawl.errors import InvalidTask, kind_of

__all__ = ["MAX_ACTIONS", "MAX_REPEATS", "MAX_TEXT", "BrowserAction", "parse_actions"]

MAX_ACTIONS = 20  # actions a rule may list
MAX_REPEATS = 50  # a click's "max", a scroll's "times"
MAX_TEXT = 1000  # characters typed into one field
MAX_SELECTOR = 500
_UNTIL_GONE_MAX = 10  # clicks of an until_gone click that gives no max
_SCRIPT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # a registry key, never code
# The keys each verb takes besides its own.
_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "click": ("until_gone", "max"),
    "scroll": ("times",),
    "type": ("text", "submit"),
    "wait_for": (),
    "script": (),
}


@dataclass(frozen=True)
class BrowserAction:
    """One step. ``verb`` is click, scroll, type, wait_for or script; ``target`` its selector, ``end``
    or a pixel count (scroll), or the page script's name."""

    verb: str
    target: str
    until_gone: bool = False  # click: again until the element is gone (at most ``repeat`` clicks)
    repeat: int = 1  # click: its "max"; scroll: its "times"
    text: str = ""  # type
    submit: bool = False  # type: press Enter after typing (a form's submit)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``parse_actions`` takes it back)."""
        data: dict[str, Any] = {self.verb: self.target}
        if self.verb == "click":
            data["max"] = self.repeat
            if self.until_gone:
                data["until_gone"] = True
        elif self.verb == "scroll":
            data.update(scroll=self.target if self.target == "end" else int(self.target), times=self.repeat)
        elif self.verb == "type":
            data["text"] = self.text
            if self.submit:
                data["submit"] = True
        return data


def parse_actions(value: Any, where: str = "actions") -> tuple[BrowserAction, ...]:
    """Decode and validate a rule's ``actions`` list.

    Raises:
        InvalidTask: naming the wrong part, e.g. ``actions[1].times``.
    """
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise InvalidTask(where, f"must be a list of actions, got {kind_of(value)}")
    if not value:
        raise InvalidTask(where, "must list at least one action (or leave actions out)")
    if len(value) > MAX_ACTIONS:
        raise InvalidTask(where, f"at most {MAX_ACTIONS} actions, got {len(value)}")
    return tuple(
        item if isinstance(item, BrowserAction) else _action(item, f"{where}[{index}]")
        for index, item in enumerate(value)
    )


def _action(item: Any, where: str) -> BrowserAction:
    if not isinstance(item, Mapping):
        raise InvalidTask(where, f'must be an object like {{"click": "#more"}}, got {kind_of(item)}')
    verbs = [key for key in item if key in _OPTIONS]
    if len(verbs) != 1:
        found = f"got {sorted(map(str, verbs))}" if verbs else f"got keys {sorted(map(str, item))}"
        raise InvalidTask(where, f"needs exactly one of {', '.join(_OPTIONS)}; {found}")
    verb = verbs[0]
    for key in item:
        if key != verb and key not in _OPTIONS[verb]:
            allowed = ", ".join(_OPTIONS[verb]) or "nothing else"
            raise InvalidTask(f"{where}.{key}", f"unknown key for {verb}; it takes {allowed}")
    target = item[verb]
    if verb == "scroll":
        return BrowserAction("scroll", _scroll_target(target, f"{where}.scroll"),
                             repeat=_count(item.get("times", 1), f"{where}.times"))  # fmt: skip
    if verb == "script":
        if not isinstance(target, str) or not _SCRIPT_NAME.match(target):
            raise InvalidTask(f"{where}.script", f"must be the name of a registered page script, got {target!r}")
        return BrowserAction("script", target)
    selector = _selector(target, f"{where}.{verb}")
    if verb == "click":
        until_gone = _flag(item.get("until_gone", False), f"{where}.until_gone")
        repeat = _count(item.get("max", _UNTIL_GONE_MAX if until_gone else 1), f"{where}.max")
        return BrowserAction("click", selector, until_gone=until_gone, repeat=repeat)
    if verb == "type":
        text = item.get("text")
        if not isinstance(text, str):
            raise InvalidTask(f"{where}.text", f"is required and must be a string, got {kind_of(text)}")
        if len(text) > MAX_TEXT:
            raise InvalidTask(f"{where}.text", f"at most {MAX_TEXT} characters, got {len(text)}")
        return BrowserAction("type", selector, text=text, submit=_flag(item.get("submit", False), f"{where}.submit"))
    return BrowserAction("wait_for", selector)


def _selector(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidTask(where, f"must be a non-empty CSS selector, got {kind_of(value)}")
    if len(value) > MAX_SELECTOR:
        raise InvalidTask(where, f"a selector of at most {MAX_SELECTOR} characters, got {len(value)}")
    return value


def _scroll_target(value: Any, where: str) -> str:
    if value == "end":
        return "end"
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 100_000:
        return str(value)
    raise InvalidTask(where, f'must be "end" or a number of pixels (1-100000), got {value!r}')


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEATS:
        raise InvalidTask(where, f"must be a whole number from 1 to {MAX_REPEATS}, got {value!r}")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidTask(where, f"must be true or false, got {kind_of(value)}")
    return value
