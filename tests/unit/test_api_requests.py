"""The job API's request checks as plain functions: cross-site refusals and YAML bodies (no sockets).

The limits of JSON and YAML documents are in test_documents.py."""

from __future__ import annotations

import pytest

from api.server import cross_site_refusal
from vcrawl.documents import parse_yaml
from vcrawl.errors import InvalidTask
from vcrawl.jobs import JobSpec

HOST = "127.0.0.1:8080"


@pytest.mark.parametrize(
    ("method", "headers", "loopback_only", "refused"),
    [
        ("POST", {"host": HOST}, False, None),  # curl: no Origin, no Sec-Fetch-Site
        ("POST", {"host": HOST, "origin": "http://127.0.0.1:8080", "sec-fetch-site": "same-origin"}, False, None),
        ("PATCH", {"host": "crawl.example.org", "origin": "https://crawl.example.org"}, False, None),  # default port
        ("POST", {"host": HOST, "sec-fetch-site": "none"}, True, None),  # typed by the user
        ("POST", {"host": HOST, "origin": "http://127.0.0.1:9000"}, False, "Origin"),  # another port
        ("POST", {"host": HOST, "origin": "https://127.0.0.1:8080"}, False, None),  # TLS at a proxy: Host has no scheme
        ("POST", {"host": HOST, "origin": "null"}, False, "Origin"),
        ("POST", {"host": HOST, "origin": "http://127.0.0.1:99999"}, False, "Origin"),  # not a port
        ("DELETE", {"host": HOST, "sec-fetch-site": "same-site"}, False, "same-site"),
        ("POST", {"host": HOST, "sec-fetch-site": "cross-site", "origin": "http://127.0.0.1"}, False, "cross-site"),
        ("GET", {"host": HOST, "origin": "http://evil.test", "sec-fetch-site": "cross-site"}, False, None),
        ("GET", {"host": "rebound.evil.test:8080"}, True, "loopback"),  # DNS rebinding, no token
        ("GET", {"host": "rebound.evil.test:8080"}, False, None),  # with a token: the token decides
        ("GET", {"host": "localhost:8080"}, True, None),
        ("GET", {"host": "[::1]:8080"}, True, None),
        ("GET", {"host": "127.0.0.2"}, True, None),
    ],
)
def test_cross_site_refusal(method: str, headers: dict[str, str], loopback_only: bool, refused: str | None) -> None:
    reason = cross_site_refusal(method, headers, loopback_only=loopback_only)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


def test_a_yaml_job_reads_like_a_job_file() -> None:
    text = "seeds: [https://example.org/]\nrules:\n  - pattern: '/a/'\n    analyzer: article\n"
    spec = JobSpec.from_dict(parse_yaml(text, "yaml"))
    assert spec.seeds == ("https://example.org/",) and spec.rules[0].analyzer == "article"


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("seeds: [a]\nseeds: [b]\n", "seeds", "given twice (lines 1 and 2)"),
        ("politeness:\n  jitter: 0\n  jitter: 1\n", "politeness.jitter", "given twice (lines 2 and 3)"),
        ("rules:\n  - pattern: a\n  - pattern: b\n    pattern: c\n", "rules[1].pattern", "given twice"),
        ("seeds: [\n", "yaml", "not valid YAML"),
        ("a: 1\n---\nb: 2\n", "yaml", "more than one YAML document"),
    ],
)
def test_a_yaml_job_names_its_problem(text: str, field: str, problem: str) -> None:
    with pytest.raises(InvalidTask) as caught:
        parse_yaml(text, "yaml")
    assert caught.value.field == field and problem in caught.value.problem
