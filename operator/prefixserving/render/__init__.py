"""Rendering: pure functions from a validated PrefixServing to its child Kubernetes objects,
through the jinja2 templates in the top-level ``templates/`` folder."""

from prefixserving.render.children import CHILDREN, Child, owner_reference, render_children

__all__ = ["CHILDREN", "Child", "owner_reference", "render_children"]
