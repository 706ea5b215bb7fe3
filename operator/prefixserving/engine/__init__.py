"""Engine adapters. ``engine.vllm`` is the only module of ``prefixserving`` that imports vLLM's
scheduler internals; it plugs PEEK into vLLM through ``--scheduler-cls``. (The replay
benchmark, in the lab, runs vLLM's scheduler too.)"""
