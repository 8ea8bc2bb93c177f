"""The vcrawl.filters and vcrawl.fetchers registries: built-ins and plug-ins alike, names taken once."""

from __future__ import annotations

import re
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pytest

from fetchers.registry import BUILTIN_FETCHERS, FetcherContext, FetcherRegistry
from fetchers.registry import ENTRY_POINT_GROUP as FETCHERS_GROUP
from frontier.filter_registry import BUILTIN_FILTERS, FilterChain, FilterRegistry
from frontier.filter_registry import ENTRY_POINT_GROUP as FILTERS_GROUP
from frontier.filters import AdmissionContext, Scope, reject_reason
from vcrawl.errors import ConfigError, InvalidTask, UnknownComponent
from vcrawl.job_filters import FilterSpec
from vcrawl.jobs import JobSpec

PLUGIN_FILTER = EntryPoint("max-query-params", "vcrawl_test_plugin:max_query_params", FILTERS_GROUP)


def _builtin_filters() -> list[EntryPoint]:
    return [EntryPoint(name, value, FILTERS_GROUP) for name, value in BUILTIN_FILTERS.items()]


def _builtin_fetchers() -> list[EntryPoint]:
    return [EntryPoint(name, value, FETCHERS_GROUP) for name, value in BUILTIN_FETCHERS.items()]


def test_the_installed_groups_hold_the_builtins_and_the_test_plugins() -> None:
    filters = {e.name for e in entry_points(group=FILTERS_GROUP)}
    fetchers = {e.name for e in entry_points(group=FETCHERS_GROUP)}
    assert {*BUILTIN_FILTERS, "max-query-params"} <= filters
    assert {*BUILTIN_FETCHERS, "tagged"} <= fetchers


def test_builtin_filters_run_first_in_order_then_the_jobs_own() -> None:
    registry = FilterRegistry([PLUGIN_FILTER, *reversed(_builtin_filters())])
    chain = registry.chain((FilterSpec("max-query-params", {"max": 0}),))
    assert chain.names == ["scope", "deny", "allow", "suffix", "trap", "max-query-params"]
    scope = Scope(frozenset({"a.test"}), (), (), (re.compile("/private/"),), max_depth=2)
    context = AdmissionContext("job-1", 1, scope, source_url="http://a.test/")
    assert chain.reject_reason("http://b.test/?q=1", context) == "host"  # scope before the job's own
    assert chain.reject_reason("http://a.test/private/?q=1", context) == "deny"
    assert chain.reject_reason("http://a.test/x?q=1", context) == "too_many_params"
    assert chain.reject_reason("http://a.test/x", context) is None


@pytest.mark.parametrize(
    "url",
    ["ftp://a.test/", "http://a.test/" + "x" * 3000, "http://b.test/", "http://a.test/deny", "http://a.test/a.png",
     "http://a.test/a/a/", "http://a.test/other", "http://a.test/ok"],
)  # fmt: skip
def test_the_builtin_chain_agrees_with_reject_reason(url: str) -> None:
    scope = Scope(frozenset({"a.test"}), (), (re.compile("ok|deny|a/a|png|x"),), (re.compile("deny"),), max_depth=3)
    chain = FilterRegistry(_builtin_filters()).chain(())
    assert chain.reject_reason(url, AdmissionContext("j", 1, scope)) == reject_reason(url, 1, scope)


