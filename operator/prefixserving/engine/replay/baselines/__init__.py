"""Published alternatives to PEEK, each a small subclass of vLLM's ``Scheduler`` that keeps
the stock ``schedule()`` and changes only what its source describes:

- :mod:`.sglang_lpm`: SGLang's longest-prefix-match order with in-batch deprioritization;
- :mod:`.trtllm_defer`: TensorRT-LLM's one-iteration deferral of duplicate uncached prefixes;
- :mod:`.queue_lru`: waiting-queue-informed LRU eviction (vLLM RFC #48485).

Comparison (what each changes in vLLM):

| policy        | admission order      | holds requests           | eviction order           |
|---------------|----------------------|--------------------------|--------------------------|
| stock FCFS    | arrival              | no                       | LRU                      |
| sglang_lpm    | longest cached first | no (reorders only)       | LRU                      |
| trtllm_defer  | arrival              | one step, duplicates     | LRU                      |
| queue_lru     | arrival              | no                       | LRU, queued prefixes last|
"""
