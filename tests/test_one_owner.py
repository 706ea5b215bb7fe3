"""Facts the components share are typed once, in ``prefixserving.constants``, and imported
everywhere else: the router's load bound and the warm-up sidecar's metric names (the sidecar
exports them; the alerts and the dashboard query them)."""

from __future__ import annotations

import ast
from pathlib import Path

from prefixserving import constants
from prefixserving.api import defaults
from prefixserving.router.cli import RouterSettings
from prefixserving.router.policies.load import AffinityLoadParams
from prefixserving.warmup.state import WarmupState

PACKAGE = Path(constants.__file__).parent
OWNER = Path(constants.__file__)


def literals(predicate: object) -> list[str]:
    """``file:line`` of every constant in the package, outside ``constants.py``, for which
    ``predicate(value)`` holds."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == OWNER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and predicate(node.value):  # type: ignore[operator]
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_the_router_load_bound_is_typed_once() -> None:
    assert literals(lambda v: isinstance(v, float) and v == constants.ROUTER_LOAD_BOUND) == []
    assert defaults.ROUTER_LOAD_BOUND == RouterSettings().load_bound == constants.ROUTER_LOAD_BOUND
    assert AffinityLoadParams().load_bound == constants.ROUTER_LOAD_BOUND


def test_warmup_metric_names_are_typed_once() -> None:
    assert literals(lambda v: isinstance(v, str) and v.startswith("prefixserving_warmup")) == []
    names = {
        value
        for name, value in vars(constants).items()
        if name.startswith("METRIC_WARMUP_") and isinstance(value, str)
    }
    exported = {
        sample.name
        for family in WarmupState().registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }
    assert names == exported
