"""Queue index: counts of uncached blocks match a brute-force recount under random inserts,
frontier moves and removals; clusters (shared uncached depth) and frontier sets."""

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
        st.tuples(st.just("insert"), st.integers(0, 9), blocks, st.integers(0, 7)),
        st.tuples(st.just("move"), st.integers(0, 9), st.just([]), st.integers(0, 7)),
        st.tuples(st.just("remove"), st.integers(0, 9), st.just([]), st.just(0)),
    ),
    max_size=60,
)


def recount(model: dict[str, tuple[list, int]]) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for path, frontier in model.values():
        for block_hash in path[frontier:]:
            counts[block_hash] = counts.get(block_hash, 0) + 1
    return counts


@settings(max_examples=300, deadline=None)
@given(ops)
def test_counts_match_a_brute_force_recount(operations: list) -> None:
    index: QueueIndex[tuple[int, ...]] = QueueIndex()
    model: dict[str, tuple[list, int]] = {}
    for op, key_number, tokens, frontier in operations:
        key = f"r{key_number}"
        if op == "insert":
            path = chained(tokens)
            index.insert(key, path, frontier)
            model[key] = (path, min(frontier, len(path)))
        elif op == "move" and key in model:
            path = model[key][0]
            index.move_frontier(key, frontier)
            model[key] = (path, min(frontier, len(path)))
        elif op == "remove":
            index.remove(key)
            model.pop(key, None)
        index.check_invariants()
        counts = recount(model)
        assert index.num_nodes == len(counts)
        for block_hash, count in counts.items():
            assert index.count(block_hash) == count
        for key, (path, frontier) in model.items():
            if frontier < len(path):
                block_hash = path[frontier]
                assert index.at(block_hash) == {
                    k for k, (p, f) in model.items() if f < len(p) and p[f] == block_hash
                }
            # The cluster: uncached blocks from the frontier on that another request needs.
            shared = 0
            for block_hash in path[frontier:]:
                if counts[block_hash] < 2:
                    break
                shared += 1
            assert index.shared_blocks(key) == shared


def test_cached_blocks_do_not_count_and_a_cluster_is_the_shared_uncached_run() -> None:
    index: QueueIndex[tuple[int, ...]] = QueueIndex()
    header_and_doc = [9, 1, 2, 3]
    index.insert("a", chained([*header_and_doc, 10]), frontier=1)  # the header is cached
    index.insert("b", chained([*header_and_doc, 20]), frontier=1)
    index.insert("c", chained([9, 5, 6]), frontier=1)  # shares only the cached header
    assert index.count((9,)) == 0
    assert index.shared_blocks("a") == index.shared_blocks("b") == 3
    assert index.shared_blocks("c") == 0
    assert index.at((9, 1)) == {"a", "b"}
    # The pioneer's blocks get cached: the siblings' frontier moves past them.
    index.move_frontier("b", 4)
    assert index.count((9, 1)) == 1 and index.shared_blocks("a") == 0
    # Evicted again: they count again.
    index.move_frontier("b", 1)
    assert index.shared_blocks("a") == 3
    # Distinct uncached work of the queue: 3 shared + 2 own + 2 of c.
    assert index.num_nodes == 7


def test_reinsert_replaces_path_and_remove_unknown_is_ignored() -> None:
    index: QueueIndex[tuple[int, ...]] = QueueIndex()
    index.insert("a", chained([1, 2, 3]), frontier=0)
    index.insert("a", chained([1, 5]), frontier=0)
    assert index.count((1, 2)) == 0
    assert index.count((1,)) == 1
    index.remove("missing")
    index.remove("a")
    assert index.num_nodes == 0 and len(index) == 0


def test_reuse_is_a_cached_prefix_or_a_shared_next_block() -> None:
    index: QueueIndex[str] = QueueIndex()
    index.insert("a", ["a1", "a2"], 0)
    index.insert("b", ["b1"], 0)
    assert not index.has_reuse
    index.insert("c", ["a1", "c2"], 0)  # needs a's next block too
    assert index.has_reuse
    index.remove("c")
    assert not index.has_reuse
    index.move_frontier("a", 1)  # a1 got cached
    assert index.has_reuse
    index.move_frontier("a", 0)  # and was evicted
    assert not index.has_reuse
    index.check_invariants()
