"""robots.txt lines, groups and matching as Google's reference parser reads them.

RFC 9309 was written from google/robotstxt (``robots.cc``); vcrawl reads a file the same way:

- a line is ``key: value``, or ``key value`` when the colon is missing and there are just two
  words; ``#`` starts a comment; lines end at CR, LF or CRLF; only the first 16,663 bytes of a
  line count;
- keys are matched by prefix, case-insensitively, with the misspellings the reference accepts
  (``useragent``, ``user agent``, ``dissallow``, ``dissalow``, ``disalow``, ``diasllow``,
  ``disallaw``);
- a user-agent value names the product token at its start (``[A-Za-z_-]``): ``VCRAWL bar`` is
  ``vcrawl``; ``*`` (alone or before a space) is the fallback group, used only when no group
  names the crawler; groups naming the crawler are merged;
- a group ends only at a user-agent line after its rules: unknown lines, typos and ``Sitemap``
  do not end it. vcrawl counts ``Crawl-delay``, which it honours, among the rules;
- Allow/Disallow values are percent-encoded (non-ASCII as UTF-8 ``%XX``, ``%xx`` upper-cased);
  ``*`` is any run of characters, a final ``$`` anchors the end; the longest pattern wins and
  Allow wins a tie; ``Allow: /dir/index.htm[l]`` allows ``/dir/`` too.

The URL's path, parameters and query are percent-encoded the same way before matching: the
reference leaves that to its caller, and vcrawl compares a URL as it requests it, encoded.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["MAX_LINE_BYTES", "Directive", "GroupChoice", "PathRule", "RobotsGroups", "directives", "escape_pattern",
           "path_params_query", "product_token"]  # fmt: skip

MAX_LINE_BYTES = 2083 * 8 - 1
"""The bytes of a line the reference keeps: 8 times the longest URL some browsers take, less the NUL."""

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_ASCII_SPACE = " \t\n\v\f\r"  # absl's ASCII whitespace; str.strip() would also take U+00A0 and friends
_WORD_BREAK = re.compile(r"[ \t]+")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("user-agent", ("user-agent", "useragent", "user agent")),
    ("allow", ("allow",)),
    ("disallow", ("disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw")),
    ("sitemap", ("sitemap", "site-map")),
)
_CRAWL_DELAY_KEYS = frozenset({"crawl-delay", "crawl delay"})  # the spellings Protego reads
_UNESCAPED_KINDS = frozenset({"user-agent", "sitemap"})
_GROUP_RULES = frozenset({"allow", "disallow", "crawl-delay"})
_PRODUCT_TOKEN = re.compile(r"[A-Za-z_-]*")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


@dataclass(frozen=True)
class Directive:
    """One ``key: value`` line: its number (from 1), its kind (a ``_KEYS`` name, ``crawl-delay``
    or ``unknown``) and its value, percent-encoded unless it is a user agent or a sitemap."""

    line: int
    kind: str
    value: str


def directives(text: str) -> list[Directive]:
    """Return the ``key: value`` lines of a robots.txt in order; lines that are not one are skipped."""
    found = []
    for number, line in enumerate(_LINE_BREAK.split(text), start=1):
        pair = _key_and_value(_cut(line))
        if pair is None:
            continue
        kind = _kind(pair[0])
        value = pair[1] if kind in _UNESCAPED_KINDS else escape_pattern(pair[1])
        found.append(Directive(number, kind, value))
    return found


def _cut(line: str) -> str:
    if len(line) * 4 <= MAX_LINE_BYTES:  # 4 bytes at most per character: short enough for sure
        return line
    data = line.encode("utf-8", "surrogatepass")
    return line if len(data) <= MAX_LINE_BYTES else data[:MAX_LINE_BYTES].decode("utf-8", "ignore")


def _key_and_value(line: str) -> tuple[str, str] | None:
    line = line.partition("#")[0].strip(_ASCII_SPACE)
    key, colon, value = line.partition(":")
    if not colon:
        # Google-specific: "disallow /x", colon forgotten, is read when it is exactly two words.
        words = _WORD_BREAK.search(line)
        if words is None or _WORD_BREAK.search(line, words.end()) is not None:
            return None
        key, value = line[: words.start()], line[words.end() :]
    key = key.strip(_ASCII_SPACE)
    return (key, value.strip(_ASCII_SPACE)) if key else None


def _kind(key: str) -> str:
    lowered = key.translate(_ASCII_LOWER)
    for kind, spellings in _KEYS:
        if lowered.startswith(spellings):
            return kind
    return "crawl-delay" if lowered in _CRAWL_DELAY_KEYS else "unknown"


def escape_pattern(value: str) -> str:
    """Percent-encode ``value`` as the reference does: non-ASCII as UTF-8 ``%XX``, ``%xx`` upper-cased.

    >>> escape_pattern("/SanJosé/%aa?q=%7e")
    '/SanJos%C3%A9/%AA?q=%7E'
    """
    if "%" in value:
        value = _ESCAPE.sub(lambda escape: escape.group().upper(), value)
    if value.isascii():
        return value
    return "".join(c if c.isascii() else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for c in value)  # fmt: skip


def path_params_query(url: str) -> str:
    """Return what rules match against: path, ``;params`` and ``?query`` of ``url``, from ``/``, no fragment.

    The reference's GetPathParamsQuery: it also takes a URL without a scheme, and gives ``/``
    for one with no path.

    >>> path_params_query("http://example.com/a/b?c=http://d.e/#top")
    '/a/b?c=http://d.e/'
    """
    start = 2 if url.startswith("//") else 0
    early_path = _find_first_of(url, "/?;", start)
    authority = url.find("://", start)
    if authority == -1 or (early_path != -1 and early_path < authority):
        authority = start  # a "://" after the path starts is in the path or query
    else:
        authority += 3
    path_start = _find_first_of(url, "/?;", authority)
    if path_start == -1:
        return "/"
    fragment = url.find("#", start)
    if fragment != -1 and fragment < path_start:
        return "/"
    path = url[path_start : fragment if fragment != -1 else len(url)]
    return path if path.startswith("/") else "/" + path


def _find_first_of(text: str, characters: str, start: int) -> int:
    found = [index for index in (text.find(c, start) for c in characters) if index != -1]
    return min(found) if found else -1


def product_token(value: str) -> str:
    """Return the product token a user-agent value names: its leading ``[A-Za-z_-]`` characters.

    >>> product_token("VCRAWL bar"), product_token("Foobot/2.1"), product_token("*")
    ('VCRAWL', 'Foobot', '')
    """
    match = _PRODUCT_TOKEN.match(value)
    return match.group() if match else ""


@dataclass(frozen=True)
class PathRule:
    """An Allow or Disallow pattern ready to match: split at ``*``, with its end anchor apart."""

    allow: bool
    pattern: str
    parts: tuple[str, ...] = field(init=False)
    anchored: bool = field(init=False)

    def __post_init__(self) -> None:
        anchored = self.pattern.endswith("$")  # "$" anywhere else is an ordinary character
        body = self.pattern[:-1] if anchored else self.pattern
        object.__setattr__(self, "anchored", anchored)
        object.__setattr__(self, "parts", tuple(body.split("*")))

    def matches(self, path: str) -> bool:
        """Return True if the pattern matches ``path`` from its start."""
        first, parts = self.parts[0], self.parts
        if len(parts) == 1:
            return path == first if self.anchored else path.startswith(first)
        if not path.startswith(first):
            return False
        # With "*" the only wildcard, the leftmost place for each part is as good as any.
        position = len(first)
        for part in parts[1:-1]:
            found = path.find(part, position)
            if found == -1:
                return False
            position = found + len(part)
        last = parts[-1]
        if self.anchored:
            return len(path) - len(last) >= position and path.endswith(last)
        return path.find(last, position) != -1


@dataclass(frozen=True)
class GroupChoice:
    """The groups that apply to one crawler: their rules longest first (Allow first on a tie) and
    their Crawl-delay values in file order."""

    rules: tuple[PathRule, ...]
    crawl_delays: tuple[str, ...]

    def is_allowed(self, path: str) -> bool:
        """Return True unless the longest matching pattern is a Disallow."""
        for rule in self.rules:
            if rule.matches(path):
                return rule.allow
        return True


@dataclass
class _Group:
    agents: set[str] = field(default_factory=set)  # product tokens, lowercase
    is_global: bool = False
    members: list[Directive] = field(default_factory=list)


class RobotsGroups:
    """A robots.txt read into groups; says what applies to a crawler's product token."""

    def __init__(self, text: str) -> None:
        self._groups = _groups(directives(text))
        self._choices: dict[str, GroupChoice] = {}  # by lowercased token; a race only chooses twice

    def choice(self, token: str) -> GroupChoice:
        """Return what applies to ``token``: every group naming it, else every ``*`` group."""
        key = token.translate(_ASCII_LOWER)
        choice = self._choices.get(key)
        if choice is None:
            named = [group for group in self._groups if key in group.agents]
            chosen = named or [group for group in self._groups if group.is_global]
            choice = _choice(member for group in chosen for member in group.members)
            self._choices[key] = choice
        return choice

    def is_allowed(self, url: str, token: str) -> bool:
        """Return True if the crawler with product ``token`` may fetch ``url``."""
        return self.choice(token).is_allowed(escape_pattern(path_params_query(url)))


