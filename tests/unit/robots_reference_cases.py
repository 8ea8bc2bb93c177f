"""The published test cases of Google's reference robots.txt parser, as data for vcrawl's tests.

Source: google/robotstxt (https://github.com/google/robotstxt), ``robots_test.cc`` at commit
c8ac4b1d93183ddcab30d09415356bf52550c6a5, and the typo lines of ``reporting_robots_test.cc``
at commit 19feaac85734d519df5d6543ae92b1dead2f5974. Copyright 2019 Google LLC, Apache License
2.0 (https://www.apache.org/licenses/LICENSE-2.0). Only the inputs and expected answers are
taken, transcribed from the C++; the code that runs them is vcrawl's (test_robots_reference.py).

Every EXPECT_TRUE/EXPECT_FALSE/EXPECT_EQ is one row, in the file's order, named by its TEST.
``IsUserAgentAllowed(robots, agent, url)`` rows are ``CHECKS``; the parse reports
(``RobotsStatsReporter``) are ``REPORTS``; ``IsValidUserAgentToObey`` rows are ``TOKENS``;
``GetPathParamsQuery`` and ``MaybeEscapePattern`` rows are ``PATHS`` and ``ESCAPES``.
A row vcrawl decides differently on purpose says so in ``differs``, with vcrawl's answer.
"""

from __future__ import annotations

from dataclasses import dataclass

REFUSED = "ValueError"
"""vcrawl's answer when ``RobotsRules.can_fetch`` refuses the question (an empty product token)."""


@dataclass(frozen=True)
class Check:
    """``IsUserAgentAllowed(robots, agent, url)`` and the reference's answer ``allowed``."""

    source: str
    robots: str
    agent: str
    url: str
    allowed: bool
    differs: str = ""  # why vcrawl answers ``vcrawl`` instead; empty when it agrees
    vcrawl: bool | str | None = None

    @property
    def expected(self) -> bool | str:
        """vcrawl's answer: the reference's, unless the row says why not."""
        return self.vcrawl if self.differs and self.vcrawl is not None else self.allowed


def _checks(source: str, robots: str, *rows: tuple[str, str, bool]) -> list[Check]:
    return [Check(source, robots, agent, url, allowed) for agent, url, allowed in rows]


_EMPTY_TOKEN = (
    "vcrawl always names itself: RobotsRules.can_fetch refuses an empty product token (ValueError) "
    "instead of answering for no crawler"
)
_ENCODED_URL = (
    "vcrawl percent-encodes the URL's path and query before matching, as RFC 9309 2.2.2 asks; the "
    "reference leaves that to its caller. vcrawl requests /foo/bar/%E3%83%84 for this URL, which the "
    "Allow line names"
)

_FOO = "user-agent: FooBot\ndisallow: /\n"
_GROUPS = (
    "allow: /foo/bar/\n\nuser-agent: FooBot\ndisallow: /\nallow: /x/\nuser-agent: BarBot\ndisallow: /\n"
    "allow: /y/\n\n\nallow: /w/\nuser-agent: BazBot\n\nuser-agent: FooBot\nallow: /z/\ndisallow: /\n"
)
_XY, _AB = "http://foo.bar/x/y", "http://foo.bar/a/b"
_PAGE = "http://foo.bar/x/page.html"
_ENCODING_QUERY = "/foo/bar?qux=taz&baz=http://foo.bar?tar&par"
_KEY_CASES = (
    "USER-AGENT: FooBot\nALLOW: /x/\nDISALLOW: /\n",
    "user-agent: FooBot\nallow: /x/\ndisallow: /\n",
    "uSeR-aGeNt: FooBot\nAlLoW: /x/\ndIsAlLoW: /\n",
)
_AGENT_CASES = (
    "User-Agent: FOO BAR\nAllow: /x/\nDisallow: /\n",
    "User-Agent: foo bar\nAllow: /x/\nDisallow: /\n",
    "User-Agent: FoO bAr\nAllow: /x/\nDisallow: /\n",
)


def _case_insensitive(source: str, robots: tuple[str, ...], agents: tuple[str, ...]) -> list[Check]:
    rows: list[Check] = []
    for agent in agents:
        rows += [Check(source, text, agent, _XY, True) for text in robots]
        rows += [Check(source, text, agent, _AB, False) for text in robots]
    return rows


