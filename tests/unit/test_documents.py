"""Job documents (JSON and YAML) are read within fixed bounds; every refusal names its limit (no sockets)."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vcrawl.documents import MAX_DEPTH, MAX_DOCUMENT_BYTES, MAX_INT_DIGITS, MAX_VALUES, parse_json, parse_yaml
from vcrawl.errors import InvalidTask
from vcrawl.jobs import JobSpec, load_job_file

JOB_YAML = """\
id: shop
seeds: [https://shop.example/]
max_pages: 500
politeness: {min_interval_s: 0.5, jitter: 0.2, obey_robots: true}
rules:
  - pattern: '/product/'
    analyzer: fields
    fields: {name: h1, price: "xpath://span[@class='price']/text()"}
user_agents: ["vcrawl (+https://shop.example/bot)"]
"""


def test_a_job_reads_the_same_from_yaml_and_json() -> None:
    from_yaml = parse_yaml(JOB_YAML, "yaml")
    assert parse_json(json.dumps(from_yaml).encode(), "body") == from_yaml
    assert JobSpec.from_dict(from_yaml).rules[0].fields is not None


NESTED = json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("", None),
        ("# only a comment\n", None),
        ("a: 2026-01-01\n", {"a": "2026-01-01"}),  # dates stay strings, as in JSON
        ("a: 0x1f\nb: 1.5\nc: yes\nd: ~\ne: !!str 12\n", {"a": 31, "b": 1.5, "c": True, "d": None, "e": "12"}),
        ("a: '<<'\nb: <<\n", {"a": "<<", "b": "<<"}),  # quoted, or as a value: a string, not a merge
        (f"n: {'9' * MAX_INT_DIGITS}\n", {"n": int("9" * MAX_INT_DIGITS)}),
        ("a:" + " [" * (MAX_DEPTH - 1) + " ]" * (MAX_DEPTH - 1) + "\n", {"a": NESTED}),  # the mapping is one more
    ],
)
def test_plain_yaml_is_read(text: str, value: object) -> None:
    assert parse_yaml(text, "yaml") == value


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("seeds: &s [http://x/, *s]\n", "anchors are not accepted"),  # 45 bytes that once took 16 GB
        ("a: &a x\nb: *a\n", "anchors are not accepted"),
        ("b: *a\n", "aliases are not accepted"),  # an alias to nothing
        ("max_pages: 5\n<<: {max_pages: 7}\n", "merge key"),
        ("a: !!binary aGk=\n", "tag:yaml.org,2002:binary"),
        ("a: !!python/object/apply:os.system [ls]\n", "only plain lists and mappings"),
        ("a: !!set {x}\n", "only plain lists and mappings"),
        ("? [a]\n: b\n", "keys are plain strings"),
        ("a: .inf\n", "not a finite number"),
        (f"n: {'9' * (MAX_INT_DIGITS + 1)}\n", f"more than {MAX_INT_DIGITS} digits"),
        ("n: " + "9" * 5000 + "\n", "integer of 5000 characters"),
        ("a:" + " [" * MAX_DEPTH + " ]" * MAX_DEPTH + "\n", f"nested deeper than {MAX_DEPTH}"),
        ("seeds: " + "[" * 3000 + "]" * 3000 + "\n", "YAML"),  # refused by the parser itself or by depth
        ("a: [" + "0, " * MAX_VALUES + "0]\n", f"more than {MAX_VALUES} values"),
        ("a: 1\n---\nb: 2\n", "more than one YAML document"),
        ("a: " + "x" * MAX_DOCUMENT_BYTES + "\n", f"at most {MAX_DOCUMENT_BYTES}"),
    ],
    ids=lambda value: value[:30] if isinstance(value, str) else value,
)
def test_yaml_beyond_a_limit_is_refused(text: str, problem: str) -> None:
    with pytest.raises(InvalidTask) as caught:
        parse_yaml(text, "yaml")
    assert caught.value.field == "yaml" and problem in caught.value.problem


def test_a_yaml_bomb_is_refused_before_anything_expands() -> None:
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + n)}: &{chr(98 + n)} [{', '.join(['*' + chr(97 + n)] * 10)}]\n" for n in range(8)
    )  # 10**9 values once expanded, 90 nodes as written
    with pytest.raises(InvalidTask, match="line 1: sets the anchor &a"):
        parse_yaml(laughs, "yaml")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"[" * 500_000 + b"]" * 500_000, f"nested deeper than {MAX_DEPTH}"),  # past the C parser's recursion
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH}"),
        (b'{"max_pages": ' + b"9" * 5000 + b"}", "integer of 5000 digits"),
        (b'{"max_pages": -' + b"9" * (MAX_INT_DIGITS + 1) + b"}", f"integer of {MAX_INT_DIGITS + 1} digits"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": 1e999}', "out of range"),
        (b"[" + b"0," * MAX_VALUES + b"0]", f"more than {MAX_VALUES} values"),
        (b'{"a": "' + b"x" * MAX_DOCUMENT_BYTES + b'"}', f"at most {MAX_DOCUMENT_BYTES}"),
        (b"{", "not valid JSON"),
        (b"\xff", "not valid JSON"),
    ],
    ids=lambda value: value[:30].decode("latin-1") if isinstance(value, bytes) else value,
)
def test_json_beyond_a_limit_is_refused(data: bytes, problem: str) -> None:
    with pytest.raises(InvalidTask) as caught:
        parse_json(data, "body")
    assert caught.value.field == "body" and problem in caught.value.problem


def test_json_at_the_limits_is_read() -> None:
    deep = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert parse_json(deep, "body") is not None
    assert parse_json(b'{"n": -' + b"9" * MAX_INT_DIGITS + b"}", "body") == {"n": -int("9" * MAX_INT_DIGITS)}


def test_a_job_file_is_read_within_the_same_limits(tmp_path) -> None:
    good = tmp_path / "job.yaml"
    good.write_text(JOB_YAML)
    assert load_job_file(good).id == "shop"
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("seeds: &s [http://x/, *s]\n")
    with pytest.raises(InvalidTask, match="anchors are not accepted"):
        load_job_file(bomb)
    nested = tmp_path / "nested.json"
    nested.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(InvalidTask, match="nested deeper"):
        load_job_file(nested)
    large = tmp_path / "large.yaml"
    large.write_bytes(b"# " + b"x" * MAX_DOCUMENT_BYTES)
    with pytest.raises(InvalidTask, match=f"over {MAX_DOCUMENT_BYTES} bytes"):
        load_job_file(large)


# --- never anything but InvalidTask: the API answers 422 for it, and a 500 for anything else ---------

_PROPERTIES = settings(deadline=None, database=None, derandomize=True, max_examples=400,
                       suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
_YAML_TOKENS = st.sampled_from(
    ["a", "seeds", "max_depth", "max_pages", "warc", ":", ": ", "- ", "\n", "  ", "[", "]", "{", "}", ",", "'", '"',
     "!!int ", "!!float ", "!!bool ", "!!str ", "!!null ", "!!binary ", "!", "&x ", "*x", "<<", "0x", "0o", "0b",
     "1_0", "12:30", "9" * 25, "-", ".inf", ".nan", "~", "yes", "maybe", "\\ud800", "\\x00", "#", "---", "? "]
)  # fmt: skip


def _refused_or_read(read: Any, document: Any) -> None:
    try:
        value = read(document)
    except InvalidTask:
        return
    json.dumps(value)  # what is read is JSON data, whatever came in
    try:
        JobSpec.from_dict(value)
    except InvalidTask:
        pass


@_PROPERTIES
@given(st.lists(_YAML_TOKENS, max_size=30).map("".join))
def test_yaml_of_any_shape_is_read_or_refused_with_invalid_task(text: str) -> None:
    _refused_or_read(lambda document: parse_yaml(document, "yaml"), text)


@_PROPERTIES
@given(st.text(max_size=200))
def test_any_text_is_read_or_refused_with_invalid_task(text: str) -> None:
    _refused_or_read(lambda document: parse_yaml(document, "yaml"), text)
    _refused_or_read(lambda document: parse_json(document.encode("utf-8", "surrogatepass"), "body"), text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("max_depth: !!float abc\n", "line 1: is not a valid float"),  # the value is not repeated
        ("warc: !!bool maybe\n", "is not a valid bool"),
        ("max_depth: !!int ''\n", "is not a valid int"),
        ("max_depth: 0x" + "f" * 5000 + "\n", "integer of 5002 characters"),
        ("max_depth: 0x" + "f" * 30 + "\n", f"more than {MAX_INT_DIGITS} digits"),
        ('seeds: ["http://a.test/\\ud800"]\n', "not valid YAML"),
    ],
)
def test_yaml_scalars_that_cannot_be_read_are_refused(text: str, problem: str) -> None:
    with pytest.raises(InvalidTask) as caught:
        parse_yaml(text, "yaml")
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b'{"seeds": ["http://a.test/\\ud800"]}', "lone surrogate (U+D800)"),
        (b'{"\\udc00": 1}', "lone surrogate (U+DC00)"),
        (b'{"max_pages": 1, "max_pages": 999999}', "'max_pages' is given twice"),
    ],
)
def test_json_strings_and_keys_are_checked(data: bytes, problem: str) -> None:
    with pytest.raises(InvalidTask) as caught:
        parse_json(data, "body")
    assert problem in caught.value.problem


def test_json_values_are_counted_as_they_are_made() -> None:
    # 1 MiB of empty objects: refused at the 100,001st value, not after 350,000 objects were built.
    data = b"[" + b"{}," * 349_000 + b"{}]"
    tracemalloc.start()
    try:
        with pytest.raises(InvalidTask, match=f"more than {MAX_VALUES} values"):
            parse_json(data, "body")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 30 * 1024 * 1024, peak  # 350,000 dicts: ~50 MB; 100,000: ~16 MB
