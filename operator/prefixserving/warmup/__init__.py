"""The warm-up sidecar: collects the prefixes a new replica will own and pre-fills them through
the engine's own OpenAI endpoint before the pod reports Ready."""
