"""Replay benchmark over vLLM's real scheduler, with no model.

vLLM's own ``Scheduler`` and KV cache manager run unchanged (or subclassed by the policy under
test); a simulated clock advances by an explicit cost model per step (:mod:`.cost`), requests
arrive from a workload (:mod:`.workloads`) on that clock, and fabricated model outputs finish
them after their output length (:mod:`.harness`). Every policy replays the same workload
(:mod:`.policies`, :mod:`.baselines`); :mod:`.metrics`, :mod:`.overhead` and :mod:`.report`
turn the runs into the JSON and markdown results.

This package imports vLLM; it lives under ``engine/`` for that reason.
"""
