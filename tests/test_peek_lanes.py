"""Lanes: vLLM's order without reordering, cheapest first with it, the overtake bound and the
response-ratio bound under random arrivals, re-pricing, holds and admissions."""

from __future__ import annotations

import gc
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixserving.peek.lanes import COMPACT_FACTOR, COMPACT_SLACK, Entry, Lanes, Pick


def lane_ops(
    top_class: int, top_id: int, *more: st.SearchStrategy, max_size: int
) -> st.SearchStrategy:
    """Random (op, value, extra) sequences: arrivals of cost ``value`` in class ``extra``,
    admissions, holds, releases and re-pricing of request ``value``, plus ``more``."""
    return st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, 5000), st.integers(0, top_class)),
            st.tuples(st.just("admit"), st.just(0), st.just(0)),
            st.tuples(st.just("park"), st.integers(0, top_id), st.just(0)),
            st.tuples(st.just("unpark"), st.integers(0, top_id), st.just(0)),
            st.tuples(st.just("reprice"), st.integers(0, top_id), st.integers(1, 5000)),
            st.tuples(st.just("abort"), st.integers(0, top_id), st.just(0)),
            st.tuples(st.just("settle"), st.just(0), st.just(0)),
            *more,
        ),
        max_size=max_size,
    )


ops = lane_ops(2, 40, max_size=120)


def add(lanes: Lanes[int], number: int, cost: int, klass: int = 0) -> None:
    lanes.add(
        f"r{number}",
        number,
        klass=klass,
        order=(number,),
        cost_tokens=cost,
    )


def admit(lanes: Lanes[int], admitted: list[Entry[int]] | None = None) -> tuple[str, Pick] | None:
    """Admit the next pick (appended to ``admitted`` when given)."""
    picked = lanes.next_pick()
    if picked is None:
        return None
    entry, pick = picked
    lanes.remove(entry.rid)
    lanes.charge(entry, pick)
    if admitted is not None:
        admitted.append(entry)
    return entry.rid, pick


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 12), st.booleans())
def test_no_request_is_overtaken_more_than_the_budget(
    operations: list, max_overtakes: int, reorder: bool
) -> None:
    """Count, for each waiting request, the younger requests of its class admitted ahead of it
    while it is presented: never more than ``max_overtakes``, whatever the costs, re-pricing,
    holds, aborts and settling do; and without reordering (or a zero budget) the admission order
    is arrival order within each class."""
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
        elif op == "settle":
            lanes.settle()
        elif op in ("park", "unpark", "reprice", "abort"):
            rid = f"r{value}"
            if rid not in waiting:
                continue
            if op == "park" and rid not in parked:
                lanes.park(rid)
                parked.add(rid)
            elif op == "abort":
                lanes.remove(rid)
                del waiting[rid]
                parked.discard(rid)
            elif op == "unpark" and rid in parked:
                lanes.unpark(rid)
                parked.discard(rid)
            elif op == "reprice":
                lanes.reprice(rid, extra)


def test_a_zero_budget_keeps_arrival_order_while_an_older_request_is_held() -> None:
    """``max_overtakes`` 0 (``spec.scheduler.maxOvertakes: 0``) is arrival order among the
    present requests, even while an older one is held: found by the property test above."""
    lanes: Lanes[int] = Lanes(max_overtakes=0)
    lanes.reorder = True
    add(lanes, 0, 10)
    lanes.park("r0")
    add(lanes, 1, 10)
    add(lanes, 2, 1)  # cheaper and younger: would go first if reordering were allowed
    assert [admit(lanes) for _ in range(2)] == [("r1", Pick.FCFS), ("r2", Pick.FCFS)]


def test_a_held_older_request_does_not_lend_its_place_to_younger_ones() -> None:
    """Found by the property test above when the count was admissions since joining less the
    requests ahead at joining: the held r0 counted as admitted ahead of r1."""
    lanes: Lanes[int] = Lanes(max_overtakes=1)
    lanes.reorder = True
    add(lanes, 0, 10)
    lanes.park("r0")
    add(lanes, 1, 10)
    add(lanes, 2, 1)
    add(lanes, 3, 1)
    # r2 may overtake r1 (budget 1); r3 may not.
    assert [rid for rid, _ in (admit(lanes) for _ in range(3))] == ["r2", "r1", "r3"]