def _line_too_long() -> list[Check]:
    # The C++ builds these lines in a loop; so does this, with its numbers.
    max_line_len, eol_len, allow, disallow = 2083 * 8, 1, "allow: ", "disallow: "
    longline = "/x/"
    max_length = max_line_len - len(longline) - len(disallow) + eol_len
    longline += "a" * (max_length - len(longline))
    robots = "user-agent: FooBot\n" + disallow + longline + "/qux\n"
    rows = _checks(
        "GoogleOnly_LineTooLong",
        robots,
        ("FooBot", "http://foo.bar/fux", True),
        ("FooBot", "http://foo.bar" + longline + "/fux", False),
    )
    max_length = max_line_len - len("/x/") - len(allow) + eol_len
    line_a, line_b = "/x/" + "a" * (max_length - 3), "/x/" + "b" * (max_length - 3)
    robots = "user-agent: FooBot\ndisallow: /\n" + allow + line_a + "/qux\n" + allow + line_b + "/qux\n"
    return rows + _checks(
        "GoogleOnly_LineTooLong",
        robots,
        ("FooBot", "http://foo.bar/", False),
        ("FooBot", "http://foo.bar" + line_a + "/qux", True),
        ("FooBot", "http://foo.bar" + line_b + "/fux", True),
    )


def _documentation() -> list[Check]:
    source, bar = "GoogleOnly_DocumentationChecks", "http://foo.bar"

    def group(pattern: str, *rows: tuple[str, bool]) -> list[Check]:
        robots = f"user-agent: FooBot\ndisallow: /\nallow: {pattern}\n"
        return _checks(source, robots, *(("FooBot", bar + path, allowed) for path, allowed in rows))

    fish = ("/fish", "/fish.html", "/fish/salmon.html", "/fishheads", "/fishheads/yummy.html", "/fish.html?id=anything")
    return [
        *group("/fish", ("/bar", False), *((p, True) for p in fish), ("/Fish.asp", False), ("/catfish", False),
               ("/?id=fish", False)),
        *group("/fish*", ("/bar", False), *((p, True) for p in fish), ("/Fish.bar", False), ("/catfish", False),
               ("/?id=fish", False)),
        *group("/fish/", ("/bar", False), ("/fish/", True), ("/fish/salmon", True), ("/fish/?salmon", True),
               ("/fish/salmon.html", True), ("/fish/?id=anything", True), ("/fish", False), ("/fish.html", False),
               ("/Fish/Salmon.html", False)),
        *group("/*.php", ("/bar", False), ("/filename.php", True), ("/folder/filename.php", True),
               ("/folder/filename.php?parameters", True), ("//folder/any.php.file.html", True),
               ("/filename.php/", True), ("/index?f=filename.php/", True), ("/php/", False), ("/index?php", False),
               ("/windows.PHP", False)),
        *group("/*.php$", ("/bar", False), ("/filename.php", True), ("/folder/filename.php", True),
               ("/filename.php?parameters", False), ("/filename.php/", False), ("/filename.php5", False),
               ("/php/", False), ("/filename?php", False), ("/aaaphpaaa", False), ("//windows.PHP", False)),
        *group("/fish*.php", ("/bar", False), ("/fish.php", True), ("/fishheads/catfish.php?parameters", True),
               ("/Fish.PHP", False)),
        *_checks(source, "user-agent: FooBot\nallow: /p\ndisallow: /\n", ("FooBot", "http://example.com/page", True)),
        *_checks(source, "user-agent: FooBot\nallow: /folder\ndisallow: /folder\n",
                 ("FooBot", "http://example.com/folder/page", True)),
        *_checks(source, "user-agent: FooBot\nallow: /page\ndisallow: /*.htm\n",
                 ("FooBot", "http://example.com/page.htm", False)),
        *_checks(source, "user-agent: FooBot\nallow: /$\ndisallow: /\n", ("FooBot", "http://example.com/", True),
                 ("FooBot", "http://example.com/page.html", False)),
    ]  # fmt: skip


