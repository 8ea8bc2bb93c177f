"""The one rule for values vcrawl sends as HTTP header values: no CR, LF or other control characters,
and nothing past Latin-1 (requests sends a header value as ISO-8859-1 bytes; anything else fails every fetch).

User-Agents, Referers, proxy URLs (their credentials become ``Proxy-Authorization``) and api
secrets are sent in request headers. A CR or LF in one would split the header (requests refuses
such a value, so every fetch would fail later); other control characters are refused the same
way. They are checked where they are given: a job spec (also its live changes) and the settings.
"""

from __future__ import annotations

import re

from vcrawl.errors import InvalidTask

__all__ = ["HEADER_VALUE_PROBLEM", "check_header_value", "header_value_problem"]

HEADER_VALUE_PROBLEM = "must not hold CR, LF or other control characters (it is sent as an HTTP header)"

NOT_LATIN1_PROBLEM = "must be Latin-1 text (an HTTP header is sent as ISO-8859-1 bytes; use punycode or %-escapes)"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NOT_LATIN1 = re.compile(r"[^\x00-\xff]")


def header_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a header value (naming the first bad character, not the value), or None.

    >>> header_value_problem("Mozilla/5.0 (X11)") is None
    True
    >>> header_value_problem("vcrawl\\r\\nX-Injected: 1")
    'must not hold CR, LF or other control characters (it is sent as an HTTP header): U+000D at character 7'
    >>> header_value_problem("bot \\u2713").endswith("use punycode or %-escapes): U+2713 at character 5")
    True
    """
    for pattern, problem in ((_CONTROL, HEADER_VALUE_PROBLEM), (_NOT_LATIN1, NOT_LATIN1_PROBLEM)):
        if (match := pattern.search(value)) is not None:
            return f"{problem}: U+{ord(match.group()):04X} at character {match.start() + 1}"
    return None


def check_header_value(value: str, where: str) -> str:
    """Return ``value`` if it can be sent as a header value.

    Raises:
        InvalidTask: naming ``where`` (e.g. ``user_agents[1]``) and the first control character;
            the value itself is not repeated (a proxy URL or a secret may hold a password).
    """
    if (problem := header_value_problem(value)) is not None:
        raise InvalidTask(where, problem)
    return value