def test_overtake_counts_stay_exact_through_holds_aborts_and_settling() -> None:
    """5,000 random arrivals, admissions, holds, aborts and settles in two classes: after each
    settle every waiting request's count equals a brute-force count of the younger requests of
    its class admitted since it joined; and the kept places stay within twice the most places a
    count needed at any settle (admissions younger than a class's oldest waiting request), plus
    the queue's length and slack, while 2,000 admissions pass."""
    rng = random.Random(7)
    lanes: Lanes[int] = Lanes(max_overtakes=50)
    lanes.reorder = True
    admitted: list[Entry[int]] = []  # in admission order
    joined_at: dict[str, int] = {}  # rid -> admissions before it joined
    count = peak = 0
    for _ in range(5_000):
        roll = rng.random()
        if roll < 0.4:
            klass = rng.randrange(2)
            add(lanes, count, rng.randint(1, 5000), klass=klass)
            joined_at[f"r{count}"] = len(admitted)
            count += 1
        elif roll < 0.8:
            admit(lanes, admitted)
        elif roll < 0.9 and len(lanes):
            entry = rng.choice(list(lanes))
            (lanes.unpark if not entry.present else lanes.park)(entry.rid)
        elif roll < 0.95 and len(lanes):
            lanes.remove(rng.choice(list(lanes)).rid)
        else:
            lanes.settle()
            for entry in lanes:
                since = admitted[joined_at[entry.rid] :]
                younger = [e for e in since if e.klass == entry.klass and e.request > entry.request]
                assert lanes.overtaken(entry) == len(younger)
            oldest = {}
            for entry in lanes:
                oldest[entry.klass] = min(oldest.get(entry.klass, count), entry.request)
            needed = sum(1 for e in admitted if e.klass in oldest and e.request > oldest[e.klass])
            peak = max(peak, needed)
            # Per class: twice the most it kept, plus its size, plus slack; two classes.
            assert lanes.admitted_places <= 2 * (2 * peak + COMPACT_SLACK) + len(lanes)
    assert len(admitted) > 1_500 and peak < 200


def test_a_put_back_request_keeps_its_count() -> None:
    """The engine pops r1 and r2 (r2 cheaper: it overtakes r0 and r1) and puts r1 back in the
    same step: r1 rejoins at its place, still overtaken once; r0's count no longer includes r1."""
    lanes: Lanes[int] = Lanes(max_overtakes=5)
    lanes.reorder = True
    add(lanes, 0, 100)
    add(lanes, 1, 50)
    add(lanes, 2, 10)
    lanes.park("r0")
    popped = []
    for _ in range(2):
        picked = lanes.next_pick()
        assert picked is not None
        lanes.remove(picked[0].rid)
        lanes.charge(*picked)
        popped.append(picked)
    assert [entry.rid for entry, _ in popped] == ["r2", "r1"]
    lanes.refund(*popped[1])
    back = lanes.add("r1", 1, klass=0, order=(1,), cost_tokens=50, stamps=popped[1][0].stamps)
    lanes.unpark("r0")
    lanes.settle()
    assert lanes.overtaken(back) == 1
    assert lanes.overtaken(lanes.get("r0")) == 1  # r2 only


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


def test_the_fcfs_bound_holds_the_aged_lane_back_until_a_request_reaches_its_fcfs_place() -> None:
    """The scenario above with ``fcfs_bound``: a 400-token request that joined behind 4,000
    queued tokens is due once 4,000 tokens were admitted (its FCFS place), not at its ratio
    bound (1,200), so forty fresh cheap requests go first; joining an empty queue, it is due at
    its ratio bound, as without the setting. The queue ahead of it was aborted after it joined:
    the place is fixed when a request joins."""

    def first_aged_pick(queued_ahead: int) -> int:
        lanes: Lanes[int] = Lanes(max_overtakes=10**6, max_response_ratio=4.0, fcfs_bound=True)
        lanes.reorder = True
        for number in range(queued_ahead):
            add(lanes, 100 + number, 400)
        add(lanes, 0, 400)
        assert lanes.due_work(lanes.get("r0")) == max(400 * queued_ahead, 1200)
        for number in range(queued_ahead):
            lanes.remove(f"r{100 + number}")
        picks = []
        for number in range(1, 60):
            add(lanes, number, 100)
            picks.append(admit(lanes))
        first = picks.index(("r0", Pick.AGED))
        assert all(pick == (f"r{i + 1}", Pick.CACHE) for i, pick in enumerate(picks[:first]))
        return first

    assert first_aged_pick(queued_ahead=10) == 40
    assert first_aged_pick(queued_ahead=0) == 12


