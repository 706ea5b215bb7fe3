"""Engine adapters. ``engine.vllm`` is the only module in the project that imports vLLM's
scheduler internals; it plugs PEEK into vLLM through ``--scheduler-cls``."""
