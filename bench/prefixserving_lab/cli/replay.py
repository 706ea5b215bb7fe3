"""``prefixserving bench replay``: every policy side by side on vLLM's real scheduler.

Examples::

    prefixserving bench replay                                   # the standard suite
    prefixserving bench replay --sweep --cost-model gpu --scale 0.125   # the load sweep
    prefixserving bench replay --workload gsp-q25 --policy fcfs --policy peek --scale 0.25
    prefixserving bench replay --trace my-trace.jsonl --time-scale 4 --cache-blocks 20000
"""

from __future__ import annotations

from pathlib import Path

import click

from prefixserving_lab.cli.options import out_dir_option

DEFAULT_OVERHEAD_WAITING = "100,1000,10000"


@click.command()
@click.option(
    "--trace",
    "trace",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A Mooncake-format JSONL trace (timestamp ms, input_length, output_length, hash_ids "
    "of 512-token blocks) to replay instead of the standard workloads.",
)
@click.option(
    "--workload",
    "workload_names",
    multiple=True,
    help="Standard workload to run (repeatable; default: all). See --list.",
)
@click.option(
    "--policy",
    "policy_names",
    multiple=True,
    help="Policy to compare (repeatable; default: all). fcfs is always added as the baseline.",
)
@click.option("--cache-blocks", type=click.IntRange(min=2), help="KV cache size in blocks.")
@click.option(
    "--cache-fraction",
    type=click.FloatRange(min=0, min_open=True),
    help="KV cache as a fraction of the workload's distinct shared blocks (default: each "
    "workload's own).",
)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="With --trace: compress the trace's time by this factor.",
)
@click.option(
    "--trace-load",
    type=click.FloatRange(min=0, min_open=True),
    help="With --trace: rescale arrivals to this fraction of the engine's estimated capacity "
    "before --time-scale (default: the trace's own timestamps).",
)
@click.option("--trace-rows", type=click.IntRange(min=1), help="With --trace: first N rows.")
@click.option(
    "--scale",
    type=click.FloatRange(0, 1, min_open=True),
    default=1.0,
    show_default=True,
    help="Shrink the standard workloads (groups, documents, trace rows).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--block-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--max-num-batched-tokens", type=click.IntRange(min=1), default=8192, show_default=True
)
@click.option("--max-model-len", type=click.IntRange(min=1), default=262144, show_default=True)
@click.option(
    "--cost",
    help="Cost model as BASE_S,PREFILL_TOKEN_S,DECODE_SEQ_S,CONTEXT_TOKEN_S "
    "(default: DEFAULT_COST in prefixserving_lab.models.cost).",
)
@click.option(
    "--cost-model",
    "cost_model_name",
    type=click.Choice(["default", "gpu"]),
    default="default",
    show_default=True,
    help="Named cost model: default (DEFAULT_COST) or gpu (Llama 3.1 8B on one H100, "
    "GPU_COST); --cost overrides it.",
)
@click.option(
    "--loads",
    help="Comma-separated load points (x the estimated capacity), each workload run at each; "
    "default: each workload's own load.",
)
@click.option(
    "--sweep",
    is_flag=True,
    help="The issue's load sweep: the sweep's workloads (--list) at loads 0.5, 0.8, 1.0 and "
    "1.2 unless --workload / --loads say otherwise.",
)
@click.option(
    "--overhead-waiting",
    default=DEFAULT_OVERHEAD_WAITING,
    show_default=True,
    help="Queue depths for the scheduler CPU-time table; empty to skip it.",
)
@click.option(
    "--overhead-instructions/--no-overhead-instructions",
    default=True,
    show_default=True,
    help="Also count each policy's instructions and estimated cycles per step under "
    "valgrind's callgrind at 1,000 waiting (deterministic; about a minute per policy).",
)
@out_dir_option
@click.option("--name", default="replay", show_default=True, help="Output file base name.")
@click.option("--note", "notes", multiple=True, help="A note to add to the results (repeatable).")
@click.option("--list", "list_only", is_flag=True, help="List workloads and policies, then exit.")
def replay(
    trace: Path | None,
    workload_names: tuple[str, ...],
    policy_names: tuple[str, ...],
    cache_blocks: int | None,
    cache_fraction: float | None,
    time_scale: float,
    trace_load: float | None,
    trace_rows: int | None,
    scale: float,
    seed: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    cost: str | None,
    cost_model_name: str,
    loads: str | None,
    sweep: bool,
    overhead_waiting: str,
    overhead_instructions: bool,
    out_dir: Path,
    name: str,
    notes: tuple[str, ...],
    list_only: bool,
) -> None:
    """Replay workloads through vLLM's real scheduler (no model) for every policy side by
    side, on a simulated clock; write JSON plus a markdown table to --out-dir."""
    from prefixserving_lab.models.schedulers.registry import BASELINE, POLICIES
    from prefixserving_lab.runners.replay_bench import BenchmarkSpec, run_benchmark
    from prefixserving_lab.workloads import replay_suite as suite

    if list_only:
        click.echo("workloads: " + ", ".join(suite.STANDARD))
        click.echo("sweep:     " + ", ".join(suite.SWEEP))
        click.echo("policies:  " + ", ".join(POLICIES))
        return
    unknown = [p for p in policy_names if p not in POLICIES]
    if unknown:
        raise click.BadParameter(
            f"unknown {unknown}; known: {', '.join(POLICIES)}", param_hint="--policy"
        )
    policies = [BASELINE] + [p for p in (policy_names or POLICIES) if p != BASELINE]
    if trace is not None and workload_names:
        raise click.UsageError("use either --trace or --workload, not both")
    if trace is not None and (loads or sweep):
        raise click.UsageError(
            "--loads and --sweep apply to the standard workloads; with --trace use --trace-load"
        )
    spec = BenchmarkSpec(
        policies=policies,
        workload_names=list(workload_names) if trace is None else [],
        trace=trace,
        trace_time_scale=time_scale,
        trace_load=trace_load,
        trace_rows=trace_rows,
        cache_blocks=cache_blocks,
        cache_fraction=cache_fraction,
        scale=scale,
        seed=seed,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        cost=_parse_cost(cost),
        cost_model_name=cost_model_name,
        loads=_parse_loads(loads) if loads else list(suite.SWEEP_LOADS) if sweep else [],
        overhead_waiting=_parse_ints(overhead_waiting),
        overhead_instructions=overhead_instructions,
        out_dir=out_dir,
        name=name,
        options={
            k: str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v
            for k, v in click.get_current_context().params.items()
            if v not in (None, ()) and k not in ("list_only", "notes")
        },
        notes=list(notes),
    )
    try:
        json_path, md_path = run_benchmark(spec, echo=lambda line: click.echo(line, err=True))
    except (KeyError, ValueError) as exc:
        raise click.ClickException(str(exc).strip("'\"")) from exc
    click.echo(f"wrote {json_path} and {md_path}")


def _parse_cost(text: str | None) -> tuple[float, float, float, float] | None:
    if not text:
        return None
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 4 or any(v < 0 for v in values):
        raise click.BadParameter(
            "expected four non-negative numbers, e.g. --cost 0.01,4e-5,5e-4,2e-8",
            param_hint="--cost",
        )
    return values  # type: ignore[return-value]


def _parse_ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(
            "expected comma-separated integers, e.g. 100,1000", param_hint="--overhead-waiting"
        ) from None


def _parse_loads(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise click.BadParameter(
            "expected comma-separated positive numbers, e.g. --loads 0.5,0.8,1,1.2",
            param_hint="--loads",
        )
    return values
