"""Replay benchmark over vLLM's real scheduler, with no model (``prefixserving bench replay``).

vLLM's own ``Scheduler`` and KV cache manager run unchanged (or subclassed by the policy under
test, built by :mod:`.engine`); a simulated clock advances by an explicit cost model per step
(:mod:`.cost`, fitted on a real engine by :mod:`.calibrate`), requests arrive from a workload
(:mod:`.workloads`, the standard set in :mod:`.suite`) on that clock, and fabricated model
outputs finish them after their output length (:mod:`.harness`). Every policy
(:mod:`.policies`: stock FCFS, PEEK and the baselines in :mod:`.baselines`) replays the same
workload; :mod:`.metrics`, :mod:`.overhead` and :mod:`.report` turn the runs into the JSON and
markdown results, and :mod:`.runner` ties it together for the CLI.

This package imports vLLM; it lives under ``engine/`` for that reason.
"""
