"""Build a vLLM ``Scheduler`` (or a subclass) with no model and no accelerator.

The scheduler needs a ``VllmConfig`` (model, scheduler and cache configs) and a
``KVCacheConfig``. The model config is read from a tiny Llama ``config.json`` written once to
a temporary folder (no weights are ever loaded); the KV cache is one ``FullAttentionSpec``
group with exactly ``num_blocks`` blocks, so the cache size is what the benchmark sets, not
what a device's memory would allow.

Block hashes use :func:`fast_block_hash`, Python's built-in ``hash`` as 8 bytes (vLLM's own
scheduler tests use the built-in too): the replay needs equal prefixes to get equal hashes
within one process, not hashes that are stable across processes, and it is several times
faster than sha256.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vllm.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.config.scheduler import SchedulerPolicy
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

VOCAB_SIZE = 32000


@dataclass(frozen=True, slots=True)
class EngineShape:
    """The scheduler limits and KV cache of the replayed engine.

    ``num_blocks``: KV cache capacity in blocks of ``block_size`` tokens.
    ``max_num_seqs`` and ``max_num_batched_tokens``: vLLM's per-step bounds (running
    requests, scheduled tokens). ``long_prefill_token_threshold``: 0 = off; otherwise the
    largest prefill chunk of one request per step. ``max_model_len``: longest prompt plus
    output the engine accepts (the replay checks prompts against it; vLLM's scheduler does
    not). ``async_scheduling``: vLLM's ``AsyncScheduler`` contract (a step is scheduled before
    the previous one's output is applied). ``max_loras``: LoRA adapters one step may serve
    (vLLM skips a request whose adapter would exceed it); 0 = LoRA off. The last three are
    vLLM's admission options, at vLLM's defaults: ``watermark`` (fraction of the cache kept
    free when a step admits a second request), ``reserve_full_isl`` (admit a request only when
    its whole prompt fits, not just its first chunk) and ``adaptive_chunks``
    (``long_prefill_token_threshold_adaptive``: the chunk cap rises to a fair share of the
    token budget).
    """

    num_blocks: int
    block_size: int = 64
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 0
    max_model_len: int = 262144
    async_scheduling: bool = False
    max_loras: int = 0
    watermark: float = 0.0
    reserve_full_isl: bool = True
    adaptive_chunks: bool = False


def build_scheduler(
    cls: type[Scheduler], shape: EngineShape, policy: SchedulerPolicy = "fcfs"
) -> Scheduler:
    """Construct ``cls`` (vLLM's ``Scheduler`` or a subclass with the same constructor) with
    vLLM's scheduling ``policy`` (``fcfs`` or ``priority``)."""
    vllm_config = vllm_config_for(shape)
    vllm_config.scheduler_config.policy = policy
    kv_cache_config = KVCacheConfig(
        num_blocks=shape.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=shape.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    vllm_config.cache_config.num_gpu_blocks = shape.num_blocks
    vllm_config.scheduler_config.async_scheduling = shape.async_scheduling
    init_none_hash(fast_block_hash)
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=shape.block_size,
        log_stats=True,
    )


def fast_block_hash(obj: Any) -> bytes:
    """vLLM block hash function: the built-in ``hash`` of ``obj`` as 8 bytes."""
    return hash(obj).to_bytes(8, "little", signed=True)


def vllm_config_for(shape: EngineShape) -> VllmConfig:
    """The ``VllmConfig`` of ``shape``'s engine (model, scheduler and cache configs), before
    the KV cache size is applied."""
    model_config = ModelConfig(
        model=str(_model_dir(shape.max_model_len)),
        skip_tokenizer_init=True,
        max_model_len=shape.max_model_len,
        dtype="bfloat16",
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=shape.max_num_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_model_len=shape.max_model_len,
        long_prefill_token_threshold=shape.long_prefill_token_threshold,
        long_prefill_token_threshold_adaptive=shape.adaptive_chunks,
        watermark=shape.watermark,
        scheduler_reserve_full_isl=shape.reserve_full_isl,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=shape.block_size, enable_prefix_caching=True)
    lora_config = LoRAConfig(max_loras=shape.max_loras) if shape.max_loras else None
    return VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        lora_config=lora_config,
    )


def _model_dir(max_model_len: int) -> Path:
    """A folder holding only a tiny Llama ``config.json`` whose context fits ``max_model_len``."""
    folder = Path(tempfile.gettempdir()) / f"prefixserving-replay-model-{max_model_len}"
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": max_model_len,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
    }
    text = json.dumps(config, indent=2)
    path = folder / "config.json"
    if not path.exists() or path.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"config.json.{id(text)}.tmp"
        tmp.write_text(text)
        tmp.replace(path)
    return folder
