"""Field types and the base model shared by the spec (``types.py``) and status (``status.py``)
models, and :func:`with_default`, which writes a default into a field's description.

Nothing here decides a value: patterns and shapes only (the values are ``api/defaults.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StringConstraints, WithJsonSchema
from pydantic.alias_generators import to_camel

# A Kubernetes resource quantity ("8", "500m", "64Gi"); integers are accepted and kept as text.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
Quantity = Annotated[
    str,
    BeforeValidator(lambda v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v),
    StringConstraints(pattern=QUANTITY_PATTERN),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
# An object whose schema belongs to Kubernetes (tolerations, affinity, ...); kept as given.
KubeObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DnsName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DNS_LABEL)]
Duration = Annotated[str, StringConstraints(pattern=r"^[0-9]+(s|m|h)$", max_length=8)]


class ApiModel(BaseModel):
    """Base of every API model: camelCase aliases, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=False
    )


def with_default(text: str, default: object) -> str:
    """``text`` followed by ``(default <value>)``, the value taken from ``api/defaults.py``.

    For fields without a schema default (autoscaling tunables fall back to a ScalingPolicy
    before the default, so the API server must not fill them in) and for quantities, whose
    default ``kubectl explain`` does not show. A sequence is written comma-separated, a float
    in its shortest form (5.0 -> 5). Never type a default into a description by hand.
    """
    if isinstance(default, Sequence) and not isinstance(default, str):
        value = ", ".join(str(item) for item in default)
    elif isinstance(default, float):
        value = f"{default:g}"
    else:
        value = str(default)
    return f"{text} (default {value})."
