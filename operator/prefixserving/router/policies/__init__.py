"""Routing policies, one module per algorithm; ``registry.py`` maps names to policies."""
