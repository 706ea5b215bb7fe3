"""Callgrind counts of a marked region: parsing, the cycle model, and real runs that agree."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from prefixserving_lab.runners import callgrind

OUTPUT = """\
# callgrind format
version: 1
cmd:  python prog.py
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
summary: 0
totals: 1000 300 200 10 20 30 1 2 3
"""


def test_counts_are_read_from_the_totals_line() -> None:
    counts = callgrind.Counts.from_output(OUTPUT)
    assert (counts.ir, counts.dr, counts.dw) == (1000, 300, 200)
    assert (counts.i1_misses, counts.d1_read_misses, counts.d1_write_misses) == (10, 20, 30)
    assert counts.ll_read_misses == 2


def test_estimated_cycles_price_each_cache_level() -> None:
    counts = callgrind.Counts.from_output(OUTPUT)
    # 1,500 accesses: 60 miss L1, 6 of them miss LL too.
    assert counts.estimated_cycles == (1500 - 60) + 5 * (60 - 6) + 35 * 6


@pytest.mark.parametrize(
    "text",
    ["events: Ir\n", "events: Ir Dr\ntotals: 5\n", "events: Ir\ntotals: 5\n"],
    ids=["no totals", "short totals", "no cache simulation"],
)
def test_output_without_cache_totals_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        callgrind.Counts.from_output(text)


def test_markers_do_nothing_outside_callgrind() -> None:
    marks = callgrind.markers(env={})
    assert not marks.active
    marks.instrument()
    marks.start()
    marks.stop()


PROGRAM = textwrap.dedent(
    """\
    import sys
    from prefixserving_lab.runners import callgrind

    def work(n):
        return sum(i * i for i in range(n))

    marks = callgrind.markers()
    marks.instrument()
    work(1000)  # warm-up: not counted
    marks.start()
    work(int(sys.argv[1]))
    marks.stop()
    work(100_000)  # after the region: not counted
    """
)


@pytest.mark.slow  # starts valgrind
@pytest.mark.skipif(callgrind.unavailable() is not None, reason=str(callgrind.unavailable()))
def test_a_marked_region_counts_about_the_same_on_every_run(tmp_path: Path) -> None:
    program = tmp_path / "work.py"
    program.write_text(PROGRAM)
    env = {"PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin"}
    small, again = (callgrind.count([sys.executable, str(program), "20000"], env) for _ in "ab")
    large = callgrind.count([sys.executable, str(program), "40000"], env)
    # The region's edges are exact (client requests), but what ran before it leaves the allocator
    # in a slightly different state (a fresh clone's first run writes the bytecode caches the
    # next one reads): 30 instructions of 12.3 M apart was seen.
    assert abs(again.ir - small.ir) <= 1e-4 * small.ir
    assert abs(again.estimated_cycles - small.estimated_cycles) <= 1e-3 * small.estimated_cycles
    # Twice the loop, about twice the count: the region holds the loop and nothing else.
    assert 1.9 < large.ir / small.ir < 2.1
    assert large.estimated_cycles > large.ir
