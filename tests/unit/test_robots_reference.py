"""google/robotstxt's published test cases (``robots_reference_cases.py``) against vcrawl's robots.txt reading."""

from __future__ import annotations

from collections import Counter

import pytest

from frontier.robots import RobotsRules
from frontier.robots_groups import directives, escape_pattern, path_params_query
from tests.unit.robots_reference_cases import (
    CHECKS,
    ESCAPES,
    LINE_KINDS,
    PATHS,
    REFUSED,
    REPORTS,
    TOKENS,
    Check,
    Report,
)
from vcrawl.errors import InvalidTask
from vcrawl.jobs import JobSpec

# The kinds the reference's parse handler counts as valid; anything else is an "unknown action".
_VALID_KINDS = frozenset({"user-agent", "allow", "disallow", "sitemap"})


def _ids(rows: list[Check] | list[Report]) -> list[str]:
    seen: Counter[str] = Counter()
    ids = []
    for row in rows:
        seen[row.source] += 1
        ids.append(f"{row.source}-{seen[row.source]}")
    return ids


@pytest.mark.parametrize("check", CHECKS, ids=_ids(CHECKS))
def test_reference_is_user_agent_allowed(check: Check) -> None:
    rules = RobotsRules.from_response(200, check.robots.encode())
    for reading in (rules, RobotsRules.from_cache(rules.to_cache())):
        if check.expected == REFUSED:
            with pytest.raises(ValueError):
                reading.can_fetch(check.url, check.agent)
        else:
            assert reading.can_fetch(check.url, check.agent) is check.expected


def test_every_difference_from_the_reference_gives_vcrawls_answer_and_why() -> None:
    differing = [check for check in CHECKS if check.differs]
    assert all(check.vcrawl is not None and check.vcrawl != check.allowed for check in differing)
    assert all(check.vcrawl is None for check in CHECKS if not check.differs)
    assert len(differing) == 4  # docs/jobs.md lists them: an empty token (2), an unencoded URL (2)


def test_the_table_has_every_reference_test() -> None:
    sources = {row.source for row in CHECKS} | {row.source for row in REPORTS} | {source for source, _, _ in TOKENS}
    assert sources == {
        "GoogleOnly_SystemTest",
        "ID_LineSyntax_Line",
        "ID_LineSyntax_Groups",
        "ID_LineSyntax_Groups_OtherRules",
        "ID_REPLineNamesCaseInsensitive",
        "ID_VerifyValidUserAgentsToObey",
        "ID_UserAgentValueCaseInsensitive",
        "GoogleOnly_AcceptUserAgentUpToFirstSpace",
        "ID_GlobalGroups_Secondary",
        "ID_AllowDisallow_Value_CaseSensitive",
        "ID_LongestMatch",
        "ID_Encoding",
        "ID_SpecialCharacters",
        "GoogleOnly_IndexHTMLisDirectory",
        "GoogleOnly_LineTooLong",
        "GoogleOnly_DocumentationChecks",
        "ID_LinesNumbersAreCountedCorrectly",
        "ID_UTF8ByteOrderMarkIsSkipped",
        "ID_NonStandardLineExample_Sitemap",
    }


@pytest.mark.parametrize("report", REPORTS, ids=_ids(REPORTS))
def test_reference_parse_report(report: Report) -> None:
    # The reference parses bytes; vcrawl reads them as RobotsRules does (500 KiB, BOM, UTF-8).
    found = directives(RobotsRules.from_response(200, report.body).text)
    valid = [directive for directive in found if directive.kind in _VALID_KINDS]
    if report.valid_directives is not None:
        assert len(valid) == report.valid_directives
    if report.unknown_directives is not None:
        assert len(found) - len(valid) == report.unknown_directives
    if report.last_line_seen is not None:
        assert max(directive.line for directive in found) == report.last_line_seen
    if report.sitemap is not None:
        assert "".join(d.value for d in found if d.kind == "sitemap") == report.sitemap


@pytest.mark.parametrize(("source", "text", "kinds"), LINE_KINDS)
def test_reference_line_kinds_with_typos(source: str, text: str, kinds: dict[int, str | None]) -> None:
    read = {directive.line: directive.kind for directive in directives(text)}
    assert {line: read.get(line) for line in kinds} == kinds


@pytest.mark.parametrize(("source", "token", "valid"), TOKENS)
def test_reference_valid_user_agents_to_obey_are_the_tokens_a_job_takes(source: str, token: str, valid: bool) -> None:
    job = {"seeds": ["http://example.com/"], "politeness": {"robots_token": token}}
    if valid:
        assert JobSpec.from_dict(job).politeness.robots_token == token
    else:
        with pytest.raises(InvalidTask):
            JobSpec.from_dict(job)


@pytest.mark.parametrize(("url", "path"), PATHS)
def test_reference_get_path_params_query(url: str, path: str) -> None:
    assert path_params_query(url) == path


@pytest.mark.parametrize(("pattern", "escaped"), ESCAPES)
def test_reference_maybe_escape_pattern(pattern: str, escaped: str) -> None:
    assert escape_pattern(pattern) == escaped