def test_with_the_fcfs_bound_the_earliest_due_request_goes_first_not_the_oldest() -> None:
    """An old 1,000-token request is due at its ratio bound (7,000 tokens); a younger held
    100-token one at its FCFS place (1,000). Once 1,000 tokens of fresh cheap requests were
    admitted and the held one is presented again, it goes first, from the aged lane."""
    lanes: Lanes[int] = Lanes(max_overtakes=10**6, max_response_ratio=8.0, fcfs_bound=True)
    lanes.reorder = True
    add(lanes, 0, 1000)
    add(lanes, 1, 100)
    lanes.park("r1")
    for number in range(2, 22):
        add(lanes, number, 50)
    assert [admit(lanes) for _ in range(20)] == [(f"r{n}", Pick.CACHE) for n in range(2, 22)]
    add(lanes, 22, 50)
    lanes.unpark("r1")
    assert admit(lanes) == ("r1", Pick.AGED)
    assert admit(lanes) == ("r22", Pick.CACHE)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, 5000)),
            st.tuples(st.just("admit"), st.just(0)),
            st.tuples(st.just("reprice"), st.integers(1, 5000)),
            st.tuples(st.just("park"), st.just(0)),
            st.tuples(st.just("unpark"), st.just(0)),
        ),
        max_size=150,
    ),
    st.sampled_from([1.0, 2.0, 8.0]),
    st.randoms(use_true_random=False),
)
def test_with_the_fcfs_bound_a_due_request_goes_before_any_request_that_is_not(
    operations: list, max_response_ratio: float, rng: random.Random
) -> None:
    """Whatever the arrivals, costs, re-pricing and holds: while some presented request's due
    point (the later of its response-ratio bound and its FCFS place) has been reached, the pick
    is the aged lane's request with the earliest due point; otherwise the cache lane's cheapest.
    So no request is kept past its due point by a request that is not due."""
    lanes: Lanes[int] = Lanes(
        max_overtakes=10**6, max_response_ratio=max_response_ratio, fcfs_bound=True
    )
    lanes.reorder = True
    count = 0
    for op, value in operations:
        present = [e for e in lanes if e.present]
        if op == "add":
            add(lanes, count, value)
            count += 1
        elif op == "admit" and present:
            due = [e for e in present if lanes.work_tokens >= lanes.due_work(e)]
            picked = lanes.next_pick()
            assert picked is not None
            entry, pick = picked
            if due:
                assert pick is Pick.AGED
                assert lanes.due_work(entry) == min(lanes.due_work(e) for e in due)
            else:
                assert pick in (Pick.CACHE, Pick.FCFS)
                assert entry.cost_tokens == min(e.cost_tokens for e in present)
            lanes.remove(entry.rid)
            lanes.charge(entry, pick)
        elif op == "reprice" and present:
            lanes.reprice(rng.choice(present).rid, value)
        elif op == "park" and present:
            lanes.park(rng.choice(present).rid)
        elif op == "unpark":
            held = [e for e in lanes if not e.present]
            if held:
                lanes.unpark(rng.choice(held).rid)
        lanes.check_invariants()