@pytest.mark.parametrize("name", sorted(BUILTIN_FILTERS))
def test_each_builtin_filter_factory_refuses_unknown_params_and_gives_its_own_reason(name: str) -> None:
    factory = EntryPoint(name, BUILTIN_FILTERS[name], FILTERS_GROUP).load()
    with pytest.raises(InvalidTask) as refused:
        factory({"any": 1})
    assert refused.value.field == "any"
    takes = {"suffix": "known: suffixes, add, keep", "trap": "known: max_segment_repeats"}
    assert takes.get(name, f"the '{name}' filter takes no params") in refused.value.problem
    dropped = {"scope": "ftp://a.test/", "deny": "http://a.test/deny", "allow": "http://a.test/other",
               "suffix": "http://a.test/a.png", "trap": "http://a.test/a/a/"}  # fmt: skip
    scope = Scope(frozenset({"a.test"}), (), (re.compile("deny|png|a/a"),), (re.compile("deny"),), max_depth=3)
    check = factory({})
    assert check(dropped[name], AdmissionContext("j", 1, scope)) == ("scheme" if name == "scope" else name)
    assert check("http://a.test/png/x.html", AdmissionContext("j", 1, scope)) is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (FilterSpec("no-such"), "filters[0].name"),
        (FilterSpec("trap"), "filters[0].name"),
        (FilterSpec("max-query-params", {"max": "2"}), "filters[0].params.max"),
        (FilterSpec("max-query-params", {"max": 1, "min": 0}), "filters[0].params.min"),
    ],
)
def test_a_jobs_filter_is_checked_against_the_registry(spec: FilterSpec, field: str) -> None:
    with pytest.raises(InvalidTask) as refused:
        FilterRegistry([*_builtin_filters(), PLUGIN_FILTER]).chain((spec,))
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("plugins", "words"),
    [
        ([EntryPoint("scope", "vcrawl_test_plugin:max_query_params", FILTERS_GROUP)], "built-in filter 'scope'"),
        ([PLUGIN_FILTER, EntryPoint("max-query-params", "other_plugin:f", FILTERS_GROUP)], "both use the name"),
    ],
)
def test_a_name_taken_twice_is_a_configuration_error(plugins: list[EntryPoint], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        FilterRegistry([*_builtin_filters(), *plugins]).load()


def test_a_missing_builtin_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"\['scope'\] are not registered"):
        FilterRegistry(_builtin_filters()[1:]).load()


def test_one_distribution_seen_twice_is_not_a_clash() -> None:
    assert "max-query-params" in FilterRegistry([*_builtin_filters(), PLUGIN_FILTER, PLUGIN_FILTER]).names()


def _raises(url: str, context: AdmissionContext) -> str | None:
    raise RuntimeError("a plug-in's bug")


def _odd_reason(url: str, context: AdmissionContext) -> Any:
    return "not a token!"


def test_a_failing_filter_drops_its_link_and_an_odd_reason_is_counted_under_its_name() -> None:
    context = AdmissionContext("j", 0, Scope(frozenset(), (), (), (), max_depth=1))
    assert FilterChain((("buggy", _raises),)).reject_reason("http://a.test/", context) == "buggy_failed"
    assert FilterChain((("odd", _odd_reason),)).reject_reason("http://a.test/", context) == "odd"


def test_a_job_file_names_filters_with_params() -> None:
    spec = JobSpec.from_dict(
        {"seeds": ["http://a.test/"], "filters": [{"name": "max-query-params", "params": {"max": 2}}]}
    )
    assert spec.filters == (FilterSpec("max-query-params", {"max": 2}),)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert "filters" not in JobSpec.from_dict({"seeds": ["http://a.test/"]}).to_dict()  # older workers read it


class _Fetcher:
    def fetch(self, request: Any) -> Any:
        raise AssertionError("not fetched here")


class _NeedsABinary:
    def __call__(self, context: FetcherContext) -> _Fetcher:
        return _Fetcher()

    def unavailable(self, context: FetcherContext) -> str | None:
        return "/opt/thing is missing"


needs_a_binary = _NeedsABinary()


def test_plugin_page_types_join_the_builtins_and_an_unavailable_one_says_why() -> None:
    plugins = [EntryPoint("tagged", "vcrawl_test_plugin:tagged", FETCHERS_GROUP),
               EntryPoint("thing", f"{__name__}:needs_a_binary", FETCHERS_GROUP)]  # fmt: skip
    registry = FetcherRegistry.from_entry_points(FetcherContext(), [*_builtin_fetchers(), *plugins])
    assert {"static", "api", "tagged"} <= set(registry.page_types())
    registry.check("tagged")
    with pytest.raises(UnknownComponent, match="/opt/thing is missing"):
        registry.check("thing")


def test_a_fetcher_plugin_may_not_take_a_builtin_page_type() -> None:
    clash = EntryPoint("static", "vcrawl_test_plugin:tagged", FETCHERS_GROUP)
    with pytest.raises(ConfigError, match="built-in fetcher 'static'"):
        FetcherRegistry.from_entry_points(FetcherContext(), [*_builtin_fetchers(), clash])
