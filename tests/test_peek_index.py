"""Queue index: invariants under random insert/remove, and the dual walk."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixserving.peek.index import QueueIndex

# A prompt is a path of chained hashes: block i's hash names the whole prefix up to i,
# so a path is encoded as the tuple of its prefixes' token blocks.
blocks = st.lists(st.integers(0, 3), min_size=0, max_size=6)


def chained(tokens: list[int]) -> list[tuple[int, ...]]:
    return [tuple(tokens[: i + 1]) for i in range(len(tokens))]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 9), blocks),
        st.tuples(st.just("remove"), st.integers(0, 9), st.just([])),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_index_invariants_under_random_insert_remove(operations: list) -> None:
    index: QueueIndex[tuple[int, ...]] = QueueIndex()
    model: dict[str, list[tuple[int, ...]]] = {}
    for op, key_number, tokens in operations:
        key = f"r{key_number}"
        if op == "insert":
            index.insert(key, chained(tokens))
            model[key] = chained(tokens)
        else:
            unneeded = index.remove(key)
            removed = model.pop(key, [])
            still_needed = {h for path in model.values() for h in path}
            assert set(unneeded) == set(removed) - still_needed
        index.check_invariants()
        assert len(index) == len(model)
        for path in model.values():
            for h in path:
                assert index.count(h) == sum(h in p for p in model.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(blocks, min_size=1, max_size=8), st.integers(0, 6), blocks)
def test_dual_walk_matches_brute_force(paths: list, cached_depth: int, probe: list) -> None:
    index: QueueIndex[tuple[int, ...]] = QueueIndex()
    for i, tokens in enumerate(paths):
        index.insert(f"r{i}", chained(tokens))
    cached = set(chained(probe)[:cached_depth])
    target = chained(paths[0])
    walk = index.dual_walk(target, cached.__contains__)
    expected_cached = next((i for i, h in enumerate(target) if h not in cached), len(target))
    others = [chained(p) for p in paths[1:]]
    expected_shared = next(
        (i for i, h in enumerate(target) if not any(h in o for o in others)), len(target)
    )
    assert walk.cached_blocks == expected_cached
    assert walk.shared_blocks == expected_shared
    assert walk.total_blocks == len(target)
    assert walk.uncached_shared_blocks == max(0, expected_shared - expected_cached)


def test_reinsert_replaces_path_and_remove_unknown_is_ignored() -> None:
    index: QueueIndex[tuple[int, ...]] = QueueIndex()
    index.insert("a", chained([1, 2, 3]))
    index.insert("a", chained([1, 5]))
    assert index.count((1, 2)) == 0
    assert index.count((1,)) == 1
    assert index.remove("missing") == []
    assert index.remove("a") == [(1,), (1, 5)]
    assert index.num_nodes == 0