def test_a_cache_share_splits_the_work_with_the_aged_lane_once_it_is_due() -> None:
    """The scenario above with ``cache_share`` 0.5: cheap requests first until the expensive
    ones are over the bound, then the cache lane's head and the aged lane's best take turns by
    tokens: one 400-token aged pick pays for four 100-token share picks."""
    lanes: Lanes[int] = Lanes(max_overtakes=1000, max_response_ratio=4.0, cache_share=0.5)
    lanes.reorder = True
    for number in range(10):
        add(lanes, number, 400)  # expensive requests, oldest
    picks = []
    for number in range(10, 70):
        add(lanes, number, 100)  # a fresh cheap request arrives before each admission
        picks.append(admit(lanes))
    assert all(pick == (f"r{i + 10}", Pick.CACHE) for i, pick in enumerate(picks[:12]))
    # From the 13th pick on the aged lane is due: the share goes first (its counter starts at
    # 0), then each aged pick's 200-token credit pays for four share picks of 50.
    contested = [lane for _, lane in picks[12 : picks.index(("r9", Pick.AGED)) + 1]]
    assert contested[:7] == [Pick.SHARE, Pick.AGED] + [Pick.SHARE] * 4 + [Pick.AGED]
    counts = Counter(contested)
    assert counts == {Pick.AGED: 10, Pick.SHARE: 37}  # all ten expensive ones served meanwhile
    assert abs(100 * counts[Pick.SHARE] - 400 * counts[Pick.AGED]) <= 400


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([0.25, 0.5, 0.75]),
    st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5000)), min_size=1, max_size=150),
)
def test_the_cache_lane_never_takes_more_than_its_share_while_the_aged_lane_is_due(
    share: float, arrivals: list[tuple[int, int]]
) -> None:
    """With every request over the bound (ratio bound 1), whatever the costs and the mix of
    arrivals and admissions: the share picks' tokens never exceed share / (1 - share) of the
    aged picks' plus one request's cost, at every point of the run, and no pick comes from the
    plain cache or FCFS lanes."""
    lanes: Lanes[int] = Lanes(max_overtakes=10**6, max_response_ratio=1.0, cache_share=share)
    lanes.reorder = True
    tokens: Counter[Pick] = Counter()
    number = largest = 0
    for arrivals_now, cost in arrivals:
        for _ in range(arrivals_now):
            add(lanes, number, cost + number % 7)
            largest = max(largest, cost + number % 7)
            number += 1
        picked = lanes.next_pick()
        assert picked is not None
        entry, pick = picked
        lanes.remove(entry.rid)
        lanes.charge(entry, pick)
        assert pick in (Pick.AGED, Pick.SHARE)
        tokens[pick] += entry.cost_tokens
        # The counter is >= 0 before a share pick, which takes off at most (1 - share) x the
        # largest cost; cut credits only lower it.
        assert (1 - share) * tokens[Pick.SHARE] <= share * tokens[Pick.AGED] + (1 - share) * largest


def test_without_pressure_the_order_is_vllms() -> None:
    lanes: Lanes[int] = Lanes()
    lanes.reorder = False
    for number, cost in enumerate([5000, 10, 3000, 1]):
        add(lanes, number, cost)
    lanes.add("back", -1, klass=0, order=(), cost_tokens=7, resume=True)
    assert [admit(lanes) for _ in range(5)] == [
        ("back", Pick.RESUME),
        ("r0", Pick.FCFS),
        ("r1", Pick.FCFS),
        ("r2", Pick.FCFS),
        ("r3", Pick.FCFS),
    ]


history_ops = lane_ops(
    1,
    60,
    st.tuples(st.just("reorder"), st.booleans(), st.just(0)),
    st.tuples(st.just("resume"), st.integers(1, 5000), st.just(0)),
    st.tuples(st.just("rejoin"), st.integers(0, 60), st.integers(1, 5000)),
    max_size=200,
)


def fresh_copy(lanes: Lanes[int], admitted: list[Entry[int]]) -> Lanes[int]:
    """The same waiting requests, places, costs and holds in new lanes that were charged for
    every admission in ``admitted`` and never settled: heaps with no history (no stale items,
    cost lanes never paused) and every admitted place kept."""
    copy: Lanes[int] = Lanes(
        max_overtakes=lanes.max_overtakes,
        max_response_ratio=lanes.max_response_ratio,
        fcfs_bound=lanes.fcfs_bound,
    )
    copy.reorder = lanes.reorder
    for entry in admitted:
        copy.charge(entry, Pick.FCFS)  # no cache share here: the lane of a pick moves nothing
    for entry in lanes:
        copy.add(
            entry.rid,
            entry.request,
            klass=entry.klass,
            order=entry.order,
            cost_tokens=entry.cost_tokens,
            resume=entry.resume,
            stamps=entry.stamps,
        )
        if not entry.present:
            copy.park(entry.rid)
    return copy


