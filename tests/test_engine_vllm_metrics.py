"""PEEK's Prometheus metrics: the engine process's snapshot file, and the collector the
``vllm.general_plugins`` entry point registers in the API server process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.test_engine_vllm_scheduler import make_request, shared_prompt

from prefixserving.engine.vllm import PeekScheduler
from prefixserving.peek.metrics import ENV_METRICS_FILE, SnapshotCollector
from prefixserving_lab.models.replay_engine import EngineShape, build_scheduler
from prefixserving_lab.runners.replay import fabricate_output

pytestmark = pytest.mark.slow  # imports vLLM


def samples(families: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in families:  # type: ignore[attr-defined]
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def step(scheduler: PeekScheduler) -> int:
    """One engine step; returns the waiting requests vLLM counted for its gauges."""
    output = scheduler.schedule()
    outputs = scheduler.update_from_output(output, fabricate_output(output, scheduler))
    (stats,) = [o.scheduler_stats for o in outputs.values() if o.scheduler_stats is not None]
    return stats.num_waiting_reqs


def test_scheduler_writes_a_snapshot_the_collector_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "peek.prom"
    monkeypatch.setenv(ENV_METRICS_FILE, str(base))
    shape = EngineShape(num_blocks=400, block_size=128, long_prefill_token_threshold=512)
    scheduler = build_scheduler(PeekScheduler, shape)
    step(scheduler)  # empty step: first snapshot
    # From here on only a change in held siblings makes the scheduler write (no timer).
    scheduler._metrics_writer.interval_s = float("inf")
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", shared_prompt(i), arrival=i))
    # The snapshot is written where vLLM counts the step's waiting requests for its gauges:
    # the three held siblings are in both.
    assert step(scheduler) == 3
    assert scheduler.waiting.num_held == 3
    assert Path(f"{base}.0").exists()
    values = samples(SnapshotCollector(str(base)).collect())
    labels = (("engine", "0"), ("model_name", scheduler.vllm_config.model_config.served_model_name))
    assert values[("prefixserving:peek_held_siblings", labels)] == 3
    assert values[("prefixserving:peek_sibling_holds_total", labels)] == 3
    assert values[("prefixserving:peek_pinned_blocks", labels)] == 0
    admitted = sum(
        value
        for (name, sample_labels), value in values.items()
        if name == "prefixserving:peek_admitted_total"
    )
    assert admitted == 1
    info = (*labels, ("base", "Scheduler"), ("fallback", ""))
    assert values[("prefixserving:peek_info", tuple(sorted(info)))] == 1
    # The siblings' uncached full blocks are the pioneer's, being computed: none left over.
    assert values[("prefixserving:peek_uncached_waiting_tokens", labels)] == 0
    # The pioneer's chunks run; at the step its siblings are admitted both counts drop.
    for _ in range(20):
        waiting = step(scheduler)
        held = samples(SnapshotCollector(str(base)).collect())
        assert held[("prefixserving:peek_held_siblings", labels)] == scheduler.waiting.num_held
        if not scheduler.waiting.num_held:
            break
    assert scheduler.waiting.num_held == 0 and waiting == 0
    scheduler.shutdown()
    assert not Path(f"{base}.0").exists()
    assert list(SnapshotCollector(str(base)).collect()) == []


def test_plugin_registers_the_collector_in_the_default_registry(tmp_path: Path) -> None:
    """Run the entry point as vLLM's API server would, in a fresh process."""
    script = textwrap.dedent(
        f"""
        import os
        os.environ.pop({ENV_METRICS_FILE!r}, None)
        os.environ["TMPDIR"] = {str(tmp_path)!r}
        import tempfile
        tempfile.tempdir = None
        from prometheus_client import REGISTRY, generate_latest
        from prefixserving.peek.metrics import PeekSnapshot, SnapshotWriter, register
        register()  # not an API server: picks no path
        assert {ENV_METRICS_FILE!r} not in os.environ
        import vllm.entrypoints.openai.api_server  # what vLLM's API server has loaded
        register()
        register()  # idempotent: vLLM may load plugins more than once
        path = os.environ[{ENV_METRICS_FILE!r}]
        assert path.startswith({str(tmp_path)!r}), path
        snap = PeekSnapshot(
            "AsyncScheduler", "", 2, 5, 4096, {{"cache": 3, "fcfs": 1}}, {{"cache": 300}}, 7, 1, 0
        )
        SnapshotWriter(path, "0", "m").write(snap)
        SnapshotWriter(path, "1", "m").write(snap)
        print(generate_latest(REGISTRY).decode())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    held = families["prefixserving:peek_held_siblings"]
    assert sorted(s.labels["engine"] for s in held.samples) == ["0", "1"]
    assert {s.value for s in held.samples} == {2.0}
    admitted = families["prefixserving:peek_admitted"]
    assert {(s.labels["engine"], s.labels["lane"], s.value) for s in admitted.samples} == {
        (engine, lane, value) for engine in "01" for lane, value in (("cache", 3.0), ("fcfs", 1.0))
    }
    bases = {s.labels["base"] for s in families["prefixserving:peek_info"].samples}
    assert bases == {"AsyncScheduler"}
    # Exposition stays valid: one HELP/TYPE per family although two engines wrote files.
    assert result.stdout.count("# TYPE prefixserving:peek_held_siblings ") == 1


def test_snapshot_of_a_dead_engine_is_not_exported(tmp_path: Path) -> None:
    base = tmp_path / "peek.prom"
    live = (
        "# TYPE prefixserving:peek_held_siblings gauge\n"
        'prefixserving:peek_held_siblings{engine="0",model_name="m"} 3.0\n'
    )
    Path(f"{base}.0").write_text(f"# pid {os.getpid()}\n{live}")
    Path(f"{base}.1").write_text("# pid 2147483646\n" + live.replace('"0"', '"1"'))
    values = samples(SnapshotCollector(str(base)).collect())
    assert list(values) == [
        ("prefixserving:peek_held_siblings", (("engine", "0"), ("model_name", "m")))
    ]
