"""PEEK core, engine-agnostic (no vLLM import): the index of the waiting requests' uncached
blocks, the pioneer/sibling holding rules, the lanes and the eviction guard."""
