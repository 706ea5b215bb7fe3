"""The shared-prefix burst workload: fan-outs behind one new prompt each, cold documents."""

from __future__ import annotations

import math

import pytest

from prefixserving_lab.workloads.prefix_bursts import BURST_BLOCK_BASE, PrefixBursts
from prefixserving_lab.workloads.traces import TraceRequest

BACKGROUND = [TraceRequest(float(i), 300, 20, (i % 4, 1000 + i), 128) for i in range(100)]


def test_fanouts_share_one_new_prefix_each_and_nothing_else() -> None:
    bursts = PrefixBursts(
        fanout=((10.0, 40.0),), fanout_every_s=7.0, fanout_requests=8, prefix_tokens=1024, cold=()
    )
    out = bursts.requests(BACKGROUND)
    assert [r.arrival_s for r in out] == sorted(r.arrival_s for r in out)
    added = [r for r in out if r.block_ids[0] >= BURST_BLOCK_BASE]
    assert len(added) == math.ceil(30 / 7) * 8 == 40
    assert len(out) == len(BACKGROUND) + len(added), "background kept whole"
    groups: dict[tuple[int, ...], list[TraceRequest]] = {}
    for r in added:
        groups.setdefault(r.block_ids[:-1], []).append(r)
    assert len(groups) == 5 and all(len(g) == 8 for g in groups.values())
    assert all(len(prefix) == 1024 // 128 for prefix in groups)
    own = [r.block_ids[-1] for r in added]
    assert len(set(own)) == len(own), "each request's last block is its own"
    for group in groups.values():
        starts = [r.arrival_s for r in group]
        assert max(starts) - min(starts) < bursts.fanout_spread_s
        assert (min(starts) - 10.0) % 7.0 == 0.0
        assert all(r.input_tokens == 1024 + 128 for r in group)
    all_prefix_ids = [b for prefix in groups for b in prefix]
    assert len(set(all_prefix_ids)) == len(all_prefix_ids), "a new prompt every fan-out"


def test_cold_documents_share_nothing() -> None:
    bursts = PrefixBursts(fanout=(), cold=((5.0, 7.0),), cold_per_s=3.0, cold_tokens=1000)
    added = [r for r in bursts.requests(BACKGROUND) if r.block_ids[0] >= BURST_BLOCK_BASE]
    assert len(added) == 6
    assert [r.arrival_s for r in added] == pytest.approx([5 + k / 3 for k in range(6)])
    assert all(len(r.block_ids) == 8 and r.input_tokens == 1000 for r in added)
    ids = [b for r in added for b in r.block_ids]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("question_tokens", 200, "question_tokens must fit in one block"),
        ("fanout_every_s", 0.0, "fanout_every_s must be > 0"),
        ("cold_tokens", 0, "cold_tokens must be at least 1"),
        ("cold", ((9.0, 3.0),), "burst window 9:3"),
    ],
)
def test_bad_parameters_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrefixBursts(**{field: value})  # type: ignore[arg-type]
