"""The replay cost model and its calibration fit (no vLLM engine needed)."""

from __future__ import annotations

import pytest

from prefixserving_lab.models.cost import CostModel, StepShape
from prefixserving_lab.runners.calibration import Point, fit

MODEL = CostModel(base_s=0.01, prefill_token_s=4e-5, decode_seq_s=5e-4, context_token_s=2e-8)


def test_step_cost_is_linear_in_each_term() -> None:
    assert MODEL.step_s(StepShape()) == pytest.approx(0.01)
    assert MODEL.step_s(StepShape(prefill_tokens=1000)) == pytest.approx(0.01 + 0.04)
    assert MODEL.step_s(StepShape(decode_seqs=10)) == pytest.approx(0.01 + 0.005)
    both = StepShape(prefill_tokens=1000, decode_seqs=10, context_tokens=10**6)
    assert MODEL.step_s(both) == pytest.approx(0.01 + 0.04 + 0.005 + 0.02)


def test_request_work_grows_with_prefill_and_shrinks_with_batch() -> None:
    small = MODEL.request_work_s(prefill_tokens=100, prompt_tokens=2000, output_tokens=10, batch=8)
    large = MODEL.request_work_s(prefill_tokens=2000, prompt_tokens=2000, output_tokens=10, batch=8)
    assert large - small == pytest.approx(1900 * 4e-5)
    batched = MODEL.request_work_s(
        prefill_tokens=100, prompt_tokens=2000, output_tokens=10, batch=64
    )
    assert batched < small


def test_fit_recovers_the_coefficients_of_exact_points() -> None:
    shapes = [
        StepShape(prefill_tokens=256),
        StepShape(prefill_tokens=4096),
        StepShape(decode_seqs=1, context_tokens=150),
        StepShape(decode_seqs=16, context_tokens=2400),
        StepShape(decode_seqs=1, context_tokens=4100),
        StepShape(prefill_tokens=1024, decode_seqs=4, context_tokens=600),
    ]
    points = [Point("x", s, MODEL.step_s(s)) for s in shapes]
    got = fit(points, source="test")
    assert got.base_s == pytest.approx(MODEL.base_s, rel=1e-6)
    assert got.prefill_token_s == pytest.approx(MODEL.prefill_token_s, rel=1e-6)
    assert got.decode_seq_s == pytest.approx(MODEL.decode_seq_s, rel=1e-6)
    assert got.context_token_s == pytest.approx(MODEL.context_token_s, rel=1e-4)
    assert got.source == "test"


def test_fit_clamps_negative_coefficients_to_zero() -> None:
    # Decode steps get cheaper with more sequences: a nonsensical negative slope is clamped.
    points = [
        Point("d", StepShape(decode_seqs=1), 0.02),
        Point("d", StepShape(decode_seqs=8), 0.01),
        Point("p", StepShape(prefill_tokens=100), 0.02),
    ]
    assert fit(points, source="t").decode_seq_s == 0.0