@settings(max_examples=300, deadline=None)
@given(history_ops, st.booleans())
def test_history_never_changes_a_pick_and_heaps_stay_bounded(
    operations: list, fcfs_bound: bool
) -> None:
    """Lanes (with and without the FCFS bound) that lived through re-pricing, holds, admissions,
    aborts, settling and pressure switching on and off (stale heap items, cost lanes dropped and
    rebuilt, compactions, admitted places dropped) pick and plan exactly as fresh lanes holding
    the same requests; and their heaps never hold more than the compaction bound (every current
    item plus ``COMPACT_FACTOR`` stale ones per current one, plus slack)."""
    lanes: Lanes[int] = Lanes(max_overtakes=6, max_response_ratio=3.0, fcfs_bound=fcfs_bound)
    lanes.reorder = False
    admitted: list[Entry[int]] = []
    count = 0
    for op, value, extra in operations:
        rid = f"r{value}"
        if op == "add":
            add(lanes, count, value, klass=extra)
            count += 1
        elif op == "resume":
            lanes.add(
                f"b{count}",
                count,
                klass=0,
                order=(),
                cost_tokens=value,
                resume=True,
            )
            count += 1
        elif op == "admit":
            admit(lanes, admitted)
        elif op == "reorder":
            lanes.reorder = value
        elif op == "settle":
            lanes.settle()
        elif op == "rejoin" and rid in lanes:  # preempted: back under its id, as a new arrival
            lanes.remove(rid)
            lanes.add(rid, value, klass=0, order=(count,), cost_tokens=extra)
            count += 1
        elif rid in lanes:
            if op == "park":
                lanes.park(rid)
            elif op == "unpark":
                lanes.unpark(rid)
            elif op == "reprice":
                lanes.reprice(rid, extra)
            elif op == "abort":
                lanes.remove(rid)
        lanes.check_invariants()
        assert lanes.heap_items <= (COMPACT_FACTOR + 1) * 3 * len(lanes) + COMPACT_SLACK
        expected = fresh_copy(lanes, admitted)
        got, want = lanes.next_pick(), expected.next_pick()
        assert (got and (got[0].rid, got[1])) == (want and (want[0].rid, want[1]))
        assert [e.rid for e in lanes.plan(5)] == [e.rid for e in expected.plan(5)]


def test_heaps_stay_bounded_when_nothing_reads_the_cost_lanes() -> None:
    """An engine without cache pressure never pops the cost lanes: 20,000 arrivals, each
    re-priced once and admitted, leave the heaps about as large as the queue."""
    lanes: Lanes[int] = Lanes()
    lanes.reorder = False
    for number in range(20_000):
        add(lanes, number, 100 + number % 700)
        lanes.reprice(f"r{number}", 50)
        if number >= 100:
            admit(lanes)
    assert len(lanes) == 100
    # Without pressure only the FCFS lane is kept (plus the last admitted request's item).
    assert lanes.heap_items == len(lanes) + 1
    lanes.reorder = True  # pressure: the cost lanes are built from the 100 waiting requests
    picked = admit(lanes)  # all cost 50: the oldest has waited longest
    assert picked is not None and picked[0] == "r19900"
    assert lanes.heap_items <= 3 * (len(lanes) + 1)  # the admitted one left stale items


