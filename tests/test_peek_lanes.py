"""Stride lanes: exact FCFS without pressure, the overtake bound, stride among hot lanes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixserving.peek.lanes import SOLO_LANE, Lanes, Pick, cluster_lane

LANE_KEYS = [SOLO_LANE, cluster_lane("a"), cluster_lane("b"), cluster_lane("c")]


def pick_and_pop(lanes: Lanes[int], hot: set[str], cost: dict[str, int]) -> tuple[str, Pick]:
    picked = lanes.next_pick(lambda entry: entry.rid in hot)
    assert picked is not None
    entry, how = picked
    lanes.remove(entry.rid)
    lanes.charge(how, entry.lane, cost[entry.rid])
    return entry.rid, how


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=40))
def test_without_pressure_order_is_exactly_fcfs(adds: list) -> None:
    lanes: Lanes[int] = Lanes()
    hot: set[str] = set()
    cost: dict[str, int] = {}
    for i, (lane_number, is_hot) in enumerate(adds):
        rid = f"r{i}"
        lanes.add(rid, i, LANE_KEYS[lane_number])
        lanes.mark_hot(LANE_KEYS[lane_number])
        cost[rid] = 64 if is_hot else 2048
        if is_hot:
            hot.add(rid)
    order = [pick_and_pop(lanes, hot, cost) for _ in adds]
    assert [rid for rid, _ in order] == [f"r{i}" for i in range(len(adds))]
    assert {how for _, how in order} == {Pick.FCFS}


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("pick"), st.just(0), st.booleans()),
        st.tuples(st.just("park"), st.integers(0, 50), st.booleans()),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 6))
def test_every_request_is_admitted_once_and_overtaken_at_most_the_budget(
    operations: list, max_overtakes: int
) -> None:
    """Count, for every waiting request, the younger requests admitted before it: never more
    than ``max_overtakes``, whatever the hot set, lanes and parking do."""
    lanes: Lanes[int] = Lanes(max_overtakes=max_overtakes)
    lanes.pressure = True
    hot: set[str] = set()
    cost: dict[str, int] = {}
    parked: list[str] = []
    admitted: list[str] = []
    overtaken: dict[str, int] = {}
    counter = 0

    def pick() -> None:
        rid, how = pick_and_pop(lanes, hot, cost)
        seq = int(rid[1:])
        admitted.append(rid)
        for other in lanes:
            if other.present and int(other.rid[1:]) < seq:
                overtaken[other.rid] = overtaken.get(other.rid, 0) + 1
                assert overtaken[other.rid] <= max_overtakes
        assert (how is Pick.STRIDE) == any(int(o.rid[1:]) < seq and o.present for o in lanes), (
            "a stride pick is exactly one that overtakes a presentable older request"
        )

    for op, number, flag in operations:
        if op == "add":
            rid = f"r{counter}"
            counter += 1
            lanes.add(rid, counter, LANE_KEYS[number])
            cost[rid] = 64 if flag else 2048
            if flag:
                hot.add(rid)
                lanes.mark_hot(LANE_KEYS[number])
        elif op == "pick" and lanes.spine_head() is not None:
            pick()
        elif op == "park" and number < counter:
            rid = f"r{number}"
            entry = lanes.get(rid)
            if entry is not None and entry.present:
                lanes.park(rid)
                parked.append(rid)
            elif parked and flag:
                lanes.unpark(parked.pop())
    for rid in parked:
        lanes.unpark(rid)
    while lanes.spine_head() is not None:
        pick()
    assert len(lanes) == 0
    assert sorted(admitted) == sorted(cost)


def test_a_flooding_hot_cluster_cannot_starve_a_cold_request() -> None:
    """Under pressure a hot cluster is refilled after every admission; the cold request that
    shares nothing goes as soon as it has been overtaken ``max_overtakes`` times."""
    lanes: Lanes[int] = Lanes(max_overtakes=8)
    lanes.pressure = True
    hot_lane = cluster_lane("hot")
    cost: dict[str, int] = {"cold": 2048}
    hot: set[str] = set()
    counter = 0

    def add_hot() -> None:
        nonlocal counter
        rid = f"h{counter}"
        counter += 1
        lanes.add(rid, counter, hot_lane)
        cost[rid] = 128
        hot.add(rid)
        lanes.mark_hot(hot_lane)

    lanes.add("cold", 0, SOLO_LANE)
    for _ in range(4):
        add_hot()
    order = []
    while "cold" not in order:
        order.append(pick_and_pop(lanes, hot, cost)[0])
        add_hot()
    assert len(order) == 9  # eight hot requests overtook it, then it went


def test_hot_lanes_take_turns_by_stride_pass() -> None:
    """Two hot clusters behind an older cold request: each pick takes the hot lane with the
    lowest pass, a pass advancing by cost / waiting requests of the lane."""
    lanes: Lanes[int] = Lanes()
    lanes.pressure = True
    lanes.add("cold", 0, SOLO_LANE)
    a, b = cluster_lane("a"), cluster_lane("b")
    for i in range(4):
        lanes.add(f"a{i}", i, a)
    for i in range(2):
        lanes.add(f"b{i}", i, b)
    lanes.mark_hot(a)
    lanes.mark_hot(b)
    hot = {f"a{i}" for i in range(4)} | {"b0", "b1"}
    cost = dict.fromkeys([*hot, "cold"], 100)
    order = [pick_and_pop(lanes, hot, cost) for _ in range(7)]
    # passes: a 0->25->58->108->208, b 0->50->150; ties go to the older head (a0 before b0)
    assert [rid for rid, _ in order] == ["a0", "b0", "a1", "b1", "a2", "a3", "cold"]
    assert [how for _, how in order] == [Pick.STRIDE] * 6 + [Pick.FCFS]
