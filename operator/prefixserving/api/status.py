"""Pydantic models of a PrefixServing's ``status``, written by the operator only.

The CRD marks every field here ``nullable`` (``api/crd.py``): the operator may write nulls, and
the API server applies no defaults under ``status``. ``status.conditions`` holds one
:class:`Condition` per type; what each type and reason means is ``api/lifecycle.py``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prefixserving.api.fields import ApiModel


class Condition(ApiModel):
    """A Kubernetes condition (metav1.Condition) of the resource."""

    type: str = Field(max_length=316, description="Condition type: Ready, Progressing, ...")
    status: Literal["True", "False", "Unknown"] = Field(description="Status of the condition.")
    reason: str = Field(default="", max_length=1024, description="PascalCase machine reason.")
    message: str = Field(default="", max_length=32_768, description="Human-readable detail.")
    last_transition_time: str | None = Field(
        default=None, description="When the status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="Generation the condition was computed for."
    )


class StatusMetrics(ApiModel):
    """Prometheus figures for the resource's engines, as of a timestamp."""

    hit_rate: float | None = Field(default=None, description="5m prefix-cache hit rate (0..1).")
    kv_cache_usage: float | None = Field(
        default=None, description="Average KV cache usage across engines (0..1)."
    )
    queue_depth: float | None = Field(
        default=None, description="Requests waiting per engine replica."
    )
    first_block_new_fraction: float | None = Field(
        default=None, description="Share of requests whose first prefix block was never seen."
    )
    scheduler_base: str | None = Field(
        default=None,
        max_length=256,
        description=(
            "vLLM scheduler PEEK runs on, per engine count: 'AsyncScheduler' when the engines "
            "schedule asynchronously (vLLM's GPU default), 'Scheduler' otherwise."
        ),
    )
    as_of: str | None = Field(default=None, description="Time of the query (RFC 3339).")


class PrefixServingStatus(ApiModel):
    """Observed state, written by the operator."""

    observed_generation: int | None = Field(
        default=None, description="Generation of the spec the operator last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing, Degraded and MetricsAvailable, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int | None = Field(default=None, description="Engine pods.")
    ready_replicas: int | None = Field(default=None, description="Engine pods that are Ready.")
    warm_replicas: int | None = Field(
        default=None, description="Engine pods whose warm-up finished (Ready after warm-up)."
    )
    router_endpoint: str | None = Field(
        default=None,
        description="URL clients use (router.mode proxy; with endpointPicker, the gateway's).",
    )
    metrics: StatusMetrics | None = Field(default=None, description="Prometheus figures.")
    hints: list[str] = Field(
        default_factory=list, description="Likely causes of poor caching, for the operator's user."
    )