def _groups(found: Iterable[Directive]) -> list[_Group]:
    groups: list[_Group] = []
    current: _Group | None = None
    after_rules = False
    for directive in found:
        if directive.kind == "user-agent":
            if current is None or after_rules:
                current, after_rules = _Group(), False
                groups.append(current)
            _name(current, directive.value)
        elif directive.kind in _GROUP_RULES and current is not None:  # rules before any group are ignored
            current.members.append(directive)
            after_rules = True
    return groups


def _name(group: _Group, value: str) -> None:
    # Google-specific: "* anything" is still the global group.
    if value[:1] == "*" and (len(value) == 1 or value[1] in _ASCII_SPACE):
        group.is_global = True
    elif token := product_token(value):
        group.agents.add(token.translate(_ASCII_LOWER))


def _choice(members: Iterable[Directive]) -> GroupChoice:
    rules: list[PathRule] = []
    delays: list[str] = []
    for member in members:
        if member.kind == "crawl-delay":
            delays.append(member.value)
        elif member.value:  # an empty pattern matches with priority 0: it never decides
            rules.append(PathRule(member.kind == "allow", member.value))
            if member.kind == "allow" and (directory := _index_html_directory(member.value)):
                rules.append(PathRule(True, directory))
    rules.sort(key=lambda rule: (-len(rule.pattern), not rule.allow))
    return GroupChoice(tuple(rules), tuple(delays))


def _index_html_directory(pattern: str) -> str | None:
    # Google-specific: allowing ".../index.htm" or ".../index.html" allows the directory itself.
    # The reference tries this only when the pattern did not match; it is shorter, so it never
    # outranks the pattern when both match.
    slash = pattern.rfind("/")
    if slash == -1 or not pattern.startswith("/index.htm", slash):
        return None
    return pattern[: slash + 1] + "$"
