"""Run a replay benchmark over vLLM's real scheduler, with no model (``prefixserving bench
replay``): build the workloads, replay each through every policy, measure the scheduler
overhead, evaluate the goals and write the results after every workload (so a long run that
is stopped still leaves the finished part on disk).

vLLM's own ``Scheduler`` and KV cache manager run unchanged (or subclassed by the policy under
test, built by :mod:`prefixserving_lab.models.replay_engine`); a simulated clock advances by an
explicit cost model per step (:mod:`prefixserving_lab.models.cost`, fitted on a real engine by
:mod:`.calibration`), requests arrive from a workload (:mod:`prefixserving_lab.workloads.segments`,
the standard set in :mod:`prefixserving_lab.workloads.replay_suite`) on that clock, and
fabricated model outputs finish them after their output length (:mod:`.replay`). Every policy
(:mod:`prefixserving_lab.models.schedulers`: stock FCFS, PEEK and the baselines) replays the
same workload; :mod:`.replay_metrics`, :mod:`.replay_overhead` and
:mod:`prefixserving_lab.reports.replay` turn the runs into the JSON and markdown results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefixserving_lab.models.cost import COST_MODELS, CostModel
from prefixserving_lab.models.replay_engine import EngineShape
from prefixserving_lab.models.schedulers.registry import scheduler_class
from prefixserving_lab.reports import replay as report
from prefixserving_lab.runners import callgrind
from prefixserving_lab.runners import replay_overhead as overhead
from prefixserving_lab.runners.replay import replay
from prefixserving_lab.runners.replay_metrics import TTFT_SLO_FACTOR, summarize, ttft_slo_s
from prefixserving_lab.workloads import replay_suite as suite
from prefixserving_lab.workloads import segments as workloads
from prefixserving_lab.workloads.segments import Workload
from prefixserving_lab.workloads.traces import traces_dir


@dataclass
class BenchmarkSpec:
    """Everything the CLI decides (see ``prefixserving bench replay --help``)."""

    policies: list[str]
    workload_names: list[str] = field(default_factory=list)
    trace: Path | None = None
    trace_time_scale: float = 1.0
    trace_load: float | None = None
    trace_rows: int | None = None
    cache_blocks: int | None = None
    cache_fraction: float | None = None
    scale: float = 1.0
    seed: int = 0
    block_size: int = 64
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 262144
    cost: tuple[float, float, float, float] | None = None
    cost_model_name: str = "default"
    loads: list[float] = field(default_factory=list)
    overhead_waiting: list[int] = field(default_factory=list)
    # Count instructions and estimated cycles under callgrind at the goal's queue depth.
    overhead_instructions: bool = True
    out_dir: Path = Path("bench/results")
    name: str = "replay"
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def cost_model(self) -> CostModel:
        if self.cost is None:
            return COST_MODELS[self.cost_model_name]
        base, prefill, decode, context = self.cost
        return CostModel(base, prefill, decode, context, source="given on the command line")

    def base_engine(self) -> EngineShape:
        return EngineShape(
            num_blocks=self.cache_blocks or 0,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
        )


def build_workloads(spec: BenchmarkSpec) -> Iterator[tuple[Workload, str, float | None]]:
    """The workloads of ``spec``, each with its role (``sharing``, ``control`` or ``other``)
    and load point (None: the workload's own load). Names and the scale are checked now
    (``KeyError`` / ``ValueError``); the workloads are built one at a time as the iterator is
    read."""
    cost, base = spec.cost_model(), spec.base_engine()
    if spec.trace is not None:
        trace = workloads.mooncake(
            spec.trace,
            name=f"trace-{spec.trace.stem}-{spec.trace_time_scale:g}x",
            description=f"{spec.trace.name}, time compressed {spec.trace_time_scale:g}x",
            cost=cost,
            base=base,
            time_scale=spec.trace_time_scale,
            limit=spec.trace_rows,
            cache_fraction=spec.cache_fraction if spec.cache_fraction is not None else 0.25,
            load=spec.trace_load,
            seed=spec.seed,
        )
        return iter([(trace, "sharing", spec.trace_load)])
    ctx = suite.BuildContext(
        cost=cost,
        base=base,
        seed=spec.seed,
        scale=spec.scale,
        traces=traces_dir(),
        cache_fraction=spec.cache_fraction,
    )
    names = spec.workload_names or list(suite.SWEEP if spec.loads else suite.STANDARD)
    suite.check(names, ctx)
    return (_at_load(name, ctx, load) for name in names for load in (spec.loads or [None]))


def _at_load(
    name: str, ctx: suite.BuildContext, load: float | None
) -> tuple[Workload, str, float | None]:
    (workload,) = suite.build([name], replace(ctx, load=load))
    if load is not None:
        workload = replace(workload, name=f"{workload.name}@{load:g}")
    return workload, suite.role(name), load


# CLI options (as a result file records them) that shape the standard workloads and engine.
_RERUN_OPTIONS = (
    "scale",
    "seed",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "cost_model_name",
    "cache_blocks",
    "cache_fraction",
)


def rerun(options: Mapping[str, Any], row: str, policy: str) -> dict[str, Any]:
    """Replay ``policy`` on one ``row`` (``workload@load``) of a result file whose command ran
    with ``options`` (the file's ``settings.options``); returns the run's metrics
    (:func:`summarize`). All but ``MACHINE_METRICS`` equal the file's while the scheduler, the
    workload code and vLLM are unchanged. Rows of standard workloads with a named cost model
    only (ValueError otherwise). Cost: one replay."""
    if options.get("trace") or options.get("cost"):
        raise ValueError("only rows of standard workloads with a named cost model can be re-run")
    name, _, load = row.partition("@")
    spec = BenchmarkSpec(
        policies=[policy],
        workload_names=[name],
        loads=[float(load)] if load else [],
        **{k: options[k] for k in _RERUN_OPTIONS if k in options},
    )
    workload, _, _ = next(build_workloads(spec))
    if workload.name != row:
        raise ValueError(f"row {row!r} rebuilt as {workload.name!r}")
    cost = spec.cost_model()
    return summarize(
        replay(policy, scheduler_class(policy), workload, cost), ttft_slo_s(workload, cost)
    )


def _count_instructions(
    rows: dict[str, dict[str, Any]],
    waiting: int,
    result: dict[str, Any],
    echo: Callable[[str], None],
) -> None:
    """Add callgrind's per-step counts to the overhead ``rows`` at ``waiting`` (one counted
    pass per policy), or a note saying why they could not be counted here."""
    reason = callgrind.unavailable()
    if reason:
        result["notes"].append(f"Estimated cycles not counted: {reason}.")
        echo(f"instruction counts skipped: {reason}")
        return
    for policy, counted in overhead.measure_instructions(list(rows), waiting).items():
        rows[policy].update(counted)
        echo(
            f"counted  {waiting:>6} waiting {policy:>13}: "
            f"{counted['cycles_per_step'] / 1e6:.2f} M est. cycles/step "
            f"(x{counted['x_fcfs_cycles']:.3f} FCFS)"
        )


def _harness_notes(spec: BenchmarkSpec) -> list[str]:
    notes = [
        "Hit rate = cached prompt tokens at first admission / prompt tokens; every run's "
        "figure is checked against vLLM's own prefix-cache counters (hit_rate_matches_vllm).",
        "TTFT, TPOT and throughput are in simulated seconds from the cost model, so they do "
        "not depend on the load of the machine that ran the benchmark.",
        f"Goodput: requests per second whose TTFT meets the workload's SLO, {TTFT_SLO_FACTOR:g}"
        " x the time its median prompt takes to prefill on an idle engine with nothing cached "
        "(ttft_slo_s in each workload's header).",
    ]
    if spec.scale < 1:
        notes.append(
            f"Scale {spec.scale:g}: groups, documents and trace rows are {spec.scale:g} of the "
            "issue's sizes (each request and each group keeps its shape) to fit the CPU budget; "
            "`prefixserving bench replay --scale 1` runs the full sizes."
        )
    return notes


def run_benchmark(spec: BenchmarkSpec, echo: Callable[[str], None]) -> tuple[Path, Path]:
    """Run ``spec``; write ``<out_dir>/<name>.json`` and ``.md``; return their paths."""
    cost = spec.cost_model()
    classes = {p: scheduler_class(p) for p in spec.policies}
    built = build_workloads(spec)  # refuses unknown names before anything is written
    settings: dict[str, Any] = {
        "policies": spec.policies,
        "scale": spec.scale,
        "seed": spec.seed,
        "cost_model": spec.cost_model_name if spec.cost is None else "given",
        "loads": spec.loads,
        "options": spec.options,
    }
    result = report.new_result(settings, cost.to_dict())
    result["notes"] = [*spec.notes, *_harness_notes(spec)]
    paths = report.write(spec.out_dir, spec.name, result)
    for workload, role, load in built:
        slo_s = ttft_slo_s(workload, cost)
        entry: dict[str, Any] = {
            **workload.summary(),
            "role": role,
            "load": load,
            "ttft_slo_s": slo_s,
            "runs": {},
        }
        for policy, cls in classes.items():
            run = replay(policy, cls, workload, cost)
            metrics = summarize(run, slo_s)
            entry["runs"][policy] = metrics
            echo(
                f"{workload.name:>16} {policy:>13}: hit {metrics['hit_rate']:.3f} "
                f"p50 {metrics['ttft_s']['p50']:.3f}s p99 {metrics['ttft_s']['p99']:.3f}s "
                f"tpot {metrics['tpot_s'].get('p50', 0):.4f}s "
                f"({metrics['wall_s']:.0f}s wall)"
            )
        entry["ratios"] = report.ratios(entry["runs"])
        result["workloads"].append(entry)
        result["goals"] = report.goals(result["workloads"], result["overhead"])
        paths = report.write(spec.out_dir, spec.name, result)
    for waiting in spec.overhead_waiting:
        measured = overhead.measure(classes, waiting)
        rows = {policy: {"policy": policy, **m} for policy, m in measured.items()}
        for policy, row in rows.items():
            result["overhead"].append(row)
            echo(f"overhead {waiting:>6} waiting {policy:>13}: {row['total_ms']:.3f} ms/step")
        if waiting == report.OVERHEAD_WAITING and spec.overhead_instructions:
            _count_instructions(rows, waiting, result, echo)
        result["goals"] = report.goals(result["workloads"], result["overhead"])
        paths = report.write(spec.out_dir, spec.name, result)
    over = report.over_budget(result["overhead"])
    if over is not None and over["policy"] in classes:
        result["overhead_profile"] = {
            **over,
            **overhead.profile(classes[over["policy"]], over["waiting"]),
        }
        echo(f"profiled {over['policy']} at {over['waiting']} waiting (over the overhead goal)")
        paths = report.write(spec.out_dir, spec.name, result)
    return paths
