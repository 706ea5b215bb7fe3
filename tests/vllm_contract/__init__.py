"""vLLM's own scheduler tests, run against PEEK.

vLLM's unit tests for the V1 scheduler and KV cache manager (``tests/v1/core/`` of each pinned
release's source distribution) run unmodified three times per release: on vLLM's own schedulers
(stock), on :class:`~prefixserving.engine.vllm.PeekScheduler` /
:class:`~prefixserving.engine.vllm.PeekAsyncScheduler` with holding and lanes off, and on them
with PEEK's defaults. ``tests/test_vllm_contract.py`` compares the outcomes.

* ``releases.toml``: which releases, and the files (URL, sha256) their tests come from;
* ``fetch.py``: downloads and unpacks them (``make setup``);
* ``plugin.py``: the pytest plugin loaded into vLLM's tests (scheduler swap, outcome report);
* ``runner.py``: builds the command line and environment of one run (``pytest.ini``: its
  pytest settings);
* ``hf_configs/``: the Hugging Face model configurations the tests read (no weights);
* ``deselected.toml``: tests that cannot run on a CPU-only machine, each with the reason;
* ``judged.toml``: tests that fail with PEEK on because PEEK orders requests differently.
"""
