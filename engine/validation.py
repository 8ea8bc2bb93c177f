"""What a rule needs from this process's registries: one check for single tasks and job rules alike."""

from __future__ import annotations

from analyzers import check_rules, get_analyzer
from fetchers import FetcherRegistry
from fetchers.page_scripts import page_script
from vcrawl.browser_actions import BrowserAction
from vcrawl.errors import InvalidTask, UnknownComponent
from vcrawl.payloads import FieldRule, Rule

__all__ = ["check_rule"]


def check_rule(rule: Rule, fetchers: FetcherRegistry, where: str = "") -> None:
    """Check what a Rule cannot check alone: its page type's fetcher, its analyzer, its selectors.

    Raises:
        InvalidTask: naming the key (``<where>.analyzer``, or ``analyzer`` without ``where``).
    """
    prefix = f"{where}." if where else ""
    try:
        fetchers.check(rule.page_type)  # built-in or plug-in (``vcrawl.fetchers``), as this worker has them
    except UnknownComponent as exc:
        raise InvalidTask(f"{prefix}page_type", str(exc)) from None
    if rule.analyzer is not None and rule.page_type != "api":  # an api page's records come from its api spec
        try:
            get_analyzer(rule.analyzer)
        except UnknownComponent as exc:
            raise InvalidTask(f"{prefix}analyzer", str(exc)) from None
    try:
        if rule.fields is not None:
            check_rules(rule.fields)
        if rule.wait_for is not None:
            try:
                check_rules({"wait_for": FieldRule(css=rule.wait_for)})
            except InvalidTask as exc:
                raise InvalidTask("wait_for", exc.problem) from None
        for index, action in enumerate(rule.actions or ()):
            _check_action(action, f"actions[{index}]")
    except InvalidTask as exc:
        raise InvalidTask(f"{prefix}{exc.field}", exc.problem) from None


def _check_action(action: BrowserAction, where: str) -> None:
    """A browser action's selector parses (as the browser reads CSS), its page script is installed."""
    if action.verb == "script":
        try:
            page_script(action.target)
        except UnknownComponent as exc:
            raise InvalidTask(f"{where}.script", str(exc)) from None
    elif action.verb != "scroll":
        try:
            check_rules({action.verb: FieldRule(css=action.target)})
        except InvalidTask as exc:
            raise InvalidTask(f"{where}.{action.verb}", exc.problem) from None