CHECKS: list[Check] = [
    *_checks("GoogleOnly_SystemTest", "", ("FooBot", "", True)),
    Check("GoogleOnly_SystemTest", _FOO, "", "", True, _EMPTY_TOKEN, REFUSED),
    *_checks("GoogleOnly_SystemTest", _FOO, ("FooBot", "", False)),
    Check("GoogleOnly_SystemTest", "", "", "", True, _EMPTY_TOKEN, REFUSED),
    *_checks("ID_LineSyntax_Line", _FOO, ("FooBot", _XY, False)),
    *_checks("ID_LineSyntax_Line", "foo: FooBot\nbar: /\n", ("FooBot", _XY, True)),
    *_checks("ID_LineSyntax_Line", "user-agent FooBot\ndisallow /\n", ("FooBot", _XY, False)),
    *_checks("ID_LineSyntax_Groups", _GROUPS, ("FooBot", "http://foo.bar/x/b", True),
             ("FooBot", "http://foo.bar/z/d", True), ("FooBot", "http://foo.bar/y/c", False),
             ("BarBot", "http://foo.bar/y/c", True), ("BarBot", "http://foo.bar/w/a", True),
             ("BarBot", "http://foo.bar/z/d", False), ("BazBot", "http://foo.bar/z/d", True),
             ("FooBot", "http://foo.bar/foo/bar/", False), ("BarBot", "http://foo.bar/foo/bar/", False),
             ("BazBot", "http://foo.bar/foo/bar/", False)),
    *_checks("ID_LineSyntax_Groups_OtherRules",
             "User-agent: BarBot\nSitemap: https://foo.bar/sitemap\nUser-agent: *\nDisallow: /\n",
             ("FooBot", "http://foo.bar/", False), ("BarBot", "http://foo.bar/", False)),
    *_checks("ID_LineSyntax_Groups_OtherRules",
             "User-agent: FooBot\nInvalid-Unknown-Line: unknown\nUser-agent: *\nDisallow: /\n",
             ("FooBot", "http://foo.bar/", False), ("BarBot", "http://foo.bar/", False)),
    *_case_insensitive("ID_REPLineNamesCaseInsensitive", _KEY_CASES, ("FooBot",)),
    *_case_insensitive("ID_UserAgentValueCaseInsensitive", _AGENT_CASES, ("Foo", "foo")),
    *_checks("GoogleOnly_AcceptUserAgentUpToFirstSpace",
             "User-Agent: *\nDisallow: /\nUser-Agent: Foo Bar\nAllow: /x/\nDisallow: /\n",
             ("Foo", _XY, True), ("Foo Bar", _XY, False)),
    *_checks("ID_GlobalGroups_Secondary", "", ("FooBot", _XY, True)),
    *_checks("ID_GlobalGroups_Secondary", "user-agent: *\nallow: /\nuser-agent: FooBot\ndisallow: /\n",
             ("FooBot", _XY, False), ("BarBot", _XY, True)),
    *_checks("ID_GlobalGroups_Secondary",
             "user-agent: FooBot\nallow: /\nuser-agent: BarBot\ndisallow: /\nuser-agent: BazBot\ndisallow: /\n",
             ("QuxBot", _XY, True)),
    *_checks("ID_AllowDisallow_Value_CaseSensitive", "user-agent: FooBot\ndisallow: /x/\n", ("FooBot", _XY, False)),
    *_checks("ID_AllowDisallow_Value_CaseSensitive", "user-agent: FooBot\ndisallow: /X/\n", ("FooBot", _XY, True)),
    *_checks("ID_LongestMatch", "user-agent: FooBot\ndisallow: /x/page.html\nallow: /x/\n", ("FooBot", _PAGE, False)),
    *_checks("ID_LongestMatch", "user-agent: FooBot\nallow: /x/page.html\ndisallow: /x/\n", ("FooBot", _PAGE, True),
             ("FooBot", "http://foo.bar/x/", False)),
    *_checks("ID_LongestMatch", "user-agent: FooBot\ndisallow: \nallow: \n", ("FooBot", _PAGE, True)),
    *_checks("ID_LongestMatch", "user-agent: FooBot\ndisallow: /\nallow: /\n", ("FooBot", _PAGE, True)),
    *_checks("ID_LongestMatch", "user-agent: FooBot\ndisallow: /x\nallow: /x/\n",
             ("FooBot", "http://foo.bar/x", False), ("FooBot", "http://foo.bar/x/", True)),
    *_checks("ID_LongestMatch", "user-agent: FooBot\ndisallow: /x/page.html\nallow: /x/page.html\n",
             ("FooBot", _PAGE, True)),
    *_checks("ID_LongestMatch", "user-agent: FooBot\nallow: /page\ndisallow: /*.html\n",
             ("FooBot", "http://foo.bar/page.html", False), ("FooBot", "http://foo.bar/page", True)),
    *_checks("ID_LongestMatch", "user-agent: FooBot\nallow: /x/page.\ndisallow: /*.html\n", ("FooBot", _PAGE, True),
             ("FooBot", "http://foo.bar/x/y.html", False)),
    *_checks("ID_LongestMatch", "User-agent: *\nDisallow: /x/\nUser-agent: FooBot\nDisallow: /y/\n",
             ("FooBot", "http://foo.bar/x/page", True), ("FooBot", "http://foo.bar/y/page", False)),
    *_checks("ID_Encoding", f"User-agent: FooBot\nDisallow: /\nAllow: {_ENCODING_QUERY}\n",
             ("FooBot", "http://foo.bar" + _ENCODING_QUERY, True)),
    *_checks("ID_Encoding", "User-agent: FooBot\nDisallow: /\nAllow: /foo/bar/ツ\n",
             ("FooBot", "http://foo.bar/foo/bar/%E3%83%84", True)),
    Check("ID_Encoding", "User-agent: FooBot\nDisallow: /\nAllow: /foo/bar/ツ\n", "FooBot", "http://foo.bar/foo/bar/ツ",
          False, _ENCODED_URL, True),
    *_checks("ID_Encoding", "User-agent: FooBot\nDisallow: /\nAllow: /foo/bar/%E3%83%84\n",
             ("FooBot", "http://foo.bar/foo/bar/%E3%83%84", True)),
    Check("ID_Encoding", "User-agent: FooBot\nDisallow: /\nAllow: /foo/bar/%E3%83%84\n", "FooBot",
          "http://foo.bar/foo/bar/ツ", False, _ENCODED_URL, True),
    *_checks("ID_Encoding", "User-agent: FooBot\nDisallow: /\nAllow: /foo/bar/%62%61%7A\n",
             ("FooBot", "http://foo.bar/foo/bar/baz", False), ("FooBot", "http://foo.bar/foo/bar/%62%61%7A", True)),
    *_checks("ID_SpecialCharacters", "User-agent: FooBot\nDisallow: /foo/bar/quz\nAllow: /foo/*/qux\n",
             ("FooBot", "http://foo.bar/foo/bar/quz", False), ("FooBot", "http://foo.bar/foo/quz", True),
             ("FooBot", "http://foo.bar/foo//quz", True), ("FooBot", "http://foo.bar/foo/bax/quz", True)),
    *_checks("ID_SpecialCharacters", "User-agent: FooBot\nDisallow: /foo/bar$\nAllow: /foo/bar/qux\n",
             ("FooBot", "http://foo.bar/foo/bar", False), ("FooBot", "http://foo.bar/foo/bar/qux", True),
             ("FooBot", "http://foo.bar/foo/bar/", True), ("FooBot", "http://foo.bar/foo/bar/baz", True)),
    *_checks("ID_SpecialCharacters", "User-agent: FooBot\n# Disallow: /\nDisallow: /foo/quz#qux\nAllow: /\n",
             ("FooBot", "http://foo.bar/foo/bar", True), ("FooBot", "http://foo.bar/foo/quz", False)),
    *_checks("GoogleOnly_IndexHTMLisDirectory", "User-Agent: *\nAllow: /allowed-slash/index.html\nDisallow: /\n",
             ("foobot", "http://foo.com/allowed-slash/", True),
             ("foobot", "http://foo.com/allowed-slash/index.htm", False),
             ("foobot", "http://foo.com/allowed-slash/index.html", True),
             ("foobot", "http://foo.com/anyother-url", False)),
    *_line_too_long(),
    *_documentation(),
]  # fmt: skip


