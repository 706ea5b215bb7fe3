"""Text forms of numbers in rendered objects."""

from __future__ import annotations


def quantity(value: float) -> str:
    """A Kubernetes quantity for a metric target: 5 -> '5', 0.8 -> '800m'."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def number(value: float) -> str:
    """Shortest text of a number for a command-line flag or a KEDA threshold."""
    return f"{value:g}"
