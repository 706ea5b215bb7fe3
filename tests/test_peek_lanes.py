"""Stride lanes: exact FCFS without pressure, no starvation, the ride-along bound."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixserving.peek.lanes import SOLO_LANE, Lanes, Pick, cluster_lane

LANE_KEYS = [SOLO_LANE, cluster_lane("a"), cluster_lane("b"), cluster_lane("c")]


def pick_and_pop(lanes: Lanes[int], hot: set[str], cost: dict[str, int]) -> tuple[str, Pick]:
    solo = lanes.lane_head(SOLO_LANE)
    picked = lanes.next_pick(lambda entry: entry.rid in hot)
    assert picked is not None
    entry, how = picked
    lanes.remove(entry.rid)
    lanes.charge(how, entry.lane, cost[entry.rid])
    # A request that shares nothing is never overtaken by a younger request.
    assert solo is None or entry.seq <= solo.seq
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
@given(ops, st.floats(0.1, 0.9))
def test_every_request_is_admitted_once_and_ride_along_stays_within_its_share(
    operations: list, ride_share: float
) -> None:
    lanes: Lanes[int] = Lanes(ride_share=ride_share)
    lanes.pressure = True
    hot: set[str] = set()
    cost: dict[str, int] = {}
    parked: list[str] = []
    admitted: list[str] = []
    ride_since_spine = 0.0
    last_spine_cost = 0.0
    c_max = 2048
    counter = 0

    def pick() -> None:
        nonlocal ride_since_spine, last_spine_cost
        rid, how = pick_and_pop(lanes, hot, cost)
        admitted.append(rid)
        if how is Pick.RIDE_ALONG:
            ride_since_spine += cost[rid]
            bound = ride_share / (1 - ride_share) * last_spine_cost + c_max
            assert ride_since_spine <= bound + 1e-6
        else:
            ride_since_spine = 0.0
            last_spine_cost = cost[rid]

    for op, number, flag in operations:
        if op == "add":
            rid = f"r{counter}"
            counter += 1
            lanes.add(rid, counter, LANE_KEYS[number])
            cost[rid] = 64 if flag else c_max
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
    shares nothing still goes within a few rounds of its lane's stride share."""
    lanes: Lanes[int] = Lanes(ride_share=0.5)
    lanes.pressure = True
    hot_lane = cluster_lane("hot")
    cost: dict[str, int] = {}
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

    for _ in range(8):
        add_hot()
    for _ in range(20):  # the cluster has been running a while
        pick_and_pop(lanes, hot, cost)
        add_hot()
    lanes.add("cold", 0, SOLO_LANE)
    cost["cold"] = 2048
    picks = 0
    while True:
        rid, _ = pick_and_pop(lanes, hot, cost)
        picks += 1
        if rid == "cold":
            break
        add_hot()
        assert picks <= 32, "cold request starved by a hot cluster"
