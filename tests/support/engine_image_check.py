"""Run in the engine image's Python: vLLM loads and builds the scheduler the operator names.

Usage: ``python -P engine_image_check.py SCHEDULER_CLS`` (``SCHEDULER_CLS`` is what the
operator passes to ``--scheduler-cls``). Prints one JSON line: the class built and the files its
module and ``prefixserving`` were imported from.

The steps are those of vLLM's engine core (``vllm/v1/engine/core.py``) with no model: the class
comes from ``SchedulerConfig.get_scheduler_cls()`` with ``scheduler_cls`` set, and is called
with the ``VllmConfig``, a ``KVCacheConfig`` of one full-attention group, a
``StructuredOutputManager`` and the block sizes ``resolve_kv_cache_block_sizes`` gives; then
one ``schedule()`` with no request. ``ModelConfig`` reads only a tiny Llama ``config.json``
written to a temporary folder; no weights, no tokenizer. Cost: vLLM's import (seconds) and
microseconds of scheduling.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
from vllm.v1.core.sched.interface import SchedulerInterface
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 16
NUM_BLOCKS = 64
MAX_MODEL_LEN = 1024
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 1000,
    "max_position_embeddings": MAX_MODEL_LEN,
    "torch_dtype": "bfloat16",
}


def build(scheduler_cls: str, model_dir: Path) -> SchedulerInterface:
    """The scheduler vLLM's engine core would build for ``--scheduler-cls scheduler_cls``."""
    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA))
    vllm_config = VllmConfig(
        model_config=ModelConfig(
            model=str(model_dir), skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN
        ),
        scheduler_config=SchedulerConfig(
            max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=False,
            scheduler_cls=scheduler_cls,
        ),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
    )
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    scheduler = vllm_config.scheduler_config.get_scheduler_cls()
    return scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        include_finished_set=False,
        log_stats=True,
        block_size=block_size,
        hash_block_size=hash_block_size,
    )


def main() -> None:
    (scheduler_cls,) = sys.argv[1:]
    with tempfile.TemporaryDirectory() as model_dir:
        scheduler = build(scheduler_cls, Path(model_dir))
    if not isinstance(scheduler, SchedulerInterface):
        sys.exit(f"{scheduler_cls} built a {type(scheduler)}, not a vLLM scheduler")
    output = scheduler.schedule()
    cls = type(scheduler)
    print(
        json.dumps(
            {
                "class": f"{cls.__module__}.{cls.__qualname__}",
                "module_file": sys.modules[cls.__module__].__file__,
                "prefixserving_file": sys.modules["prefixserving"].__file__,
                "scheduled_tokens": output.total_num_scheduled_tokens,
            }
        )
    )


if __name__ == "__main__":
    main()
