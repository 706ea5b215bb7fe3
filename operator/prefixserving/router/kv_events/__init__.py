"""Exact cache state from the engines: vLLM's KV cache events followed by the router.

``wire`` decodes the engines' event batches, ``index`` keeps the block hashes each engine
holds (bounded), ``subscriber`` follows every engine's ZMQ publisher with resync after gaps,
``hashing`` computes the engine's block hashes for a request's leading tokens and ``tokens``
turns a request body into those tokens. ``lookup`` puts them together for the router: per
request, how many leading blocks each engine holds (``RoutingContext.cached``).
"""
