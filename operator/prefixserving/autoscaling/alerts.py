"""Alerting rules that keep the prefix cache paying off: one rule set, two scopes.

- Per resource (``spec.monitoring.alerts.enabled``): the rules select that PrefixServing's pods,
  take their thresholds from ``spec.monitoring.alerts``, know its replica bounds, and add
  checks for missing engines and routers. Rendered as a PrometheusRule by
  ``templates/prometheusrule.yaml.j2``.
- Fleet (the Helm chart's defaults): the same rules over every PrefixServing Prometheus sees,
  with the API's default thresholds; "replicas at max" then comes from kube-state-metrics.

=================================  =========  ==================================================
alert                              severity   fires when
=================================  =========  ==================================================
PrefixServingHitRateDeclining      warning    5m hit rate of pods older than the start-up grace
                                              fell by ``hitRateDropFraction`` over 30 minutes
PrefixServingKVCacheSaturated      warning    mean KV cache usage above the threshold for a while
PrefixServingQueueGrowingAtMax     warning    waiting requests rising while replicas are at max
PrefixServingPreemptionsRising     warning    preemptions per second above the threshold
PrefixServingEngineDown            critical   an engine pod's metrics target fails
PrefixServingEnginesMissing        critical   fewer serving engines than the minimum (resource)
PrefixServingRouterDown            critical   a router pod's metrics target fails
PrefixServingRoutersMissing        critical   no router serving (resource)
PrefixServingWarmupTimedOut        warning    a new replica's warm-up hit its timeout
PrefixServingPrefixHygiene         warning    most requests start with a never-seen block
=================================  =========  ==================================================

The expressions are in :mod:`prefixserving.autoscaling.promql`. Each rule's annotations name
the resource (``{{ $labels.namespace }}/{{ $labels.prefixserving }}``) and the likely fix.
Pure; cost is linear in the number of rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from prefixserving.api import defaults
from prefixserving.api.scaling import EffectiveAutoscaling
from prefixserving.api.types import AlertsSpec, PrefixServing
from prefixserving.autoscaling import promql

GROUP_NAME: Final = "prefixserving"
# Look-back of the hit-rate trend, and how long each condition must hold before firing.
HIT_RATE_LOOKBACK_S: Final = 1800
HIT_RATE_FOR: Final = "10m"
QUEUE_FOR: Final = "10m"
PREEMPTIONS_FOR: Final = "10m"
DOWN_FOR: Final = "5m"
HYGIENE_FOR: Final = "15m"
WHO: Final = "{{ $labels.namespace }}/{{ $labels.prefixserving }}"


@dataclass(frozen=True)
class Bounds:
    """What a rendered resource knows about its replicas (None for the fleet)."""

    max_engines: int
    min_engines: int


def _rule(
    alert: str, expr: str, duration: str | None, severity: str, summary: str, description: str
) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": alert, "expr": expr}
    if duration is not None:
        rule["for"] = duration
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def alert_rules(
    scope: promql.Scope, alerts: AlertsSpec, bounds: Bounds | None
) -> list[dict[str, Any]]:
    """The alerting rules over ``scope`` with the thresholds of ``alerts``."""
    max_engines = bounds.max_engines if bounds is not None else None
    rules = [
        _rule(
            "PrefixServingHitRateDeclining",
            promql.hit_rate_declining(
                scope,
                alerts.hit_rate_drop_fraction,
                alerts.startup_grace_seconds,
                HIT_RATE_LOOKBACK_S,
            ),
            HIT_RATE_FOR,
            "warning",
            f"Prefix-cache hit rate of {WHO} is declining",
            "The 5m hit rate of engines older than "
            f"{alerts.startup_grace_seconds}s is {{{{ $value | humanizePercentage }}}}, more than "
            f"{alerts.hit_rate_drop_fraction:.0%} below its value 30 minutes ago. Look for a new "
            "prompt template (prefix hygiene), a rollout without warm-up, or a routing change.",
        ),
        _rule(
            "PrefixServingKVCacheSaturated",
            promql.kv_cache_saturated(scope, alerts.kv_saturation_threshold),
            alerts.kv_saturation_for,
            "warning",
            f"KV cache of {WHO} is saturated",
            "Mean KV cache usage is {{ $value | humanizePercentage }}: cached prefixes are being "
            "evicted. Raise maxReplicas or lower the autoscaler's kvCacheUsage target.",
        ),
        _rule(
            "PrefixServingQueueGrowingAtMax",
            promql.queue_growing_at_max(scope, max_engines),
            QUEUE_FOR,
            "warning",
            f"Requests queue up at {WHO} with every replica running",
            "{{ $value }} requests are waiting and the queue keeps growing while the engine "
            "Deployment is at its maximum replicas. Raise maxReplicas or add GPUs.",
        ),
        _rule(
            "PrefixServingPreemptionsRising",
            promql.preemptions_rising(scope, alerts.preemptions_per_second),
            PREEMPTIONS_FOR,
            "warning",
            f"Engines of {WHO} preempt requests",
            "{{ $value | humanize }} preemptions per second: requests lose their KV blocks and "
            "are recomputed. Lower max-num-seqs or the kvCacheUsage target, or add replicas.",
        ),
        _rule(
            "PrefixServingEngineDown",
            promql.target_down(scope, "engine"),
            DOWN_FOR,
            "critical",
            "Engine pod {{ $labels.pod }} of " + WHO + " does not answer",
            "Prometheus cannot scrape {{ $labels.instance }}: kubectl -n "
            "{{ $labels.namespace }} logs {{ $labels.pod }} -c engine",
        ),
        _rule(
            "PrefixServingRouterDown",
            promql.target_down(scope, "router"),
            DOWN_FOR,
            "critical",
            "Router pod {{ $labels.pod }} of " + WHO + " does not answer",
            "Prometheus cannot scrape {{ $labels.instance }}: kubectl -n "
            "{{ $labels.namespace }} logs {{ $labels.pod }}",
        ),
        _rule(
            "PrefixServingWarmupTimedOut",
            promql.warmup_timed_out(scope),
            None,
            "warning",
            f"Warm-up of new engine replicas of {WHO} timed out",
            "{{ $value }} pod(s) turned Ready before their prefixes were warmed: their first "
            "requests run cold. Raise warmup.timeoutSeconds or warm fewer prefixes; kubectl get "
            "events --field-selector reason=WarmupTimedOut",
        ),
        _rule(
            "PrefixServingPrefixHygiene",
            promql.prefix_hygiene(scope, alerts.first_block_new_threshold),
            HYGIENE_FOR,
            "warning",
            "Requests for {{ $labels.model }} at " + WHO + " share no prefix",
            "{{ $value | humanizePercentage }} of requests start with a block never seen before "
            "(likely cause: {{ $labels.cause }}). Move per-request text such as timestamps, "
            "request ids or user names after the shared part of the prompt.",
        ),
    ]
    if bounds is not None:
        rules += _presence_rules(scope, bounds)
    return rules


def _presence_rules(scope: promql.Scope, bounds: Bounds) -> list[dict[str, Any]]:
    """Rules that need the resource's expected replicas: fewer engines or routers than that."""
    rules = []
    if bounds.min_engines > 0:
        rules.append(
            _rule(
                "PrefixServingEnginesMissing",
                promql.too_few_up(scope, "engine", bounds.min_engines),
                DOWN_FOR,
                "critical",
                f"{WHO} serves with fewer engines than its minimum",
                f"{{{{ $value }}}} engine(s) report metrics, at least {bounds.min_engines} "
                "expected: kubectl -n {{ $labels.namespace }} describe deployment "
                "{{ $labels.prefixserving }}-engine",
            )
        )
    rules.append(
        _rule(
            "PrefixServingRoutersMissing",
            promql.too_few_up(scope, "router", 1),
            DOWN_FOR,
            "critical",
            f"No router of {WHO} is serving",
            "Clients cannot reach the engines: kubectl -n {{ $labels.namespace }} describe "
            "deployment {{ $labels.prefixserving }}-router",
        )
    )
    return rules


