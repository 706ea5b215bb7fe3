"""Lanes: vLLM's order without reordering, cheapest first with it, the overtake bound and the
response-ratio bound under random arrivals, re-pricing, holds and admissions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixserving.peek.lanes import Lanes, Pick

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 5000), st.integers(0, 2)),
        st.tuples(st.just("admit"), st.just(0), st.just(0)),
        st.tuples(st.just("park"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("unpark"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("reprice"), st.integers(0, 40), st.integers(1, 5000)),
    ),
    max_size=120,
)


def add(lanes: Lanes[int], number: int, cost: int, klass: int = 0) -> None:
    lanes.add(
        f"r{number}",
        number,
        klass=klass,
        order=(number,),
        cost_tokens=cost,
        cache_key=(cost, 0),
    )


def admit(lanes: Lanes[int]) -> tuple[str, Pick] | None:
    picked = lanes.next_pick()
    if picked is None:
        return None
    entry, pick = picked
    lanes.remove(entry.rid)
    lanes.charge(entry.cost_tokens)
    return entry.rid, pick


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 12), st.booleans())
def test_no_request_is_overtaken_more_than_the_budget(
    operations: list, max_overtakes: int, reorder: bool
) -> None:
    """Count, for each waiting request, the younger requests of its class admitted ahead of it:
    never more than ``max_overtakes``, whatever the costs, re-pricing and holds do; and without
    reordering (or a zero budget) the admission order is arrival order within each class."""
    lanes: Lanes[int] = Lanes(max_overtakes=max_overtakes)
    lanes.reorder = reorder
    waiting: dict[str, tuple[int, int]] = {}  # rid -> (number, class)
    overtaken: dict[str, int] = {}
    parked: set[str] = set()
    count = 0
    for op, value, extra in operations:
        if op == "add":
            add(lanes, count, value, klass=extra)
            waiting[f"r{count}"] = (count, extra)
            overtaken[f"r{count}"] = 0
            count += 1
        elif op == "admit":
            done = admit(lanes)
            if done is None:
                assert all(rid in parked for rid in waiting)
                continue
            rid, _ = done
            assert rid not in parked
            number, klass = waiting.pop(rid)
            best_class = (
                min(k for r, (_, k) in waiting.items() if r not in parked)
                if [r for r in waiting if r not in parked]
                else klass
            )
            assert klass <= best_class  # a better class is always served first
            for other, (other_number, other_class) in waiting.items():
                if other_class == klass and other_number < number and other not in parked:
                    overtaken[other] += 1
                    assert reorder and max_overtakes > 0
                    assert overtaken[other] <= max_overtakes
        elif op in ("park", "unpark", "reprice"):
            rid = f"r{value}"
            if rid not in waiting:
                continue
            if op == "park" and rid not in parked:
                lanes.park(rid)
                parked.add(rid)
            elif op == "unpark" and rid in parked:
                lanes.unpark(rid)
                parked.discard(rid)
            elif op == "reprice":
                lanes.reprice(rid, extra, (extra, 0))


def test_cheapest_first_under_pressure_then_the_response_ratio_bound() -> None:
    lanes: Lanes[int] = Lanes(max_overtakes=100, max_response_ratio=4.0)
    lanes.reorder = True
    add(lanes, 0, 400)  # an expensive request, oldest
    picks = []
    for number in range(1, 30):
        add(lanes, number, 100)  # a fresh cheap hit arrives before each admission
        picks.append(admit(lanes))
    # Cheap requests go first while nobody's response ratio reaches 4; the expensive one
    # reaches (waited + 400) / 400 = 4 after 1,200 admitted tokens (12 cheap admissions) and
    # beats every fresh cheap request's ratio then.
    assert all(pick == (f"r{i + 1}", Pick.CACHE) for i, pick in enumerate(picks[:12]))
    assert picks[12] == ("r0", Pick.AGED)


def test_without_pressure_the_order_is_vllms() -> None:
    lanes: Lanes[int] = Lanes()
    lanes.reorder = False
    for number, cost in enumerate([5000, 10, 3000, 1]):
        add(lanes, number, cost)
    lanes.add("back", -1, klass=0, order=(), cost_tokens=7, cache_key=(7, 0), resume=True)
    assert [admit(lanes) for _ in range(5)] == [
        ("back", Pick.RESUME),
        ("r0", Pick.FCFS),
        ("r1", Pick.FCFS),
        ("r2", Pick.FCFS),
        ("r3", Pick.FCFS),
    ]