@dataclass(frozen=True)
class Report:
    """``ParseRobotsTxt(body)`` seen by the test's ``RobotsStatsReporter``; None: that count is not checked."""

    source: str
    body: bytes
    valid_directives: int | None = None
    last_line_seen: int | None = None
    unknown_directives: int | None = None
    sitemap: str | None = None


_LINES = ("User-Agent: foo", "Allow: /some/path", "User-Agent: bar", "", "", "Disallow: /")
_SITEMAP = "http://foo.bar/sitemap.xml"
_TEMP = b"User-Agent: foo\nAllow: /some/path\nUser-Agent: bar\n\n\n"
_NUMBERS = "ID_LinesNumbersAreCountedCorrectly"
_BOM = "ID_UTF8ByteOrderMarkIsSkipped"
_SITEMAPS = "ID_NonStandardLineExample_Sitemap"

REPORTS: list[Report] = [
    Report(_NUMBERS, "\n".join(_LINES).encode() + b"\n", 4, 6),
    Report(_NUMBERS, "\r\n".join(_LINES).encode() + b"\r\n", 4, 6),
    Report(_NUMBERS, "\r".join(_LINES).encode() + b"\r", 4, 6),
    Report(_NUMBERS, "\n".join(_LINES).encode(), 4, 6),
    Report(_NUMBERS, b"User-Agent: foo\nAllow: /some/path\r\nUser-Agent: bar\n\r\n\nDisallow: /", 4, 6),
    Report(_BOM, b"\xef\xbb\xbfUser-Agent: foo\nAllow: /AnyValue\n", 2, unknown_directives=0),
    Report(_BOM, b"\xef\xbbUser-Agent: foo\nAllow: /AnyValue\n", 2, unknown_directives=0),
    Report(_BOM, b"\xefUser-Agent: foo\nAllow: /AnyValue\n", 2, unknown_directives=0),
    Report(_BOM, b"\xef\x11\xbfUser-Agent: foo\nAllow: /AnyValue\n", 1, unknown_directives=1),
    Report(_BOM, b"User-Agent: foo\n\xef\xbb\xbfAllow: /AnyValue\n", 1, unknown_directives=1),
    Report(_SITEMAPS, _TEMP + b"Sitemap: " + _SITEMAP.encode() + b"\n", sitemap=_SITEMAP),
    Report(_SITEMAPS, b"Sitemap: " + _SITEMAP.encode() + b"\n" + _TEMP, sitemap=_SITEMAP),
]

