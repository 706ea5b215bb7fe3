"""docs/reference/ is generated from the CRDs and must not drift from them."""

from __future__ import annotations

from pathlib import Path

from prefixserving.api.reference import pages

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference"


def test_reference_pages_match_the_crds() -> None:
    generated = pages()
    assert sorted(generated) == sorted(p.name for p in REFERENCE.glob("*.md"))
    for name, text in generated.items():
        assert (REFERENCE / name).read_text() == text, (
            f"docs/reference/{name} is stale: run `make docs`"
        )


def test_reference_lists_every_spec_field_with_a_description() -> None:
    text = pages()["prefixserving.md"]
    for field in (
        "servedName",
        "tensorParallelSize",
        "maxSiblingWaitMs",
        "pinBudgetFraction",
        "sizeLimit",
        "minReplicas",
        "hotPrefixes",
        "observedGeneration",
    ):
        assert f"| `{field}` |" in text, field
    for line in text.splitlines():
        if line.startswith("| `"):
            assert not line.rstrip().endswith("|  |"), f"field without a description: {line}"
