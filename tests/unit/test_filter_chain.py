"""A job's filter_chain: the whole admission chain after scope, checked at submit with the path of a bad key."""

from __future__ import annotations

import json
import re
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from frontier.filter_registry import BUILTIN_FILTERS, ENTRY_POINT_GROUP, FilterChain, FilterRegistry
from frontier.filters import DEFAULT_SKIP_SUFFIXES, AdmissionContext, Scope, reject_reason
from vcrawl.errors import InvalidTask
from vcrawl.job_filters import BUILTIN_FILTER_NAMES, MAX_JOB_FILTERS, FilterSpec, effective_filters
from vcrawl.jobs import JobSpec
from views.status import JobStatus

SEEDS = {"seeds": ["http://a.test/"]}
REGISTRY = FilterRegistry(
    [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in BUILTIN_FILTERS.items()]
    + [EntryPoint("max-query-params", "vcrawl_test_plugin:max_query_params", ENTRY_POINT_GROUP)]
)
SCOPE = Scope(frozenset({"a.test"}), (), (), (re.compile("/private/"),), max_depth=3)


def _chain(*listed: dict[str, Any], **job: Any) -> FilterChain:
    spec = JobSpec.from_dict({**SEEDS, **job, "filter_chain": list(listed)})
    return REGISTRY.chain(spec.filters, spec.filter_chain)


def _context(depth: int = 1, scope: Scope = SCOPE, **flags: bool) -> AdmissionContext:
    return AdmissionContext("job-1", depth, scope, "http://a.test/", **flags)


# The job's JSON, the field named, words of the problem: refused by JobSpec.from_dict (shape).
SHAPE_REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("not a list", {"filter_chain": "trap"}, "filter_chain", "must be a list"),
    ("too many", {"filter_chain": [{"name": f"f{i}"} for i in range(MAX_JOB_FILTERS + 1)]}, "filter_chain",
     "at most 32"),
    ("an entry not a mapping", {"filter_chain": ["trap"]}, "filter_chain[0]", "mapping"),
    ("an unknown key", {"filter_chain": [{"name": "trap", "args": {}}]}, "filter_chain[0].args", "unknown key"),
    ("no name", {"filter_chain": [{"params": {}}]}, "filter_chain[0].name", "filter name"),
    ("an import path", {"filter_chain": [{"name": "os:system"}]}, "filter_chain[0].name", "filter name"),
    ("params not a mapping", {"filter_chain": [{"name": "trap", "params": [3]}]}, "filter_chain[0].params", "mapping"),
    ("scope listed", {"filter_chain": [{"name": "trap"}, {"name": "scope"}]}, "filter_chain[1].name", "always runs"),
    ("a duplicate", {"filter_chain": [{"name": "trap"}, {"name": "deny"}, {"name": "trap"}]}, "filter_chain[2].name",
     "listed twice (first as filter_chain[0])"),
    ("a duplicate plug-in", {"filter_chain": [{"name": "max-query-params", "params": {"max": 1}},
                                              {"name": "max-query-params", "params": {"max": 2}}]},
     "filter_chain[1].name", "listed twice"),
    ("both keys", {"filter_chain": [], "filters": [{"name": "max-query-params"}]}, "filters", "not both"),
    ("deny left out", {"filter_chain": [{"name": "trap"}], "scope": {"deny": ["/x"]}}, "filter_chain", "'deny'"),
    ("allow left out", {"filter_chain": [{"name": "deny"}], "scope": {"allow": ["/x"]}}, "filter_chain", "'allow'"),
    ("filters too many", {"filters": [{"name": "max-query-params"}] * 33}, "filters", "at most 32"),
]  # fmt: skip


@pytest.mark.parametrize(("job", "field", "words"), [c[1:] for c in SHAPE_REFUSED], ids=[c[0] for c in SHAPE_REFUSED])
def test_a_bad_chain_shape_is_refused_naming_the_field(job: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidTask) as refused:
        JobSpec.from_dict({**SEEDS, **job})
    assert refused.value.field == field
    assert words in refused.value.problem


