"""Proxy harvesting without sockets: the three source formats, the settings, what a check decides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celeryconfig import PROXY_HARVEST_TASK, celery_settings
from fetchers.base import FetchRequest, FetchResult
from fetchers.proxy_check import CheckUnusable, ProxyCheck, check_proxy, own_addresses
from fetchers.proxy_harvest import harvest_with_settings
from fetchers.proxy_lists import read_source
from vcrawl.errors import ConfigError, FetchFailed, InvalidTask
from vcrawl.proxy_sources import ProxySource, load_proxy_sources
from vcrawl.settings import Settings

LINES = b"""# free proxies, updated hourly
203.0.113.7:8080
  198.51.100.4:3128   HTTP  anonymous
not a proxy
203.0.113.7:8080
[2001:db8::5]:8000
203.0.113.9:99999
proxy.example.net:80
"""

TABLE = b"""<html><body>
<table><tr><td>menu</td></tr></table>
<table>
  <tr><th>IP Address</th><th>Port</th><th>Country</th></tr>
  <tr><td>203.0.113.7</td><td>8080</td><td>NL</td></tr>
  <tr><td><b>198.51.100.4</b></td><td> 3128 </td><td>DE</td></tr>
  <tr><td>n/a</td><td>80</td><td>??</td></tr>
  <tr><td>192.0.2.1</td></tr>
