"""The one rule for values vcrawl sends as HTTP header values: no CR, LF or other control characters.

User-Agents, Referers, proxy URLs (their credentials become ``Proxy-Authorization``) and api
secrets are sent in request headers. A CR or LF in one would split the header (requests refuses
such a value, so every fetch would fail later); other control characters are refused the same
way. They are checked where they are given: a job spec (also its live changes) and the settings.
"""

from __future__ import annotations

import re

from vcrawl.errors import InvalidTask

__all__ = ["HEADER_VALUE_PROBLEM", "check_header_value", "control_character_problem"]

HEADER_VALUE_PROBLEM = "must not hold CR, LF or other control characters (it is sent as an HTTP header)"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def control_character_problem(value: str) -> str | None:
    """Why ``value`` cannot be a header value (naming the first control character, not the value), or None.

    >>> control_character_problem("Mozilla/5.0 (X11)") is None
    True
    >>> control_character_problem("vcrawl\\r\\nX-Injected: 1")
    'must not hold CR, LF or other control characters (it is sent as an HTTP header): U+000D at character 7'
    """
    match = _CONTROL.search(value)
    if match is None:
        return None
    return f"{HEADER_VALUE_PROBLEM}: U+{ord(match.group()):04X} at character {match.start() + 1}"


def check_header_value(value: str, where: str) -> str:
    """Return ``value`` if it can be sent as a header value.

    Raises:
        InvalidTask: naming ``where`` (e.g. ``user_agents[1]``) and the first control character;
            the value itself is not repeated (a proxy URL or a secret may hold a password).
    """
    if (problem := control_character_problem(value)) is not None:
        raise InvalidTask(where, problem)
    return value
