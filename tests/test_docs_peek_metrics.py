"""docs/peek.md's metric table names exactly the series PEEK's snapshot exports (read from
``prefixserving.peek.metrics``), with their labels."""

from __future__ import annotations

import re

from conftest import ROOT
from prefixserving.peek.lanes import Pick
from prefixserving.peek.metrics import LABELS, PREFIX, PeekSnapshot, snapshot_families

DOC = ROOT / "docs" / "peek.md"
ROW = re.compile(r"^\| `(" + re.escape(PREFIX) + r"\w+)(?:\{([^}]*)\})?` \| (gauge|counter) \|")


def exported() -> dict[str, tuple[str, set[str]]]:
    """Series name -> (type, labels beyond ``engine`` and ``model_name``)."""
    per_lane = {pick.value: 1 for pick in Pick}
    snapshot = PeekSnapshot(
        base="Scheduler",
        fallback="",
        held_siblings=0,
        pinned_blocks=0,
        uncached_waiting_tokens=0,
        admitted=per_lane,
        admitted_tokens=per_lane,
        sibling_holds=0,
        pressure_steps=0,
        headroom_stops=0,
    )
    found: dict[str, tuple[str, set[str]]] = {}
    for family in snapshot_families(snapshot, "0", "m"):
        for sample in family.samples:
            extra = set(sample.labels) - set(LABELS)
            found[sample.name] = (family.type, extra)
    return found


def documented() -> dict[str, tuple[str, set[str]]]:
    found = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            name, labels, kind = match.groups()
            keys = {part.split("=")[0].strip() for part in (labels or "").split(",") if part}
            found[name] = (kind, keys)
    return found


def test_peek_md_lists_every_exported_series_and_nothing_else() -> None:
    assert documented() == exported(), "update the table under '## Metrics' in docs/peek.md"


def test_the_lane_label_lists_every_lane() -> None:
    (row,) = [line for line in DOC.read_text().splitlines() if "peek_admitted_total{" in line]
    assert sorted(re.findall(r'"(\w+)"', row)) == sorted(pick.value for pick in Pick)
