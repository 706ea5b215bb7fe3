"""The PrefixServing lab: benchmarks, simulators, the local stack and test helpers.

It is a separate distribution (``bench/pyproject.toml``, ``pip install -e bench``; ``make
setup`` installs it) that depends on ``prefixserving`` and never the other way round: no
module of ``prefixserving`` imports it, and no image installs it. The ``prefixserving bench
...``, ``prefixserving demo`` and ``prefixserving stack`` commands load it when they run.

- :mod:`.models`: what the simulations simulate: engine replicas and their caches, the
  cluster behind the router, pods starting and warming, the HPA and rolling updates, peer
  routers and schedulers, the replay's cost model and its scheduler builder.
- :mod:`.workloads`: every request generator and trace reader, deterministic from a seed.
- :mod:`.runners`: what runs a benchmark: the replay harness, the cluster, scaling and
  rollout runs, the local stack (real engines, router, warm-up, Prometheus), the streaming
  client, the fake engine.
- :mod:`.reports`: the JSON and markdown files the benchmarks write.
- :mod:`.cli`: the ``prefixserving bench``, ``demo`` and ``stack`` commands.
- :mod:`.machine` (the machine line of every results file), :mod:`.stats` (the one quantile
  definition), :mod:`.testing` (waits with a deadline, a small valid resource).
"""
