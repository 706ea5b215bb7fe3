"""PrefixServing: serve LLMs with vLLM on Kubernetes and make the prefix cache pay off."""