# Entries of filter_chain, the field named, words: refused by the registry (names and params), as at submit.
REGISTRY_REFUSED: list[tuple[str, list[dict[str, Any]], str, str]] = [
    ("unknown name", [{"name": "deny"}, {"name": "allow"}, {"name": "no-such"}], "filter_chain[2].name",
     "no filter 'no-such'; filters: allow, deny, max-query-params, suffix, trap"),
    ("suffixes a string", [{"name": "suffix", "params": {"suffixes": ".pdf"}}], "filter_chain[0].params.suffixes",
     "must be a list"),
    ("a suffix not a string", [{"name": "suffix", "params": {"suffixes": [".pdf", 7]}}],
     "filter_chain[0].params.suffixes[1]", "got 7"),
    ("a suffix without its dot", [{"name": "suffix", "params": {"add": ["pdf"]}}], "filter_chain[0].params.add[0]",
     "with its dot"),
    ("a suffix with a slash", [{"name": "suffix", "params": {"keep": ["./x"]}}], "filter_chain[0].params.keep[0]",
     "no '/'"),
    ("a non-ASCII suffix", [{"name": "suffix", "params": {"add": [".pdé"]}}], "filter_chain[0].params.add[0]",
     "ASCII"),
    ("a suffix too long", [{"name": "suffix", "params": {"add": ["." + "x" * 32]}}], "filter_chain[0].params.add[0]",
     "2-32 characters"),
    ("too many suffixes", [{"name": "suffix", "params": {"add": [f".x{i}" for i in range(1001)]}}],
     "filter_chain[0].params.add", "at most 1000"),
    ("no suffix at all", [{"name": "suffix", "params": {"suffixes": []}}], "filter_chain[0].params.suffixes",
     "at least one"),
    ("an unknown suffix param", [{"name": "suffix", "params": {"suffix": [".pdf"]}}],
     "filter_chain[0].params.suffix", "known: suffixes, add, keep"),
    ("repeats a string", [{"name": "trap", "params": {"max_segment_repeats": "5"}}],
     "filter_chain[0].params.max_segment_repeats", "integer from 1 to 100"),
    ("repeats a bool", [{"name": "trap", "params": {"max_segment_repeats": True}}],
     "filter_chain[0].params.max_segment_repeats", "integer"),
    ("repeats 0", [{"name": "trap", "params": {"max_segment_repeats": 0}}],
     "filter_chain[0].params.max_segment_repeats", "got 0"),
    ("repeats 101", [{"name": "trap", "params": {"max_segment_repeats": 101}}],
     "filter_chain[0].params.max_segment_repeats", "got 101"),
    ("deny with params", [{"name": "deny", "params": {"patterns": ["/x"]}}], "filter_chain[0].params.patterns",
     "takes no params"),
    ("a plug-in's bad param", [{"name": "trap"}, {"name": "max-query-params", "params": {"max": -1}}],
     "filter_chain[1].params.max", ">= 0"),
]  # fmt: skip


@pytest.mark.parametrize(("listed", "field", "words"), [c[1:] for c in REGISTRY_REFUSED],
                         ids=[c[0] for c in REGISTRY_REFUSED])  # fmt: skip
def test_a_bad_name_or_param_in_the_chain_is_refused_naming_the_field(
    listed: list[dict[str, Any]], field: str, words: str
) -> None:
    with pytest.raises(InvalidTask) as refused:
        _chain(*listed)
    assert refused.value.field == field
    assert words in refused.value.problem


def test_a_builtin_under_filters_points_to_filter_chain() -> None:
    spec = JobSpec.from_dict({**SEEDS, "filters": [{"name": "trap"}]})
    with pytest.raises(InvalidTask) as refused:
        REGISTRY.chain(spec.filters, spec.filter_chain)
    assert refused.value.field == "filters[0].name" and "filter_chain" in refused.value.problem


def test_a_spec_built_in_python_with_scope_in_its_chain_is_refused_by_the_registry() -> None:
    with pytest.raises(InvalidTask) as refused:
        REGISTRY.chain((), (FilterSpec("trap"), FilterSpec("scope")))
    assert refused.value.field == "filter_chain[1].name"


def test_the_chain_runs_scope_first_then_the_listed_filters_in_order() -> None:
    chain = _chain({"name": "suffix"}, {"name": "max-query-params", "params": {"max": 0}}, {"name": "deny"})
    assert chain.names == ["scope", "suffix", "max-query-params", "deny"]
    assert chain.reject_reason("http://b.test/x.png?q=1", _context()) == "host"  # scope before everything
    assert chain.reject_reason("http://a.test/private/x.png?q=1", _context()) == "suffix"
    assert chain.reject_reason("http://a.test/private/x?q=1", _context()) == "too_many_params"
    assert chain.reject_reason("http://a.test/private/x", _context()) == "deny"
    assert chain.reject_reason("http://a.test/a/a/", _context()) is None  # no trap in this chain


def test_an_empty_chain_is_scope_alone() -> None:
    chain = _chain()
    assert chain.names == ["scope"]
    assert chain.reject_reason("http://a.test/a/a/x.png", _context()) is None
    assert chain.reject_reason("http://a.test/", _context(depth=4)) == "depth"


def test_without_the_key_the_chain_is_the_builtins_then_the_jobs_filters() -> None:
    spec = JobSpec.from_dict({**SEEDS, "filters": [{"name": "max-query-params", "params": {"max": 0}}]})
    assert spec.filter_chain is None
    assert REGISTRY.chain(spec.filters, spec.filter_chain).names == [*BUILTIN_FILTER_NAMES, "max-query-params"]
    assert list(BUILTIN_FILTERS) == list(BUILTIN_FILTER_NAMES)
    listed = _chain(*({"name": name} for name in BUILTIN_FILTER_NAMES[1:]))
    for url in ("http://a.test/private/x", "http://a.test/a/a/", "http://a.test/x.PNG", "ftp://a.test/", "http://a.t/"):
        assert listed.reject_reason(url, _context()) == reject_reason(url, 1, SCOPE)


