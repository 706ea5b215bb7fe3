"""vLLM's own scheduler tests against PEEK (harness: ``tests/vllm_contract/``).

For every release of ``tests/vllm_contract/releases.toml`` (vLLM 0.32.0, the CPU build here, and
0.33.0, the GPU build the engine image ships), vLLM's ``tests/v1/core`` scheduler and KV cache
manager tests run unmodified, in three subprocesses started together: on vLLM's own
schedulers (stock), on ``PeekScheduler`` / ``PeekAsyncScheduler`` with holding and lanes off, and
on them with PEEK's defaults. Then:

* stock passes every test that ``deselected.toml`` does not list, and each listed one still
  fails on stock for the reason given;
* PEEK off gives the same outcome as stock for every test id;
* with PEEK on, the tests that differ from stock are exactly those ``judged.toml`` lists for the
  release, and none of them is judged a defect.

``test_kv_cache_utils.py`` never reaches a scheduler and runs on stock only (see the plugin).
Measured on two idle cores: 4.1 min in all for both releases, 5.6 min of CPU. One run after
another, the same runs took 6.9 min in a whole ``make test`` and 8.4 min alone on cores still
loaded by other work (load average 2-7). Needs ``make setup``, which downloads the releases.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from prefixserving.peek.settings import PeekSettings
from vllm_contract.fetch import releases, site_dir
from vllm_contract.lists import BEGIN, END, deselected, judged, judgements, render_markdown
from vllm_contract.runner import MODES, RUN_TIMEOUT_S, RunResult, missing, release, run

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = [r.version for r in releases()]
# Outcomes that count as not passing.
FAILING = {"failed", "error"}
# A release's first test starts its three runs (the module fixture) within its own timeout.
RUNS_TIMEOUT = pytest.mark.timeout(len(MODES) * RUN_TIMEOUT_S + 60)


@dataclass(frozen=True, slots=True)
class ContractRuns:
    """The three runs of one release."""

    version: str
    stock: RunResult
    peek_off: RunResult
    peek_on: RunResult


@pytest.fixture(scope="module", params=VERSIONS)
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ContractRuns:
    rel = release(request.param)
    if (why := missing(rel)) is not None:
        pytest.fail(why)
    workdir = tmp_path_factory.mktemp(f"vllm-{rel.version}")
    # The three runs are independent single-threaded processes: one alone uses one core at
    # most, so they are started together.
    with ThreadPoolExecutor(len(MODES)) as pool:
        stock = pool.submit(run, rel, "stock", workdir, check_deselected=True)
        peek_off = pool.submit(run, rel, "peek-off", workdir)
        peek_on = pool.submit(run, rel, "peek-on", workdir)
        return ContractRuns(rel.version, stock.result(), peek_off.result(), peek_on.result())


def _listing(outcomes: Mapping[str, dict[str, str]], ids: list[str]) -> str:
    """One line per test: id, outcome and failure message."""
    return "\n".join(
        f"  {i}: {outcomes[i]['outcome']}: {' '.join(outcomes[i]['message'].split())}" for i in ids
    )


def _pin(requirements: list[str], distribution: str) -> str:
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        if name.strip() == distribution:
            return version.strip()
    raise AssertionError(f"pyproject.toml pins no {distribution}==VERSION")


def test_releases_are_the_versions_pyproject_pins() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for rel in releases():
        if rel.installed is not None:
            assert rel.version == _pin(extras["cpu"], rel.installed), rel
        else:
            assert rel.version == _pin(extras["engine"], "vllm"), rel
        for artifact in rel.artifacts:
            assert f"vllm-{rel.version}" in artifact.filename, artifact


def test_docs_quote_the_lists() -> None:
    text = (ROOT / "docs" / "peek.md").read_text()
    section = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    assert section == "\n" + render_markdown(), (
        "docs/peek.md does not match tests/vllm_contract/*.toml: run `make docs`"
    )


def test_no_judged_difference_is_a_defect() -> None:
    defects = [j for j in judgements() if j.verdict == "defect"]
    assert not defects, "PEEK defects found by vLLM's scheduler tests (judged.toml):\n" + "\n".join(
        f"  {j.test_id} ({', '.join(j.versions)}): {j.cause}" for j in defects
    )


@pytest.mark.slow
@RUNS_TIMEOUT
def test_each_run_uses_the_release_scheduler_and_settings_it_names(runs: ContractRuns) -> None:
    rel = release(runs.version)
    site = site_dir(rel)
    for result in (runs.stock, runs.peek_off, runs.peek_on):
        report = result.report
        assert report["vllm_version"] == rel.version
        if site is not None:
            assert Path(report["vllm_file"]).is_relative_to(site), report["vllm_file"]
    assert runs.stock.report["rebound"] == []
    off = PeekSettings.from_env(MODES["peek-off"].env)
    assert not off.lanes and off.max_sibling_wait_ms == 0
    assert runs.peek_off.report["peek_settings"] == dataclasses.asdict(off)
    assert runs.peek_on.report["peek_settings"] == dataclasses.asdict(PeekSettings())
    # The plugin refuses to run when create_scheduler()'s module names no scheduler to rebind.
    assert runs.peek_off.report["rebound"] == runs.peek_on.report["rebound"] != []
    assert runs.peek_off.report["not_reaching"] == runs.peek_on.report["not_reaching"]


def _comparable(runs: ContractRuns, peek: RunResult) -> dict[str, dict[str, str]]:
    """Stock's outcomes of the tests a PEEK run ran; checks that these are all the tests stock
    ran outside deselected.toml, except those the swap cannot reach (stock only)."""
    listed = deselected(runs.version)
    stock = {i: o for i, o in runs.stock.outcomes.items() if i not in listed}
    ran = set(peek.outcomes)
    assert ran.isdisjoint(peek.report["not_reaching"])
    assert ran | set(peek.report["not_reaching"]) == set(stock), "PEEK ran other tests than stock"
    return {i: stock[i] for i in sorted(ran)}


@pytest.mark.slow
@RUNS_TIMEOUT
def test_stock_passes_all_but_the_deselected(runs: ContractRuns) -> None:
    report, outcomes = runs.stock.report, runs.stock.outcomes
    listed = deselected(runs.version)
    unlisted_failures = sorted(
        i for i, o in outcomes.items() if o["outcome"] in FAILING and i not in listed
    )
    assert not unlisted_failures, (
        f"vLLM {runs.version}'s own scheduler fails these tests here; fix the harness or, if "
        "they cannot run on a CPU-only machine, list them in deselected.toml:\n"
        + _listing(outcomes, unlisted_failures)
    )
    gone = sorted(set(listed) - set(report["deselected"]) - set(report["deselect_checks"]))
    assert not gone, (
        f"deselected.toml lists tests that vLLM {runs.version} no longer has; drop them:\n"
        + "\n".join(f"  {i}" for i in gone)
    )
    # One test per group runs, to check that the group's reason still holds.
    checked = {listed[i].group: i for i in report["deselect_checks"]}
    assert sorted(checked) == sorted({d.group for d in listed.values() if d.fails_with})
    stale = [
        i
        for i in checked.values()
        if outcomes[i]["outcome"] not in FAILING
        or listed[i].fails_with not in outcomes[i]["message"]
    ]
    assert not stale, (
        f"These deselected tests no longer fail on vLLM {runs.version} for the reason "
        "deselected.toml gives; check their groups:\n" + _listing(outcomes, stale)
    )


@pytest.mark.slow
@RUNS_TIMEOUT
def test_peek_off_matches_stock(runs: ContractRuns) -> None:
    stock = _comparable(runs, runs.peek_off)
    off = runs.peek_off.outcomes
    differ = sorted(i for i in stock if off[i]["outcome"] != stock[i]["outcome"])
    assert not differ, (
        f"With holding and lanes off, PeekScheduler must behave exactly like vLLM "
        f"{runs.version}'s scheduler; these tests differ (outcome with PEEK off):\n"
        + _listing(off, differ)
    )


@pytest.mark.slow
@RUNS_TIMEOUT
def test_peek_on_differs_from_stock_only_where_judged(runs: ContractRuns) -> None:
    stock = _comparable(runs, runs.peek_on)
    on = runs.peek_on.outcomes
    differ = {i for i in stock if on[i]["outcome"] != stock[i]["outcome"]}
    expected = judged(runs.version)
    new = sorted(differ - set(expected))
    assert not new, (
        f"With PEEK on, these tests of vLLM {runs.version} fail and are not judged: judge each "
        "(intended ordering difference or defect) in tests/vllm_contract/judged.toml:\n"
        + _listing(on, new)
    )
    stale = sorted(set(expected) - differ)
    assert not stale, (
        f"judged.toml lists tests of vLLM {runs.version} that now behave as on stock with PEEK "
        "on; drop them from the list:\n" + "\n".join(f"  {i}" for i in stale)
    )
