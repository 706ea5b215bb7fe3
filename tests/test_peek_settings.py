"""PEEK's settings from the engine's environment: each variable read, bad values refused with
the variable's name and an example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prefixserving import constants
from prefixserving.peek import settings as settings_module
from prefixserving.peek.lanes import MAX_RESPONSE_RATIO
from prefixserving.peek.settings import PeekSettings


def test_the_response_ratio_bound_defaults_to_the_lanes_and_reads_its_variable() -> None:
    assert PeekSettings.from_env({}).max_response_ratio == MAX_RESPONSE_RATIO
    env = {constants.ENV_MAX_RESPONSE_RATIO: "16"}
    assert PeekSettings.from_env(env).max_response_ratio == 16.0


@pytest.mark.parametrize(("raw", "message"), [("many", "is not a number"), ("0.5", "must be >= 1")])
def test_a_bad_response_ratio_names_the_variable(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        PeekSettings.from_env({constants.ENV_MAX_RESPONSE_RATIO: raw})
    assert constants.ENV_MAX_RESPONSE_RATIO in str(caught.value)


def test_the_cache_share_defaults_to_zero_and_reads_its_variable() -> None:
    assert PeekSettings.from_env({}).cache_share == 0.0
    assert PeekSettings.from_env({constants.ENV_CACHE_SHARE: "0.5"}).cache_share == 0.5


@pytest.mark.parametrize(
    ("raw", "message"), [("half", "is not a number"), ("1", "< 1"), ("-0.1", ">= 0")]
)
def test_a_bad_cache_share_names_the_variable(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        PeekSettings.from_env({constants.ENV_CACHE_SHARE: raw})
    assert constants.ENV_CACHE_SHARE in str(caught.value)


def test_the_decode_reserve_defaults_to_one_and_reads_its_variable() -> None:
    assert PeekSettings.from_env({}).decode_reserve_blocks == 1
    env = {constants.ENV_DECODE_RESERVE_BLOCKS: "2"}
    assert PeekSettings.from_env(env).decode_reserve_blocks == 2


@pytest.mark.parametrize(("raw", "message"), [("one", "is not a whole number"), ("-1", ">= 0")])
def test_a_bad_decode_reserve_names_the_variable_and_an_example(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        PeekSettings.from_env({constants.ENV_DECODE_RESERVE_BLOCKS: raw})
    assert constants.ENV_DECODE_RESERVE_BLOCKS in str(caught.value)


def test_reordering_on_a_backlog_is_off_by_default_and_reads_its_variable() -> None:
    assert PeekSettings.from_env({}).reorder_on_backlog is False
    env = {constants.ENV_REORDER_ON_BACKLOG: "true"}
    assert PeekSettings.from_env(env).reorder_on_backlog is True


def test_a_bad_backlog_flag_names_the_variable_and_an_example() -> None:
    with pytest.raises(ValueError, match="is not a boolean") as caught:
        PeekSettings.from_env({constants.ENV_REORDER_ON_BACKLOG: "sometimes"})
    assert f"{constants.ENV_REORDER_ON_BACKLOG}=true" in str(caught.value)


def test_the_fcfs_bound_is_off_by_default_and_reads_its_variable() -> None:
    assert PeekSettings.from_env({}).fcfs_bound is False
    assert PeekSettings.from_env({constants.ENV_FCFS_BOUND: "on"}).fcfs_bound is True


def test_a_bad_fcfs_bound_flag_names_the_variable_and_an_example() -> None:
    with pytest.raises(ValueError, match="is not a boolean") as caught:
        PeekSettings.from_env({constants.ENV_FCFS_BOUND: "maybe"})
    assert f"{constants.ENV_FCFS_BOUND}=true" in str(caught.value)


def _expected_defaults() -> dict[str, object]:
    defaults = PeekSettings()
    return {
        constants.ENV_MAX_SIBLING_WAIT_MS: defaults.max_sibling_wait_ms,
        constants.ENV_PIN_BUDGET_FRACTION: defaults.pin_budget_fraction,
        constants.ENV_LANES: defaults.lanes,
        constants.ENV_MAX_OVERTAKES: defaults.max_overtakes,
        constants.ENV_MAX_RESPONSE_RATIO: defaults.max_response_ratio,
        constants.ENV_CACHE_SHARE: defaults.cache_share,
        constants.ENV_DECODE_RESERVE_BLOCKS: defaults.decode_reserve_blocks,
        constants.ENV_REORDER_ON_BACKLOG: defaults.reorder_on_backlog,
        constants.ENV_FCFS_BOUND: defaults.fcfs_bound,
    }


def _assert_shows_the_defaults(rows: dict[str, str], where: str) -> None:
    expected = _expected_defaults()
    assert set(rows) == set(expected), (where, rows)
    for name, value in expected.items():
        shown = rows[name]
        assert (
            (shown == str(value).lower()) if isinstance(value, bool) else (float(shown) == value)
        ), (where, name, shown, value)


def test_the_docs_settings_table_gives_the_engines_defaults() -> None:
    """docs/peek.md's table of engine variables states each default as PeekSettings has it
    (it once said 256 overtakes while the engine used 128)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "peek.md").read_text()
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(
            r"^\|[^\n]*`(PREFIXSERVING_[A-Z_]+)`[^\n]*\| `([^`]+)` \|$", text, re.M
        )
    }
    _assert_shows_the_defaults(rows, "docs/peek.md")


def test_the_settings_module_table_gives_the_engines_defaults() -> None:
    """The settings module's docstring table too (it said 0 decode reserve blocks after the
    default became 1)."""
    doc = settings_module.__doc__ or ""
    rows = dict(re.findall(r"^``(PREFIXSERVING_[A-Z_]+)``\s+(\S+)\s", doc, re.M))
    _assert_shows_the_defaults(rows, "prefixserving.peek.settings")
