"""The lab's commands, loaded by ``prefixserving`` (``prefixserving.cli``) when they run:
``bench replay|cluster|scaling|rollout``, ``demo`` and ``stack up|down``."""
