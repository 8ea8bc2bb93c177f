"""The frontier's Lua files: each documented at its top, with every name filled in from vcrawl.names."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from frontier.scripts import lua_source
from vcrawl import names
from vcrawl.lua import _lua_literal, script_text

SCRIPTS = sorted(
    entry.name.removesuffix(".lua")
    for entry in (resources.files("frontier") / "lua").iterdir()
    if entry.name.endswith(".lua") and not entry.name.startswith("_")
)


def test_every_script_is_a_package_resource() -> None:
    assert {"admit", "pump", "start_lease", "release", "reclaim", "new_cycle", "cancel", "fail", "pause",
            "resume", "update_spec", "finish_start", "drop_filter", "bloom_check_and_add", "gate_reserve",
            "gate_release"} <= set(SCRIPTS)  # fmt: skip


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_says_its_keys_and_argv_at_its_top(name: str) -> None:
    lines = (resources.files("frontier") / "lua" / f"{name}.lua").read_text(encoding="utf-8").splitlines()
    header = "\n".join(line for line in lines[: next(i for i, line in enumerate(lines) if not line.startswith("--"))])
    assert "-- KEYS:" in header and "-- ARGV" in header and "-- Returns" in header


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_placeholder_is_filled_in(name: str) -> None:
    assert not re.search(r"\{\{[A-Za-z0-9_]+\}\}", lua_source(name))


def test_names_reach_the_lua_as_string_literals() -> None:
    source = lua_source("fail")
    assert f"'{names.STATE_FAILED}'" in source and f"'{names.META_ERROR}'" in source
    assert "local function settle" in lua_source("release")  # the shared prelude
    assert "local function settle" not in lua_source("cancel")


def test_an_unknown_name_is_an_error_at_load_time() -> None:
    with pytest.raises(ValueError, match="NO_SUCH_NAME"):
        _lua_literal("admit", "NO_SUCH_NAME")
    with pytest.raises(ValueError, match="ACTIVE_STATES"):
        _lua_literal("admit", "ACTIVE_STATES")  # a tuple, not one name


def test_a_number_becomes_a_lua_number_a_negative_one_in_parentheses() -> None:
    assert _lua_literal("admit", "INLINK_CAP") == "10"
    assert float(_lua_literal("admit", "SCORE_INLINK")) == names.SCORE_INLINK
    assert _lua_literal("admit", "SCORE_SITEMAP_FIRST") == f"({names.SCORE_SITEMAP_FIRST!r})"  # -{{X}} is no comment


@pytest.mark.parametrize("package", ["fetchers", "engine"])
def test_every_package_reads_its_scripts_the_same_way(package: str) -> None:
    folder = resources.files(package) / "lua"
    for entry in folder.iterdir():
        if entry.name.endswith(".lua"):
            text = script_text(folder, entry.name.removesuffix(".lua"))
            assert "{{" not in text and text.startswith("--"), entry.name


def test_the_task_trail_script_spells_its_states_from_vcrawl_names() -> None:
    text = script_text(resources.files("engine") / "lua", "trail_transition")
    for state in names.TASK_STATES:
        assert f"['{state}']" in text
