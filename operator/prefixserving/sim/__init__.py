"""Simulators and workloads: trace loaders, the replay harness over vLLM's real scheduler,
and the cluster simulator used by the routing, autoscaling and rollout benchmarks."""