def resource_groups(resource: PrefixServing, auto: EffectiveAutoscaling) -> list[dict[str, Any]]:
    """The rule groups of one PrefixServing's PrometheusRule.

    ``auto`` is its effective autoscaling; with autoscaling off, the replica count is both
    bounds. Every rule carries the labels ``namespace`` and ``prefixserving`` (the
    "missing" rules' expressions have no labels of their own).
    """
    spec, name, namespace = resource.spec, resource.metadata.name, resource.metadata.namespace
    if auto.enabled:
        bounds = Bounds(max_engines=auto.max_replicas, min_engines=auto.min_replicas)
    else:
        replicas = spec.replicas if spec.replicas is not None else defaults.REPLICAS
        bounds = Bounds(max_engines=replicas, min_engines=replicas)
    rules = alert_rules(promql.resource_scope(namespace, name), spec.monitoring.alerts, bounds)
    for rule in rules:
        rule["labels"] = {**rule["labels"], "namespace": namespace, promql.RESOURCE_LABEL: name}
    return [{"name": f"{GROUP_NAME}.{namespace}.{name}", "rules": rules}]


def fleet_groups() -> list[dict[str, Any]]:
    """The chart's default rule groups over every PrefixServing, with default thresholds."""
    return [{"name": GROUP_NAME, "rules": alert_rules(promql.FLEET, AlertsSpec(), None)}]