@pytest.mark.parametrize(
    ("params", "dropped", "kept"),
    [
        ({"suffixes": [".HTML", ".php"]}, ["/x.html", "/x.PHP"], ["/x.pdf", "/x.png", "/x"]),
        ({"add": [".json"]}, ["/x.json", "/x.pdf"], ["/x.html"]),
        ({"keep": [".pdf"]}, ["/x.png", "/x.zip"], ["/x.pdf", "/x.PDF?a=.png"]),
        ({"suffixes": [".a", ".b"], "add": [".c"], "keep": [".b"]}, ["/x.a", "/x.c"], ["/x.b", "/x.png"]),
        ({}, [f"/x{suffix}" for suffix in sorted(DEFAULT_SKIP_SUFFIXES)], ["/x.html", "/x.json"]),
    ],
)
def test_suffix_params_replace_add_to_or_take_from_the_default_list(
    params: dict[str, Any], dropped: list[str], kept: list[str]
) -> None:
    chain = _chain({"name": "suffix", "params": params})
    for path in dropped:
        assert chain.reject_reason("http://a.test" + path, _context()) == "suffix", path
    for path in kept:
        assert chain.reject_reason("http://a.test" + path, _context()) is None, path


def test_a_sitemap_is_never_dropped_for_its_suffix() -> None:
    chain = _chain({"name": "suffix", "params": {"suffixes": [".gz", ".xml"]}})
    assert chain.reject_reason("http://a.test/sitemap.xml.gz", _context(depth=0, sitemap=True)) is None
    assert chain.reject_reason("http://a.test/sitemap.xml.gz", _context(depth=0)) == "suffix"


def test_trap_takes_its_own_repeat_count() -> None:
    lenient = _chain({"name": "trap", "params": {"max_segment_repeats": 5}})
    assert lenient.reject_reason("http://a.test/a/b/a/b/a/b/a/b/", _context()) is None  # 4 > 3, the default
    assert lenient.reject_reason("http://a.test/a/b/a/b/a/b/a/b/a/b/a/b/", _context()) == "trap"
    assert lenient.reject_reason("http://a.test/a/a/", _context()) == "trap"  # a direct repeat still is one


def test_seeds_are_still_not_held_to_allow_in_a_listed_chain() -> None:
    scope = Scope(frozenset({"a.test"}), (), (re.compile("/shop/"),), (), max_depth=3)
    chain = _chain({"name": "allow"}, scope={"allow": ["/shop/"]})
    assert chain.reject_reason("http://a.test/", _context(scope=scope)) == "allow"
    seed_scope = Scope(frozenset({"a.test"}), (), (), (), max_depth=3)  # admit_links drops allow for seeds
    assert chain.reject_reason("http://a.test/", _context(depth=0, scope=seed_scope, seed=True)) is None


@pytest.mark.parametrize(
    "listed",
    [
        [],
        [{"name": "trap", "params": {"max_segment_repeats": 7}}, {"name": "deny"}],
        [{"name": "suffix", "params": {"suffixes": [".pdf"], "keep": [".pdf"]}}, {"name": "max-query-params",
                                                                                 "params": {"max": 2}}],
    ],
)  # fmt: skip
def test_the_chain_survives_the_jobs_json_round_trip(listed: list[dict[str, Any]]) -> None:
    denies = any(f["name"] == "deny" for f in listed)
    spec = JobSpec.from_dict({**SEEDS, "filter_chain": listed, "scope": {"deny": ["/x"]} if denies else {}})
    stored = spec.to_json()
    again = JobSpec.from_dict(json.loads(stored))
    assert again == spec and again.to_json() == stored
    assert json.loads(stored)["filter_chain"] == [{"name": f["name"], "params": f.get("params", {})} for f in listed]
    assert again.filter_chain == tuple(FilterSpec(f["name"], f.get("params", {})) for f in listed)


def test_a_spec_without_the_key_keeps_its_shape() -> None:
    data = JobSpec.from_dict(SEEDS).to_dict()
    assert "filter_chain" not in data and "filters" not in data  # older workers refuse keys they do not know
    assert JobSpec.from_dict({**SEEDS, "filter_chain": None}).filter_chain is None


def test_the_status_shows_the_chain_the_job_runs() -> None:
    assert [f.name for f in effective_filters((FilterSpec("max-query-params"),), None)] == [
        *BUILTIN_FILTER_NAMES,
        "max-query-params",
    ]
    listed = (FilterSpec("suffix", {"add": [".json"]}), FilterSpec("deny"))
    chain = effective_filters((), listed)
    assert chain == (FilterSpec("scope"), *listed)
    status = JobStatus("j", "running", (), 0.0, None, 0.0, filter_chain=({"name": "scope", "params": {}},))
    assert JobStatus.from_dict(status.to_dict()).to_dict() == status.to_dict()
    assert status.to_dict()["filter_chain"] == [{"name": "scope", "params": {}}]