_REPORTING = (
    "User-Agent: foo\nAllow: /some/path\nUser-Agent bar # no\nabsolutely random line\n#so comment, much wow\n\n"
    "unicorns: /extinct\nnoarchive: /some\nDisallow: /\nError #and comment\nuseragent: baz\ndisallaw: /some\n"
    "site-map: https://e/s.xml #comment\nsitemap: https://e/t.xml\nNoarchive: /someCapital\n"
)
LINE_KINDS: list[tuple[str, str, dict[int, str | None]]] = [
    (
        "reporting_robots_test.cc LinesNumbersAreCountedCorrectly",
        _REPORTING,
        # kUnused ("noarchive") is a name the reporter knows but the parser hands on as unknown.
        {1: "user-agent", 2: "allow", 3: "user-agent", 4: None, 5: None, 6: None, 7: "unknown", 8: "unknown",
         9: "disallow", 10: None, 11: "user-agent", 12: "disallow", 13: "sitemap", 14: "sitemap", 15: "unknown",
         16: None},
    ),
]  # fmt: skip
"""Per line of a file, the kind of directive the reference reads there (None: not a directive)."""

TOKENS: list[tuple[str, str, bool]] = [
    ("ID_VerifyValidUserAgentsToObey", "Foobot", True),
    ("ID_VerifyValidUserAgentsToObey", "Foobot-Bar", True),
    ("ID_VerifyValidUserAgentsToObey", "Foo_Bar", True),
    ("ID_VerifyValidUserAgentsToObey", "", False),  # absl::string_view(): no text at all
    ("ID_VerifyValidUserAgentsToObey", "", False),
    ("ID_VerifyValidUserAgentsToObey", "ツ", False),
    ("ID_VerifyValidUserAgentsToObey", "Foobot*", False),
    ("ID_VerifyValidUserAgentsToObey", " Foobot ", False),
    ("ID_VerifyValidUserAgentsToObey", "Foobot/2.1", False),
    ("ID_VerifyValidUserAgentsToObey", "Foobot Bar", False),
    ("GoogleOnly_AcceptUserAgentUpToFirstSpace", "Foobot Bar", False),
]
"""``IsValidUserAgentToObey(value)``: the product tokens a crawler may obey rules under."""

PATHS: list[tuple[str, str]] = [
    ("", "/"),
    ("http://www.example.com", "/"),
    ("http://www.example.com/", "/"),
    ("http://www.example.com/a", "/a"),
    ("http://www.example.com/a/", "/a/"),
    ("http://www.example.com/a/b?c=http://d.e/", "/a/b?c=http://d.e/"),
    ("http://www.example.com/a/b?c=d&e=f#fragment", "/a/b?c=d&e=f"),
    ("example.com", "/"),
    ("example.com/", "/"),
    ("example.com/a", "/a"),
    ("example.com/a/", "/a/"),
    ("example.com/a/b?c=d&e=f#fragment", "/a/b?c=d&e=f"),
    ("a", "/"),
    ("a/", "/"),
    ("/a", "/a"),
    ("a/b", "/b"),
    ("example.com?a", "/?a"),
    ("example.com/a;b#c", "/a;b"),
    ("//a/b/c", "/b/c"),
]
"""TestGetPathParamsQuery: a URL and the part of it rules match against."""

ESCAPES: list[tuple[str, str]] = [
    ("http://www.example.com", "http://www.example.com"),
    ("/a/b/c", "/a/b/c"),
    ("á", "%C3%A1"),
    ("%aa", "%AA"),
]
"""TestMaybeEscapePattern: a pattern and its escaped form."""
