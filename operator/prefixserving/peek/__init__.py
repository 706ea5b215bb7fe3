"""PEEK core, engine-agnostic (no vLLM import): the radix index over waiting requests, the
pioneer/sibling holding rules, the eviction guard and the stride lanes."""
