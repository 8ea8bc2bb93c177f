"""What a robots.txt says to vcrawl: groups, matching, key spellings, lines, Crawl-delay.

The reference parser's own test cases are in ``test_robots_reference.py``; these are vcrawl's.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frontier.robots import RobotsRules
from frontier.robots_groups import MAX_LINE_BYTES, PathRule

TOKEN = "vcrawl"
SITE = "http://example.com"


def _rules(text: str) -> RobotsRules:
    return RobotsRules.from_response(200, text.encode())


MATCHING = [
    # "*" wildcard
    ("User-agent: *\nDisallow: /*?sort=\n", "/list?sort=asc", False),
    ("User-agent: *\nDisallow: /*?sort=\n", "/list?page=2", True),
    ("User-agent: *\nDisallow: /*/print\n", "/a/b/print", False),
    # "$" end anchor
    ("User-agent: *\nDisallow: /*.cgi$\n", "/a.cgi", False),
    ("User-agent: *\nDisallow: /*.cgi$\n", "/a.cgi?id=7", True),
    ("User-agent: *\nDisallow: /*.cgi$\n", "/a.cgi/x", True),
    # the longest match wins; Allow wins a tie
    ("User-agent: *\nDisallow: /private/\nAllow: /private/public-\n", "/private/public-x", True),
    ("User-agent: *\nDisallow: /private/\nAllow: /private/public-\n", "/private/x", False),
    ("User-agent: *\nAllow: /p\nDisallow: /p\n", "/p", True),
    ("User-agent: *\nDisallow: /\nAllow: /$\n", "/", True),
    ("User-agent: *\nDisallow: /\nAllow: /$\n", "/page", False),
    # groups: another agent's group does not apply; our own overrides "*"
    ("User-agent: BadBot\nDisallow: /\n", "/x", True),
    ("User-agent: *\nDisallow: /\n\nUser-agent: vcrawl\nAllow: /\n", "/x", True),
    ("User-agent: *\nAllow: /\n\nUser-agent: vcrawl\nDisallow: /nope\n", "/nope", False),
    ("User-agent: *\nDisallow: /only-star\n\nUser-agent: vcrawl\nDisallow: /nope\n", "/only-star", True),
    ("User-agent: other\nUser-agent: vcrawl\nDisallow: /shared\n", "/shared", False),
    # agent names match case-insensitively, as a whole product token: [A-Za-z_-] from the start
    ("User-agent: VCrawl\nDisallow: /x\n", "/x", False),
    ("User-agent: vcrawl-news\nDisallow: /x\n", "/x", True),
    ("User-agent: crawl\nDisallow: /x\n", "/x", True),
    ("User-agent: *\nDisallow: /\nUser-agent: VCRAWL bar\nDisallow: /x\n", "/y", True),
    ("User-agent: *\nDisallow: /\nUser-agent: vcrawl/2.1\nDisallow: /x\n", "/y", True),
    ("User-agent: *\nDisallow: /\nUser-agent: vcrawl*\nDisallow: /x\n", "/y", True),
    ("User-agent: *\nDisallow: /\nUser-agent: vcrawlbot\nDisallow: /x\n", "/y", False),
    ("User-agent: * vcrawl\nDisallow: /x\n", "/x", False),  # "* ..." is still the "*" group
    # a group ends only at a user-agent line after its rules: other lines do not end it
    ("User-agent: vcrawl\nSitemap: http://example.com/s.xml\nUser-agent: other\nDisallow: /x\n", "/x", False),
    ("User-agent: vcrawl\nNoindex: /y\nUser-agent: other\nDisallow: /x\n", "/x", False),
    ("User-agent: vcrawl\nDisalow /z\nDisallow: /x\n", "/z", False),  # a typo and no colon
    ("User-agent: vcrawl\nDisallow: /x\nUser-agent: other\nDisallow: /y\n", "/y", True),
    # Crawl-delay, honoured by vcrawl, is a rule of its group: the next user-agent line starts another
    ("User-agent: vcrawl\nCrawl-delay: 5\nUser-agent: other\nDisallow: /x\n", "/x", True),
    # groups naming vcrawl are merged
    ("User-agent: vcrawl\nDisallow: /a\nUser-agent: other\nDisallow: /b\nUser-agent: vcrawl\nAllow: /b\n", "/a", False),
    # an empty Disallow allows everything; rules before any User-agent are ignored
    ("User-agent: *\nDisallow:\n", "/x", True),
    ("Disallow: /x\n", "/x", True),
    # comments and odd spacing
    ("# hello\nUser-agent: * # all\n  Disallow:   /x   # no\n", "/x", False),
    # percent-encoding: patterns and paths compared encoded (non-ASCII as UTF-8 %XX, %xx upper-cased);
    # an escape is not decoded, not even of an unreserved character (the reference's reading)
    ("User-agent: *\nDisallow: /a/b\n", "/a%2Fb", True),
    ("User-agent: *\nDisallow: /a%2Fb\n", "/a/b", True),
    ("User-agent: *\nDisallow: /a%2Fb\n", "/a%2fb", False),
    ("User-agent: *\nDisallow: /~joe\n", "/%7Ejoe", True),
    ("User-agent: *\nDisallow: /%7ejoe\n", "/~joe", True),
    ("User-agent: *\nDisallow: /%7ejoe\n", "/%7Ejoe", False),
    ("User-agent: *\nDisallow: /ä\n", "/%C3%A4", False),
    ("User-agent: *\nDisallow: /ä\n", "/ä", False),
    ("User-agent: *\nDisallow: /%c3%a4\n", "/ä", False),
    # the query and ;params are matched too; a URL in the query is part of it
    ("User-agent: *\nDisallow: /\nAllow: /a?u=http://x.test/?y&z\n", "/a?u=http://x.test/?y&z", True),
    ("User-agent: *\nDisallow: /*;jsessionid\n", "/a;jsessionid=1", False),
    # Allow of an index page allows its directory (only that URL)
    ("User-agent: *\nDisallow: /\nAllow: /d/index.htm\n", "/d/", True),
    ("User-agent: *\nDisallow: /\nAllow: /d/index.htm\n", "/d/x", False),
    # the robots.txt URL itself is always allowed
    ("User-agent: *\nDisallow: /\n", "/robots.txt", True),
    ("User-agent: *\nDisallow: /\n", "/x/robots.txt", False),
]


@pytest.mark.parametrize(("text", "path", "allowed"), MATCHING)
def test_can_fetch(text: str, path: str, allowed: bool) -> None:
    assert _rules(text).can_fetch(SITE + path, TOKEN) is allowed


@pytest.mark.parametrize("key", ["Disallow", "dissallow", "DISSALOW", "disalow", "diasllow", "disallaw", "Disallowed"])
@pytest.mark.parametrize("agent_key", ["User-agent", "useragent", "User agent", "USER-AGENT"])
def test_the_key_spellings_the_reference_accepts(key: str, agent_key: str) -> None:
    # robots.cc reads keys by prefix, with these frequent typos (kAllowFrequentTypos).
    rules = _rules(f"{agent_key}: vcrawl\n{key}: /x\n")
    assert not rules.can_fetch(SITE + "/x", TOKEN)
    assert rules.can_fetch(SITE + "/y", TOKEN)


@pytest.mark.parametrize("line", ["Disallow /x", "Disallow\t/x", "Disallow  \t /x  # why"])
def test_a_missing_colon_is_read_when_the_line_has_two_words(line: str) -> None:
    assert not _rules(f"User-agent vcrawl\n{line}\n").can_fetch(SITE + "/x", TOKEN)


def test_a_line_of_three_words_without_a_colon_is_not_a_rule() -> None:
    assert _rules("User-agent: vcrawl\nDisallow /x /y\n").can_fetch(SITE + "/x", TOKEN)


def test_the_token_is_compared_whole_not_looked_for_in_a_header() -> None:
    # The reference compares the crawler's name with the group's product token: callers pass the token.
    rules = _rules("User-agent: vcrawl\nDisallow: /x\n")
    assert rules.can_fetch(SITE + "/x", "Mozilla/5.0 (compatible; vcrawl/1.0; +http://example.com/bot)") is True
    assert rules.can_fetch(SITE + "/x", "VCrawl") is False


@pytest.mark.parametrize(
    ("text", "delay"),
    [
        ("User-agent: *\nCrawl-delay: 5\n", 5.0),
        ("User-agent: vcrawl\nCrawl-delay: 1.5\n\nUser-agent: *\nCrawl-delay: 10\n", 1.5),
        ("User-agent: *\nCrawl-delay: 10\n\nUser-agent: vcrawl\nDisallow: /x\n", None),  # our group has none
        ("User-agent: BadBot\nCrawl-delay: 60\n", None),
        ("User-agent: *\nCrawl-delay: soon\n", None),
        ("User-agent: *\nCrawl-delay: -1\n", None),
        ("User-agent: *\nDisallow: /x\n", None),
        # the groups chosen as for Allow/Disallow; Crawl-delay ends its group at the next user-agent line
        ("User-agent: VCRAWL bar\nCrawl-delay: 2\n\nUser-agent: *\nCrawl-delay: 10\n", 2.0),
        ("User-agent: other\nCrawl-delay: 5\nUser-agent: vcrawl\nDisallow: /x\n", None),
        ("User-agent: vcrawl\nUser-agent: *\nCrawl-delay: 3\n", 3.0),
        ("User-agent: vcrawl\nSitemap: http://example.com/s.xml\nUser-agent: other\nCrawl-delay: 4\n", 4.0),
        (
            "User-agent: vcrawl\nCrawl-delay: 1\nUser-agent: other\nDisallow: /\nUser-agent: vcrawl\nCrawl-delay: 2\n",
            2.0,
        ),
        ("User-agent: vcrawl\nCrawl-delay: 2\nCrawl-delay: soon\n", 2.0),
        ("User-agent: *\nCrawl-delay 7\n", 7.0),
        ("User-agent: *\ncrawl delay: 0.5\n", 0.5),
        ("Crawl-delay: 9\nUser-agent: *\nDisallow: /x\n", None),  # before any group: ignored
    ],
)
def test_crawl_delay(text: str, delay: float | None) -> None:
    assert _rules(text).crawl_delay(TOKEN) == delay


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_lines_end_at_cr_lf_or_crlf(newline: str) -> None:
    rules = _rules(newline.join(["User-agent: *", "Disallow: /x", "", "Allow: /x/y", ""]))
    assert not rules.can_fetch(SITE + "/x", TOKEN)
    assert rules.can_fetch(SITE + "/x/y", TOKEN)


def test_other_unicode_line_breaks_do_not_end_a_line() -> None:
    # str.splitlines() would also split at U+2028, \x0b, \x1c ...: robots.txt lines end at CR or LF only.
    rules = _rules("User-agent: *\nDisallow: /a\u2028Disallow: /b\n")
    assert rules.can_fetch(SITE + "/b", TOKEN)
    assert not rules.can_fetch(SITE + "/a%E2%80%A8Disallow: /b", TOKEN)  # one pattern, encoded


def test_a_long_line_is_cut_at_the_reference_byte_limit_not_inside_a_character() -> None:
    prefix = "Disallow: /"  # 11 bytes; then 3-byte characters across the limit
    body = "User-agent: *\n" + prefix + "ツ" * 6000 + "\n"
    kept = (MAX_LINE_BYTES - len(prefix)) // 3
    rules = _rules(body)
    assert not rules.can_fetch(SITE + "/" + "%E3%83%84" * kept + "x", TOKEN)
    assert rules.can_fetch(SITE + "/" + "%E3%83%84" * (kept - 1) + "x", TOKEN)


def _reference_matches(path: str, pattern: str) -> bool:
    """RobotsMatchStrategy::Matches of google/robotstxt (robots.cc, Apache-2.0), as the oracle:
    the set of path prefixes the pattern so far can match, one pattern character at a time."""
    positions = [0]
    for index, char in enumerate(pattern):
        if char == "$" and index == len(pattern) - 1:
            return positions[-1] == len(path)
        if char == "*":
            positions = list(range(positions[0], len(path) + 1))
        else:
            positions = [p + 1 for p in positions if p < len(path) and path[p] == char]
            if not positions:
                return False
    return True


_PATTERN_CHARS = st.sampled_from("ab/*$")


@settings(max_examples=1000)
@given(st.text(_PATTERN_CHARS, max_size=8), st.text(st.sampled_from("ab/$"), max_size=10))
def test_the_pattern_matcher_agrees_with_the_reference_algorithm(pattern: str, tail: str) -> None:
    path = "/" + tail
    assert PathRule(False, pattern).matches(path) is _reference_matches(path, pattern)
