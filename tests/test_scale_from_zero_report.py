"""The scale-from-zero benchmark's report (``bench/scale_from_zero.py``), without engines.

The scenario itself (a request held while no engine is Ready, served once one appears, 503 with
Retry-After when none comes) is tested against the router in ``tests/test_router_hold.py``; the
benchmark runs it on real processes and these tests check what it writes from its figures.
"""

from __future__ import annotations

from bench.scale_from_zero import init_engine_s, markdown

from prefixserving.api import defaults

MACHINE = {"cores": 2, "cpu": "Test CPU", "load_average_1m": 1.25, "python": "3.11.7"}
SERVED = {
    "ok": True,
    "error": "",
    "held_seen_s": 0.051,
    "engine_started_s": 0.052,
    "engine_ready_s": 33.3,
    "cold_start_s": 33.248,
    "init_engine_s": 0.51,
    "routed_s": 60.0,
    "ready_to_routed_s": 26.7,
    "ttft_s": 60.1,
    "held_gauge_after": 0.0,
}
FAILED = {**SERVED, "ok": False, "error": "HTTP 503: no engine", "ttft_s": 180.2}
RESULTS = {"hold_s": 180.0, "load_average_1m_end": 2.5}
NO_ENGINE = {
    "hold_s": 5.0,
    "status": 503,
    "waited_s": 5.004,
    "retry_after": "1",
    "error_type": "service_unavailable",
}


def rows(text: str, heading: str) -> list[list[str]]:
    """The body rows of the first table after ``heading``, as stripped cells."""
    section = text.split(heading, 1)[1].split("\n\n##", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def test_each_round_is_a_row_with_its_figures_and_the_ttft_less_the_discovery_wait() -> None:
    results = {**RESULTS, "served": [SERVED, FAILED], "no_engine": [NO_ENGINE]}
    text = markdown(results, MACHINE)

    served = rows(text, "## An engine starts")
    assert served[0] == [
        "1", "yes", "0.051", "0.052", "33.248", "0.510", "26.700", "60.100", "33.400",
    ]  # fmt: skip
    assert served[1][1] == "no: HTTP 503: no engine"
    assert served[1][-1] == "-"  # no TTFT of a request that was not served
    assert rows(text, "## No engine comes") == [
        ["1", "5.000", "5.004", "503", "1", "service_unavailable"]
    ]
    assert "`--no-engine-hold-seconds 180`" in text


def test_the_comparison_names_the_anchor_and_the_rendered_polling_interval() -> None:
    text = markdown({**RESULTS, "served": [SERVED], "no_engine": []}, MACHINE)
    assert "110-130 s" in text and "llm-d-autoscaling #1404" in text
    assert f"KEDA polls every {defaults.POLLING_INTERVAL_S} s" in text
    assert "KEDA's own default is 30 s" in text
    assert text.rstrip().endswith(
        "Machine: 2 cores, Test CPU, load average 1.25 (1 min), Python 3.11.7; "
        "load average 2.5 (1 min) at the end."
    )


def test_the_engine_core_start_up_is_read_from_vllms_log_line() -> None:
    log = (
        "(EngineCore_DP0 pid=7) INFO 12-01 16:38:01 [core.py:261] init engine (profile, create "
        "kv cache, warmup model) took 0.51 s\n"
    )
    assert init_engine_s(log) == 0.51
    compiled = log.replace("0.51 s", "12.40 s (compilation: 9.10 s)")
    assert init_engine_s(compiled) == 12.4
    assert init_engine_s("INFO Starting vLLM API server\n") is None
