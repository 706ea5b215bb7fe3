"""Defaults live on the models (``api/defaults.py`` is their one owner), and every CRD
description that names a default is written from it."""

from __future__ import annotations

import importlib.util
import types
from types import ModuleType

import pytest
from pydantic import BaseModel

import prefixserving.api
from prefixserving.api import defaults
from prefixserving.api import types as api_types
from prefixserving.api.fields import with_default
from prefixserving.api.types import PrefixServingSpec


def spec(**autoscaling: object) -> PrefixServingSpec:
    return PrefixServingSpec.model_validate(
        {
            "model": {"servedName": "m", "source": {"pvc": {"claimName": "w"}}},
            "autoscaling": autoscaling,
        }
    )


def test_model_defaults_come_from_the_defaults_module() -> None:
    s = spec()
    assert s.engine.block_size == defaults.BLOCK_SIZE
    assert s.engine.image == defaults.ENGINE_IMAGE
    assert s.scheduler.policy == defaults.SCHEDULER_POLICY
    assert s.placement.shm.size_limit == defaults.SHM_SIZE_LIMIT
    assert s.router.algorithm == defaults.ROUTER_ALGORITHM
    assert s.warmup.timeout_seconds == defaults.WARMUP_TIMEOUT_S
    assert s.monitoring.alerts.kv_saturation_threshold == defaults.KV_SATURATION_THRESHOLD
    assert s.replicas is None  # resolved at render time, so autoscaling can own it


def _other(value: object) -> object:
    """A value of the same kind that differs from ``value`` in its text."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7919
    if isinstance(value, float):
        return value + 0.125
    if isinstance(value, str):
        return value + "-changed"
    if isinstance(value, tuple):
        return (*value, "changed")
    return value


def _descriptions(module: ModuleType) -> dict[str, str]:
    """``Model.field`` -> description of every field of every model in ``module``."""
    return {
        f"{model.__name__}.{name}": info.description or ""
        for model in vars(module).values()
        if isinstance(model, type) and issubclass(model, BaseModel)
        for name, info in model.model_fields.items()
    }


def test_descriptions_that_name_a_default_are_written_from_the_defaults_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Load the spec models again with every default changed: a description that mentions a
    default must change with it (a default typed into the text would not)."""
    changed = types.SimpleNamespace(
        **{k: _other(v) for k, v in vars(defaults).items() if k.isupper()}
    )
    monkeypatch.setattr(prefixserving.api, "defaults", changed)
    spec = importlib.util.find_spec("prefixserving.api.types")
    assert spec is not None and spec.loader is not None
    reloaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reloaded)
    before, after = _descriptions(api_types), _descriptions(reloaded)
    mentions = {field for field, text in before.items() if "default" in text.lower()}
    assert mentions, "no description names a default: the check would be empty"
    stale = sorted(field for field in mentions if before[field] == after[field])
    assert stale == [], f"descriptions with a hand-typed default (use fields.with_default): {stale}"


def test_with_default_writes_sequences_and_floats_plainly() -> None:
    assert with_default("Signals", ("a", "b")) == "Signals (default a, b)."
    assert with_default("Depth", 5.0) == "Depth (default 5)."
    assert with_default("Cpu", "8") == "Cpu (default 8)."
