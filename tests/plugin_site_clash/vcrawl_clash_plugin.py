"""A broken plugin for the tests: it registers a name that a built-in analyzer already has."""

from __future__ import annotations

from typing import Any


def links(page: Any, rules: Any) -> dict:
    """Would shadow the built-in ``links`` analyzer."""
    return {}
