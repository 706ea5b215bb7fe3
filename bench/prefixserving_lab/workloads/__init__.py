"""Every workload of the benchmarks, each a pure function of its parameters and seed.

- :mod:`.traces`: the Mooncake and Azure trace readers and the traces folder;
- :mod:`.blocks`: block-id requests for the cluster simulator: chained block keys, generated
  shared-prefix groups (system prompt, Zipf documents, questions), the ideal hit rate;
- :mod:`.conversations`: the Azure conversation trace with bursts and chat-shaped prefixes;
- :mod:`.segments`: token-level requests for the replay (SGLang's generated shared prefix,
  long documents, Mooncake and Azure rows), :mod:`.replay_suite` the standard set;
- :mod:`.prompts`: prompts for real engines: shared-prefix groups as token ids, text or chat.
"""
