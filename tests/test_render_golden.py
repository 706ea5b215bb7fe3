"""Golden files: the rendered engine Deployment of each example, byte for byte.

A change to the templates or the API shows up here as a diff to review. After an intended
change, regenerate with: PREFIXSERVING_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_render_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from render_examples import find, rendered, resource_examples

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("PREFIXSERVING_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("name", resource_examples())
def test_engine_deployment_matches_golden(name: str) -> None:
    deployment = find(rendered(name), "Deployment", "engine")
    text = yaml.safe_dump(deployment, sort_keys=False, width=1000)
    path = GOLDEN / f"{name}.engine-deployment.yaml"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with PREFIXSERVING_UPDATE_GOLDEN=1"
    assert text == path.read_text(), (
        f"{path.name} differs; if intended, regenerate (see module doc)"
    )


def test_every_golden_file_belongs_to_an_example() -> None:
    expected = {f"{name}.engine-deployment.yaml" for name in resource_examples()}
    assert {p.name for p in GOLDEN.glob("*.yaml")} == expected
