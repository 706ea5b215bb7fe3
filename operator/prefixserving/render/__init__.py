"""Rendering: pure functions from a validated PrefixServing to its child Kubernetes objects,
through the jinja2 templates in the top-level ``templates/`` folder."""