</table></body></html>"""

REGEX = b"""<script>var list = [{"ip":"203.0.113.7","port":8080},{"ip":"198.51.100.4","port":3128},
{"ip":"bad host!","port":1}];</script>"""


def source(**fields: object) -> ProxySource:
    return ProxySource(url="https://lists.example/proxies", **fields)  # type: ignore[arg-type]


# (what, the source, the page, the candidates read)
FORMATS = [
    ("lines", source(), LINES, ["http://203.0.113.7:8080", "http://198.51.100.4:3128", "http://[2001:db8::5]:8000",
                                "http://proxy.example.net:80"]),
    ("table by header", source(format="table", table=1, host_column="ip address", port_column="Port"), TABLE,
     ["http://203.0.113.7:8080", "http://198.51.100.4:3128"]),
    ("table by index", source(format="table", table=1, host_column=0, port_column=1, scheme="https"), TABLE,
     ["https://203.0.113.7:8080", "https://198.51.100.4:3128"]),
    ("table, host:port in one cell", source(format="table", host_column=0),
     b"<table><tr><td>203.0.113.7:8080</td></tr><tr><td>junk</td></tr></table>", ["http://203.0.113.7:8080"]),
    ("regex", source(format="regex", pattern=r'"ip":"(?P<host>[^"]+)","port":(?P<port>\d+)'), REGEX,
     ["http://203.0.113.7:8080", "http://198.51.100.4:3128"]),
    # str.isdigit() takes "\N{SUPERSCRIPT TWO}" (int() refuses it) and Arabic-Indic digits (int() reads 80):
    # neither is a port; the other rows are read all the same.
    ("a port not in ASCII digits", source(format="table", host_column=0, port_column=1),
     "<table><tr><td>203.0.113.8</td><td>80\N{SUPERSCRIPT TWO}</td></tr><tr><td>203.0.113.7</td><td>8080</td></tr>"
     "</table>".encode(), ["http://203.0.113.7:8080"]),
    ("regex, a port not in ASCII digits", source(format="regex", pattern=r"(?P<host>[\d.]+):(?P<port>\w+)"),
     "203.0.113.8:\u0668\u0660 203.0.113.7:8080 [2001:db8::5]:\u0668\u0660".encode(), ["http://203.0.113.7:8080"]),
    ("table missing", source(format="table", table=5, host_column=0), TABLE, []),
    ("not HTML at all", source(format="table", host_column=0), b"", []),
]  # fmt: skip


@pytest.mark.parametrize(("what", "listing", "page", "expected"), FORMATS, ids=[case[0] for case in FORMATS])
def test_each_source_format_reads_its_candidates(
    what: str, listing: ProxySource, page: bytes, expected: list[str]
) -> None:
    assert read_source(listing, page) == expected


BAD_SOURCES = [
    ({"url": "ftp://lists.example/p"}, "sources[0].url"),
    ({"url": "https://lists.example/p", "format": "csv"}, "sources[0].format"),
    ({"url": "https://lists.example/p", "format": "table"}, "sources[0].host_column"),
    ({"url": "https://lists.example/p", "format": "regex", "pattern": "(?P<host>.+)"}, "sources[0].pattern"),
    ({"url": "https://lists.example/p", "format": "regex", "pattern": "(?P<host>[)(?P<port>)"}, "sources[0].pattern"),
    ({"url": "https://lists.example/p", "module": "evil.plugin"}, "sources[0].source"),
]


@pytest.mark.parametrize(("item", "field"), BAD_SOURCES)
def test_a_bad_source_is_refused_naming_its_key(item: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidTask) as raised:
        load_proxy_sources(json.dumps([item]))
    assert raised.value.field == field


def test_sources_come_from_a_json_variable_or_a_yaml_file(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "sources.yaml"
    path.write_text("sources:\n  - url: https://lists.example/p\n    format: lines\n")
    env = {"VCRAWL_PROXY_SOURCES": str(path), "VCRAWL_PROXY_CHECK_URL": "https://check.example/get"}
    settings = Settings.from_env(env)
    assert settings.proxy_sources == (ProxySource("https://lists.example/p"),)
    assert Settings.from_env(settings.to_env()) == settings  # workers started by the CLI get the same


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"VCRAWL_PROXY_SOURCES": "[{"}, "VCRAWL_PROXY_SOURCES"),
        ({"VCRAWL_PROXY_SOURCES": "/nonexistent/sources.json"}, "VCRAWL_PROXY_SOURCES"),
        ({"VCRAWL_PROXY_SOURCES": '[{"url": "https://l.example/p"}]'}, "VCRAWL_PROXY_CHECK_URL"),
        ({"VCRAWL_PROXY_CHECK_URL": "file:///etc/passwd"}, "VCRAWL_PROXY_CHECK_URL"),
        ({"VCRAWL_PROXY_MAX_LATENCY_S": "0"}, "VCRAWL_PROXY_MAX_LATENCY_S"),
        ({"VCRAWL_PROXY_CHECK_CONCURRENCY": "0"}, "VCRAWL_PROXY_CHECK_CONCURRENCY"),
    ],
)
def test_bad_harvest_settings_fail_at_start_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("sources:\n  - url: https://lists.example/p\n    format: caf\u00e9\n".encode("latin-1"), "not UTF-8"),
        (b"- url: https://lists.example/p\n  format: lines\n  format: table\n", "[0].format: given twice"),
    ],
    ids=["not UTF-8", "a key twice"],
)
def test_a_sources_file_that_is_not_utf8_or_repeats_a_key_is_a_config_error(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "sources.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"VCRAWL_PROXY_SOURCES") as raised:
        Settings.from_env({"VCRAWL_PROXY_SOURCES": str(path), "VCRAWL_PROXY_CHECK_URL": "https://check.example/get"})
    assert problem in str(raised.value)


def test_beat_always_schedules_the_harvest_which_does_nothing_without_sources() -> None:
    # Sources may be set live (vcrawl config set VCRAWL_PROXY_SOURCES): the schedule must already be there.
    assert celery_settings(Settings())["beat_schedule"][PROXY_HARVEST_TASK]["schedule"] == 900.0
    assert harvest_with_settings(Settings(), None).to_dict()["status"] == "no_sources"
    settings = Settings(proxy_sources=(source(),), proxy_check_url="https://check.example/get",
                        proxy_harvest_every_s=600)  # fmt: skip
    conf = celery_settings(settings)
    assert conf["beat_schedule"][PROXY_HARVEST_TASK] == {"task": PROXY_HARVEST_TASK, "schedule": 600}
    assert conf["task_annotations"][PROXY_HARVEST_TASK]["time_limit"] > 600


class Answers:
    """A fetcher that answers the check URL with what a check server would see."""

    def __init__(self, answer: dict[str, object] | bytes, status: int = 200, elapsed_s: float = 0.1) -> None:
        self.body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.status, self.elapsed_s = status, elapsed_s

    def fetch(self, request: FetchRequest) -> FetchResult:
        if request.proxy == "http://192.0.2.9:1":
            raise FetchFailed(request.url, "proxy_error")
        return FetchResult(request.url, request.url, self.status, body=self.body, elapsed_s=self.elapsed_s)


CHECK = ProxyCheck("https://check.example/get", max_latency_s=1.0)
OWN = frozenset({"198.51.100.1"})

# (what the check saw through the proxy, the verdict's reason, its anonymity)
VERDICTS = [
    ("nothing of the client", Answers({"origin": "203.0.113.7", "headers": {"Host": "198.51.100.1"}}), None, "elite"),
    ("a Via header", Answers({"origin": "203.0.113.7", "headers": {"Via": "1.1 squid"}}), None, "anonymous"),
    ("the client in X-Forwarded-For",
     Answers({"origin": "203.0.113.7", "headers": {"X-Forwarded-For": "198.51.100.1"}}), "transparent", "transparent"),
    ("the client in origin", Answers({"origin": "198.51.100.1, 203.0.113.7"}), "transparent", "transparent"),
    ("the client as IPv4-mapped IPv6",
     Answers({"origin": "203.0.113.7", "headers": {"X-Real-IP": "::ffff:198.51.100.1"}}), "transparent", "transparent"),
    ("too slow", Answers({"origin": "203.0.113.7"}, elapsed_s=1.5), "too_slow", ""),
    ("not the check's JSON", Answers(b"<html>login</html>"), "bad_answer", ""),
    ("an error page", Answers({"origin": "x"}, status=403), "http_403", ""),
]  # fmt: skip


@pytest.mark.parametrize(("what", "fetcher", "reason", "anonymity"), VERDICTS, ids=[case[0] for case in VERDICTS])
def test_a_check_rejects_transparent_slow_and_wrong_answers(
    what: str, fetcher: Answers, reason: str | None, anonymity: str
) -> None:
    verdict = check_proxy(fetcher, CHECK, "http://203.0.113.7:8080", OWN)
    assert (verdict.reason, verdict.anonymity, verdict.passed) == (reason, anonymity, reason is None)


def test_a_dead_proxy_fails_its_check_with_the_fetchers_reason() -> None:
    assert check_proxy(Answers({"origin": "x"}), CHECK, "http://192.0.2.9:1", OWN).reason == "proxy_error"


def test_the_own_address_comes_from_a_direct_check() -> None:
    assert own_addresses(Answers({"origin": "198.51.100.1"}), CHECK) == OWN
    assert own_addresses(Answers({"origin": "::ffff:198.51.100.1"}), CHECK) == OWN  # a dual-stack check server
    with pytest.raises(CheckUnusable, match="bad_answer"):
        own_addresses(Answers(b"hello"), CHECK)
