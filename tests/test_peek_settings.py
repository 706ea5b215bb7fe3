"""PEEK's settings from the engine's environment: each variable read, bad values refused with
the variable's name and an example."""

from __future__ import annotations

import pytest

from prefixserving import constants
from prefixserving.peek.lanes import MAX_RESPONSE_RATIO
from prefixserving.peek.settings import PeekSettings


def test_the_response_ratio_bound_defaults_to_the_lanes_and_reads_its_variable() -> None:
    assert PeekSettings.from_env({}).max_response_ratio == MAX_RESPONSE_RATIO
    env = {constants.ENV_MAX_RESPONSE_RATIO: "16"}
    assert PeekSettings.from_env(env).max_response_ratio == 16.0


@pytest.mark.parametrize(("raw", "message"), [("many", "is not a number"), ("0.5", "must be >= 1")])
def test_a_bad_response_ratio_names_the_variable(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        PeekSettings.from_env({constants.ENV_MAX_RESPONSE_RATIO: raw})
    assert constants.ENV_MAX_RESPONSE_RATIO in str(caught.value)