def test_heaps_stay_bounded_under_pressure_while_requests_are_re_priced() -> None:
    """Under pressure every re-pricing leaves a stale item deep in the cost lanes, where no
    admission reaches it: compaction keeps 100 requests re-priced 200 times each within the
    bound."""
    lanes: Lanes[int] = Lanes()
    lanes.reorder = True
    for number in range(100):
        add(lanes, number, 5000)
    for round_ in range(200):
        assert lanes.next_pick() is not None  # a step looks at the lanes' heads
        for number in range(100):
            cost = 5000 - round_ * 20 - number % 7
            lanes.reprice(f"r{number}", cost)
        assert lanes.heap_items <= (COMPACT_FACTOR + 1) * 3 * len(lanes) + COMPACT_SLACK
    picked = admit(lanes)
    assert picked == ("r6", Pick.CACHE)  # the cheapest after the last re-pricing


def tracked_state(lanes: Lanes[int]) -> Counter[str]:
    """Type names of the objects the garbage collector tracks among those the lanes hold
    through their containers (the lanes object itself left out)."""
    seen = {id(lanes)}
    found: Counter[str] = Counter()
    todo = [o for o in gc.get_referents(lanes) if isinstance(o, dict)]  # its attributes
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not gc.is_tracked(obj):
            continue
        seen.add(id(obj))
        found[type(obj).__name__] += 1
        if isinstance(obj, dict | list | set | tuple | Entry) or type(obj).__name__ == "_Class":
            todo.extend(gc.get_referents(obj))
    return found


def test_a_waiting_request_costs_the_collector_one_tracked_object() -> None:
    """Full collections come sooner the more long-lived objects are tracked, and every one
    walks them all: with or without the cost lanes, once collected, the only objects the
    lanes keep per waiting request that the collector still tracks are the entries (places,
    heap items and cache keys are plain tuples, which it stops tracking)."""
    for reorder in (False, True):
        lanes: Lanes[int] = Lanes()
        lanes.reorder = reorder
        for number in range(500):
            add(lanes, number, 100 + number % 300)
        lanes.reprice("r7", 50)
        assert lanes.plan(3)  # builds the cost lanes under pressure
        gc.collect()
        per_request = {name: n for name, n in tracked_state(lanes).items() if n >= 100}
        assert per_request == {"Entry": 500}


def test_a_request_that_rejoins_under_its_id_takes_its_new_place() -> None:
    """A preempted request rejoins under the same id as a new arrival: the items of its first
    stay (its old place, its old cost) must not describe it again."""
    for reorder in (False, True):
        lanes: Lanes[int] = Lanes()
        lanes.reorder = reorder
        add(lanes, 1, 100)
        add(lanes, 2, 100)
        assert lanes.plan(2)[0].rid == "r1"  # builds the cost lanes under pressure
        lanes.remove("r1")
        lanes.add("r1", 1, klass=0, order=(3,), cost_tokens=100)
        assert [e.rid for e in lanes.plan(3)] == ["r2", "r1"]
        assert admit(lanes) == ("r2", Pick.FCFS)


def test_cache_keys_are_taken_only_when_the_cost_lanes_need_them() -> None:
    """Without pressure no cache key is computed; building the cost lanes takes every waiting
    request's key then, from the state of that moment; a join or a re-pricing while they are
    built takes one key at once; pressure ending forgets the keys, so the next build takes
    fresh ones."""
    unlocked = dict.fromkeys(("r0", "r1", "r2", "r3", "r4"), 0)
    calls: list[str] = []

    def key(entry: Entry[int]) -> tuple[int, int]:
        calls.append(entry.rid)
        return entry.cost_tokens, -unlocked[entry.rid]

    lanes: Lanes[int] = Lanes(cache_key=key)
    lanes.reorder = False
    for number in range(4):
        add(lanes, number, 100)
    lanes.reprice("r1", 90)
    assert calls == []
    lanes.reorder = True
    assert admit(lanes) == ("r1", Pick.CACHE)  # the build took all four keys
    assert sorted(calls) == ["r0", "r1", "r2", "r3"]
    calls.clear()
    add(lanes, 4, 100)
    lanes.reprice("r2", 95)
    assert calls == ["r4", "r2"]
    assert admit(lanes) == ("r2", Pick.CACHE)
    lanes.reorder = False
    unlocked["r3"] = 1_000  # r3 now unlocks the most: only a fresh key shows it
    lanes.reorder = True
    assert admit(lanes) == ("r3", Pick.CACHE)
