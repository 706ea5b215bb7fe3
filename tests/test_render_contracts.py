"""The rendered command lines are accepted by the programs that run them: vLLM's own argument
parser (engine), ``prefixserving router`` and ``prefixserving warmup`` (sidecar)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from render_examples import find, rendered, resource_examples

# Parses each argument list of stdin (JSON) with the parser of ``vllm serve``; prints the
# fields the operator relies on. ``vllm serve MODEL`` takes the model as a positional; the
# parser here takes it as --model.
PARSE_WITH_VLLM = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for args in json.load(sys.stdin):
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", args[0], *args[1:]])
    out.append({
        "model": ns.model, "served": ns.served_model_name, "port": ns.port,
        "tp": ns.tensor_parallel_size, "block_size": ns.block_size,
        "prefix_caching": ns.enable_prefix_caching, "scheduler_cls": ns.scheduler_cls,
        "numa_bind": ns.numa_bind, "loras": [m.name for m in ns.lora_modules or []],
    })
print(json.dumps(out))
"""


def engine_container(name: str) -> dict:
    (container,) = find(rendered(name), "Deployment", "engine")["spec"]["template"]["spec"][
        "containers"
    ]
    return container


def engine_args(name: str) -> list[str]:
    container = engine_container(name)
    assert container["command"] == ["vllm", "serve"]
    return container["args"]


@pytest.mark.parametrize("name", resource_examples())
def test_peek_scheduler_accepts_the_rendered_settings(name: str) -> None:
    """PeekScheduler reads the engine's PREFIXSERVING_* environment exactly as rendered."""
    from prefixserving.peek.settings import PeekSettings
    from render_examples import load

    env = {e["name"]: e["value"] for e in engine_container(name).get("env", []) if "value" in e}
    settings = PeekSettings.from_env(env)
    scheduler = load(name)[0].spec.scheduler
    if scheduler.policy == "peek":
        assert settings.max_sibling_wait_ms == scheduler.max_sibling_wait_ms
        assert settings.pin_budget_fraction == scheduler.pin_budget_fraction
        assert settings.lanes is scheduler.lanes
        assert settings.max_overtakes == scheduler.max_overtakes
        assert settings.decode_reserve_blocks == scheduler.decode_reserve_blocks


def test_spec_scheduler_defaults_are_the_engines_own() -> None:
    """An engine started without the operator schedules like the default spec renders it."""
    from prefixserving.api.types import SchedulerSpec
    from prefixserving.peek.settings import PeekSettings

    spec, engine = SchedulerSpec(), PeekSettings()
    assert spec.max_sibling_wait_ms == engine.max_sibling_wait_ms
    assert spec.pin_budget_fraction == engine.pin_budget_fraction
    assert spec.lanes is engine.lanes
    assert spec.max_overtakes == engine.max_overtakes
    assert spec.decode_reserve_blocks == engine.decode_reserve_blocks


@pytest.mark.slow  # imports vLLM in a subprocess (tens of seconds on two cores)
def test_vllm_accepts_the_engine_arguments_of_every_example() -> None:
    from render_examples import load

    names = resource_examples()
    result = subprocess.run(
        [sys.executable, "-c", PARSE_WITH_VLLM],
        input=json.dumps([engine_args(n) for n in names]),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = dict(zip(names, json.loads(result.stdout.strip().splitlines()[-1]), strict=True))
    for name, ns in parsed.items():
        spec = load(name)[0].spec
        assert ns["served"] == [spec.model.served_name]
        assert ns["port"] == 8000 and ns["prefix_caching"] is True
        assert ns["tp"] == spec.engine.tensor_parallel_size
        assert ns["block_size"] == spec.engine.block_size
        assert ns["numa_bind"] is (spec.placement.numa == "aligned")
        assert ns["loras"] == [a.name for a in spec.model.adapters]
        peek = spec.scheduler.policy == "peek"
        assert (ns["scheduler_cls"] == "prefixserving.engine.vllm.PeekScheduler") is peek


@pytest.mark.parametrize("name", resource_examples())
def test_router_command_accepts_the_router_arguments(name: str) -> None:
    from prefixserving.router.cli import router

    deployment = find(rendered(name), "Deployment", "router")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["prefixserving", "router"]
    with router.make_context("router", list(container["args"])) as ctx:
        assert ctx.params["port"] == 8080


def test_warmup_command_accepts_the_sidecar_arguments() -> None:
    from prefixserving.warmup.cli import warmup

    pod = find(rendered("warmup"), "Deployment", "engine")["spec"]["template"]["spec"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["command"] == ["prefixserving", "warmup"]
    with warmup.make_context("warmup", list(sidecar["args"])) as ctx:
        assert ctx.params["hot_prefixes"] == 64
        assert ctx.params["timeout_s"] == 300
