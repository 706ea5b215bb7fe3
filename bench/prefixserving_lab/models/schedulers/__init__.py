"""Published alternatives to PEEK, each a small subclass of vLLM's ``Scheduler`` that keeps
the stock ``schedule()`` and changes only what its source describes:

- :mod:`.sglang`: SGLang's waiting-queue orders: longest prefix match (with its FCFS fallback
  above 128 waiting, and uncapped), highest response ratio next (``hrrn``) and
  shortest-prefill-first, all with in-batch deprioritization;
- :mod:`.klpm`: k-LPM (arXiv 2502.04677), FCFS and longest-prefix picks interleaved;
- :mod:`.trtllm_defer`: TensorRT-LLM's one-iteration deferral of duplicate uncached prefixes;
- :mod:`.queue_lru`: waiting-queue-informed LRU eviction (vLLM RFC #48485, PR #54366);
- :mod:`.admission_window`: vLLM PR #54625's cache-aware admission window.

Comparison (what each changes in vLLM):

| policy           | admission order                        | holds requests     | eviction order |
|------------------|----------------------------------------|--------------------|----------------|
| stock FCFS       | arrival                                | no                 | LRU            |
| lpm_uncapped     | longest cached first                   | no                 | LRU            |
| sglang_lpm       | longest cached first; FCFS above 128   | no                 | LRU            |
| sglang_hrrn      | highest (waited tokens / uncached)     | no                 | LRU            |
|                  | first; FCFS above 128                  |                    |                |
| sglang_spf       | least uncached tokens first            | no                 | LRU            |
| k_lpm            | oldest, then k-1 longest cached, ...   | no                 | LRU            |
| trtllm_defer     | arrival                                | one step, dupes    | LRU            |
| queue_lru        | arrival                                | no                 | LRU, queued    |
|                  |                                        |                    | prefixes last  |
| admission_window | resident prefixes first in the first   | no                 | LRU            |
|                  | 32 waiting, while KV usage >= 0.5      |                    |                |
"""
