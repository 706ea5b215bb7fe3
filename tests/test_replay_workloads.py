"""Replay workloads: deterministic, correct sharing structure, cache sizing, trace loading."""

from __future__ import annotations

import json
from dataclasses import replace
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


def test_a_session_turn_resends_the_history_its_answer_and_a_new_message() -> None:
    w = workloads.sessions(
        name="s",
        cost=COST,
        base=EngineShape(num_blocks=0, block_size=16),
        sessions=3,
        turns=4,
        systems=1,
        system_tokens=64,
        first_message_tokens=32,
        message_tokens=16,
        output_tokens=8,
        think_s=2.0,
    )
    by_id = {r.request_id: r for r in w.requests}
    followers = [r for r in w.requests if r.after is not None]
    assert len(followers) == 3 * 3 and all(r.think_s == 2.0 for r in followers)
    for r in followers:
        before = by_id[r.after]
        tokens, previous = r.prompt_token_ids(), before.prompt_token_ids()
        assert tokens[: len(previous)] == previous
        answer = tokens[len(previous) : len(previous) + before.output_tokens]
        assert answer == [workloads.SAMPLED_TOKEN] * before.output_tokens
        assert len(tokens) == len(previous) + before.output_tokens + 16
    opened = [r for r in w.requests if r.after is None]
    assert len(opened) == 3 and [r.arrival_s for r in opened] == sorted(r.arrival_s for r in opened)
    # Sessions share the one system prompt, and nothing past it.
    starts = {tuple(r.prompt_token_ids()[:64]) for r in opened}
    assert len(starts) == 1
    assert len({tuple(r.prompt_token_ids()[64:96]) for r in opened}) == 3


def test_the_header_variant_puts_one_common_header_in_front_of_every_prompt(
    shared_dir: Path,
) -> None:
    ctx = suite.BuildContext(
        cost=COST, base=EngineShape(num_blocks=0), scale=0.05, traces=shared_dir / "traces"
    )
    plain, header = suite.build(["gsp-cold-q25", "gsp-cold-q25+hdr16"], ctx)
    assert header.name == "gsp-cold-q25+hdr16" and header.engine.block_size == 16
    n = suite.HEADER_TOKENS
    assert len({tuple(r.prompt_token_ids()[:n]) for r in header.requests}) == 1
    assert [r.prompt_tokens for r in header.requests] == [
        r.prompt_tokens + n for r in plain.requests
    ]
    # Whether a request shares a prefix is read past the header: cold requests still do not.
    assert [r.shares_prefix for r in header.requests] == [r.shares_prefix for r in plain.requests]
    assert not all(r.shares_prefix for r in header.requests)


def test_a_load_point_replaces_each_workloads_own_load(shared_dir: Path) -> None:
    ctx = suite.BuildContext(
        cost=COST, base=EngineShape(num_blocks=0), scale=0.05, traces=shared_dir / "traces"
    )
    (low,) = suite.build(["gsp-q25"], replace(ctx, load=0.5))
    (high,) = suite.build(["gsp-q25"], replace(ctx, load=1.0))
    assert low.requests[-1].arrival_s == pytest.approx(2 * high.requests[-1].arrival_s)
    assert "load 0.5" in low.description and "load 1" in high.description
    assert suite.role("gsp-q25+hdr64") == "sharing" and suite.role("azure-code") == "control"
    assert "mooncake-4x" not in suite.SWEEP and "agent-loop+hdr16" in suite.SWEEP
