"""Replay workloads: deterministic, correct sharing structure, cache sizing, trace loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixserving_lab.models.cost import CostModel
from prefixserving_lab.models.replay_engine import EngineShape
from prefixserving_lab.workloads import replay_suite as suite
from prefixserving_lab.workloads import segments as workloads

pytestmark = pytest.mark.slow  # imports vLLM

COST = CostModel(base_s=0.01, prefill_token_s=4e-5, decode_seq_s=5e-4, context_token_s=2e-8)
BASE = EngineShape(num_blocks=0, block_size=16)


def small_gsp(**kwargs: object) -> workloads.Workload:
    args: dict = dict(
        name="g",
        cost=COST,
        base=BASE,
        groups=4,
        prompts_per_group=4,
        system_tokens=256,
        question_tokens=32,
        output_tokens=8,
    )
    args.update(kwargs)
    return workloads.gsp(**args)


def test_gsp_is_deterministic_for_a_seed_and_differs_across_seeds() -> None:
    a, b, c = small_gsp(seed=1), small_gsp(seed=1), small_gsp(seed=2)
    assert [r.prompt_token_ids() for r in a.requests] == [r.prompt_token_ids() for r in b.requests]
    assert [r.arrival_s for r in a.requests] == [r.arrival_s for r in b.requests]
    assert a.requests[0].prompt_token_ids() != c.requests[0].prompt_token_ids()


def test_gsp_groups_share_exactly_their_system_prompt() -> None:
    w = small_gsp(cold_requests=3)
    by_system: dict[tuple, list[list[int]]] = {}
    for r in w.requests:
        if r.shares_prefix:
            by_system.setdefault(r.segments[0][0], []).append(r.prompt_token_ids())
    assert len(by_system) == 4 and all(len(v) == 4 for v in by_system.values())
    for prompts in by_system.values():
        assert all(p[:256] == prompts[0][:256] for p in prompts)
        assert len({tuple(p[256:]) for p in prompts}) == 4
    cold = [r for r in w.requests if not r.shares_prefix]
    assert len(cold) == 3 and all(r.prompt_tokens == 288 for r in cold)
    # Ideal: every group computes its 256-token prompt once (blocks of 16 divide it).
    assert w.ideal_hit_rate == pytest.approx(4 * 3 * 256 / (19 * 288))


def test_cache_is_a_fraction_of_the_distinct_shared_blocks() -> None:
    w = small_gsp(cache_fraction=1.0)
    assert w.shared_blocks == 4 * 256 // 16
    assert w.engine.num_blocks == 64 + 1  # plus vLLM's null block
    quarter = small_gsp(cache_fraction=0.25)
    # Never below twice the longest request: (288 + 8) / 16 -> 19 blocks, x2.
    assert quarter.engine.num_blocks == 38 + 1


def test_arrivals_are_poisson_at_the_requested_load() -> None:
    w = small_gsp(groups=32, load=0.5)
    fast = small_gsp(groups=32, load=1.0)
    span, fast_span = w.requests[-1].arrival_s, fast.requests[-1].arrival_s
    assert span == pytest.approx(2 * fast_span, rel=1e-9)
    assert [r.arrival_s for r in w.requests] == sorted(r.arrival_s for r in w.requests)


def write_mooncake(path: Path) -> Path:
    rows = [
        {"timestamp": 0, "input_length": 1200, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 1000, "input_length": 1100, "output_length": 0, "hash_ids": [1, 2, 9]},
        {"timestamp": 3000, "input_length": 300, "output_length": 7, "hash_ids": [40]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_mooncake_hash_ids_become_equal_512_token_blocks(tmp_path: Path) -> None:
    w = workloads.mooncake(
        write_mooncake(tmp_path / "t.jsonl"), name="m", cost=COST, base=BASE, load=None
    )
    first, second, third = w.requests
    assert [r.prompt_tokens for r in w.requests] == [1200, 1100, 300]
    assert first.prompt_token_ids()[:1024] == second.prompt_token_ids()[:1024]
    assert first.prompt_token_ids()[1024:1100] != second.prompt_token_ids()[1024:1100]
    assert first.shares_prefix and second.shares_prefix and not third.shares_prefix
    assert [r.output_tokens for r in w.requests] == [5, 1, 7]
    assert [r.arrival_s for r in w.requests] == [0.0, 1.0, 3.0]
    fast = workloads.mooncake(
        tmp_path / "t.jsonl", name="m", cost=COST, base=BASE, load=None, time_scale=4
    )
    assert [r.arrival_s for r in fast.requests] == [0.0, 0.25, 0.75]
    assert w.ideal_hit_rate == pytest.approx(1024 / 2600)


def test_prompts_longer_than_max_model_len_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        workloads.mooncake(
            write_mooncake(tmp_path / "t.jsonl"),
            name="m",
            cost=COST,
            base=EngineShape(num_blocks=0, max_model_len=1000),
            load=None,
        )


def test_standard_suite_builds_every_workload_at_small_scale(shared_dir: Path) -> None:
    ctx = suite.BuildContext(
        cost=COST, base=EngineShape(num_blocks=0), scale=0.1, traces=shared_dir / "traces"
    )
    built = suite.build(list(suite.STANDARD), ctx)
    assert [w.name for w in built] == list(suite.STANDARD)
    by_name = {w.name: w for w in built}
    assert by_name["azure-code"].ideal_hit_rate == 0.0
    assert not any(r.shares_prefix for r in by_name["azure-code"].requests)
    assert by_name["gsp-chunked"].engine.long_prefill_token_threshold == 512
    cold_variants = ("gsp-cold-q25", "gsp-cold-full", "gsp-cold-big")
    blocks = [by_name[n].engine.num_blocks for n in cold_variants]
    assert blocks == sorted(blocks) and len(set(blocks)) == 3
    one, four = by_name["mooncake-1x"], by_name["mooncake-4x"]
    assert four.requests[-1].arrival_s == pytest.approx(one.requests[-1].arrival_s / 4)
    with pytest.raises(KeyError, match="known"):
        suite.build(["nope"], ctx)
