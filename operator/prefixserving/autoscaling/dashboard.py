"""The Grafana dashboard of one PrefixServing, built from the same PromQL as the autoscalers.

Two variables pick the resource: ``namespace`` and ``prefixserving`` (the resource name, read
from the engine pods' names). Every panel selects that resource's pods through
:func:`prefixserving.autoscaling.promql.resource_scope`, so the dashboard shows exactly what
the ScaledObject, the HPA rules and the alerts see. Panels, by row:

- Cache: prefix-cache hit rate (the status query, and per pod), KV cache usage, queue depth,
  TTFT p50/p99, preemptions.
- Capacity: engine replicas reporting metrics, and the engines in the routers' pools.
- Router: decisions by branch, requests by outcome, added latency, prefix hygiene.
- Warm-up: prefixes and tokens warmed, failures by stage, timeouts, duration per pod.
- PEEK: siblings held, blocks pinned by the guard, sibling holds per second.

Only series that vLLM, the router, the warm-up sidecar and PEEK export are used (tests check
the names against those exporters). Pure; cost is linear in the number of panels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from prefixserving import constants
from prefixserving.autoscaling import promql

UID: Final = "prefixserving"
TITLE: Final = "PrefixServing"
NAMESPACE_VAR: Final = "$namespace"
RESOURCE_VAR: Final = "$prefixserving"
RATE: Final = "5m"
DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}
PANEL_HEIGHT: Final = 8
PANEL_WIDTH: Final = 8
ROW_WIDTH: Final = 24

SCOPE: Final = promql.resource_scope(NAMESPACE_VAR, RESOURCE_VAR)
ENGINE: Final = SCOPE.engine
ROUTER: Final = SCOPE.router


def _engine(metric: str) -> str:
    return promql.series(metric, ENGINE)


def _router(metric: str) -> str:
    return promql.series(metric, ROUTER)


def _quantile(q: float, histogram: str, matchers: str) -> str:
    bucket = promql.series(f"{histogram}_bucket", matchers)
    return f"histogram_quantile({q:g}, sum by (le) (rate({bucket}[{RATE}])))"


def _ratio_by_pod(numerator: str, denominator: str) -> str:
    return (
        f"sum by (pod) (rate({_engine(numerator)}[{RATE}]))"
        f" / sum by (pod) (rate({_engine(denominator)}[{RATE}]))"
    )


@dataclass(frozen=True)
class Panel:
    """One time-series panel: a title, a unit and its queries as (PromQL, legend) pairs."""

    title: str
    description: str
    unit: str
    queries: tuple[tuple[str, str], ...]


ROWS: Final[tuple[tuple[str, tuple[Panel, ...]], ...]] = (
    (
        "Cache",
        (
            Panel(
                "Prefix-cache hit rate",
                "Hit tokens / queried tokens over 5m: the resource (what its status shows) and "
                "each engine pod.",
                "percentunit",
                (
                    (promql.prefix_cache_hit_rate(NAMESPACE_VAR, RESOURCE_VAR, RATE), "all"),
                    (
                        _ratio_by_pod(
                            promql.VLLM_PREFIX_CACHE_HITS, promql.VLLM_PREFIX_CACHE_QUERIES
                        ),
                        "{{pod}}",
                    ),
                ),
            ),
            Panel(
                "KV cache usage",
                "vllm:kv_cache_usage_perc: the average the autoscaler targets, and each pod.",
                "percentunit",
                (
                    (promql.kv_cache_usage(NAMESPACE_VAR, RESOURCE_VAR), "average"),
                    (f"max by (pod) ({_engine(promql.VLLM_KV_CACHE_USAGE)})", "{{pod}}"),
                ),
            ),
            Panel(
                "Queue depth",
                "Requests waiting per replica (the autoscaler's queue signal) and running.",
                "short",
                (
                    (
                        promql.queue_depth_per_replica(NAMESPACE_VAR, RESOURCE_VAR),
                        "waiting/replica",
                    ),
                    (f"sum by (pod) ({_engine(promql.VLLM_REQUESTS_WAITING)})", "waiting {{pod}}"),
                    (f"sum by (pod) ({_engine(promql.VLLM_REQUESTS_RUNNING)})", "running {{pod}}"),
                ),
            ),
            Panel(
                "Time to first token",
                "TTFT quantiles across the engine pods (vllm:time_to_first_token_seconds).",
                "s",
                (
                    (_quantile(0.5, promql.VLLM_TTFT, ENGINE), "p50"),
                    (_quantile(0.99, promql.VLLM_TTFT, ENGINE), "p99"),
                ),
            ),
            Panel(
                "Preemptions",
                "Requests preempted per second: they lose their KV blocks and are recomputed.",
                "ops",
                ((f"sum by (pod) (rate({_engine(promql.VLLM_PREEMPTIONS)}[{RATE}]))", "{{pod}}"),),
            ),
            Panel(
                "Replicas",
                "Engine pods reporting metrics, and the engines each router takes traffic to.",
                "short",
                (
                    (f"count(max by (pod) ({_engine(promql.VLLM_REQUESTS_RUNNING)}))", "engines"),
                    (
                        f"sum by (pod) ({_router('prefixserving_router_backend_healthy')})",
                        "healthy in {{pod}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Router",
        (
            Panel(
                "Routing decisions",
                "Decisions per second by branch: affinity (the prefix's owner), spilled (owner "
                "over its load bound), balance, fallback, cached (with engine events: the "
                "engine that holds the request's prefix).",
                "ops",
                (
                    (
                        f"sum by (policy, decision) (rate({_router(promql.ROUTER_DECISIONS)}"
                        f"[{RATE}]))",
                        "{{policy}} {{decision}}",
                    ),
                ),
            ),
            Panel(
                "Requests by outcome",
                "Proxied requests per second by outcome.",
                "reqps",
                (
                    (
                        f"sum by (outcome) (rate({_router(promql.ROUTER_REQUESTS)}[{RATE}]))",
                        "{{outcome}}",
                    ),
                ),
            ),
            Panel(
                "Router added latency",
                "Time spent in the router itself, p99.",
                "s",
                ((_quantile(0.99, "prefixserving_router_added_latency_seconds", ROUTER), "p99"),),
            ),
            Panel(
                "Prefix hygiene",
                "Share of requests whose first prefix block was never seen before, per model. "
                "Near 100%: per-request text (timestamp, id, user name) precedes the shared part.",
                "percentunit",
                ((promql.new_first_block_ratio(NAMESPACE_VAR, RESOURCE_VAR), "{{model}}"),),
            ),
        ),
    ),
    (
        "Warm-up",
        (
            Panel(
                "Prefixes warmed",
                "Prefixes replayed into each live pod's cache before it took traffic, by source.",
                "short",
                (
                    (
                        "sum by (pod, source) "
                        f"({_engine(constants.METRIC_WARMUP_PREFIXES_WARMED)})",
                        "{{pod}} {{source}}",
                    ),
                    (
                        f"sum by (pod) ({_engine(constants.METRIC_WARMUP_TOKENS_WARMED)})",
                        "tokens {{pod}}",
                    ),
                ),
            ),
            Panel(
                "Warm-up failures and timeouts",
                "Failed steps by stage, and pods whose warm-up hit its timeout.",
                "short",
                (
                    (
                        f"sum by (stage) ({_engine(constants.METRIC_WARMUP_FAILURES)})",
                        "failed {{stage}}",
                    ),
                    (f"count({_engine(promql.WARMUP_TIMEOUTS)} > 0)", "timed out"),
                ),
            ),
            Panel(
                "Warm-up duration",
                "Start of warm-up to Ready, per live pod.",
                "s",
                (
                    (
                        f"max by (pod) ({_engine(constants.METRIC_WARMUP_DURATION)})",
                        "{{pod}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "PEEK scheduler",
        (
            Panel(
                "Siblings held and blocks pinned",
                "Siblings waiting for their pioneer's prefix, and KV blocks the guard pins.",
                "short",
                (
                    (
                        f"sum by (pod) ({_engine('prefixserving:peek_held_siblings')})",
                        "held {{pod}}",
                    ),
                    (
                        f"sum by (pod) ({_engine('prefixserving:peek_pinned_blocks')})",
                        "pinned {{pod}}",
                    ),
                ),
            ),
            Panel(
                "Sibling holds",
                "Times per second a sibling was held for its pioneer.",
                "ops",
                (
                    (
                        "sum by (pod) "
                        f"(rate({_engine('prefixserving:peek_sibling_holds_total')}[{RATE}]))",
                        "{{pod}}",
                    ),
                ),
            ),
        ),
    ),
)


def queries() -> list[str]:
    """Every PromQL expression of the dashboard, in panel order."""
    return [expr for _, panels in ROWS for panel in panels for expr, _ in panel.queries]


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": PANEL_HEIGHT, "w": PANEL_WIDTH, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(panel.queries)
        ],
    }


def _variables() -> list[dict[str, Any]]:
    resource_regex = "/^(.+)-engine-[a-z0-9]+-[a-z0-9]+$/"
    running = promql.VLLM_REQUESTS_RUNNING
    return [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
        {
            "name": "namespace",
            "type": "query",
            "label": "Namespace",
            "datasource": DATASOURCE,
            "query": f"label_values({running}, namespace)",
            "refresh": 2,
            "sort": 1,
        },
        {
            "name": "prefixserving",
            "type": "query",
            "label": "PrefixServing",
            "datasource": DATASOURCE,
            "query": f'label_values({running}{{namespace="{NAMESPACE_VAR}"}}, pod)',
            "regex": resource_regex,
            "refresh": 2,
            "sort": 1,
        },
    ]


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (import it, or let the Grafana sidecar load it)."""
    panels: list[dict[str, Any]] = []
    y = 0
    for title, row_panels in ROWS:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": ROW_WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for i, panel in enumerate(row_panels):
            x = (i * PANEL_WIDTH) % ROW_WIDTH
            if i and x == 0:
                y += PANEL_HEIGHT
            panels.append(_panel(panel, len(panels) + 1, x, y))
        y += PANEL_HEIGHT
    return {
        "uid": UID,
        "title": TITLE,
        "description": "Prefix-cache hit rate, KV cache, queues, routing and warm-up of one "
        "PrefixServing.",
        "tags": ["prefixserving", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "annotations": {"list": []},
        "templating": {"list": _variables()},
        "panels": panels,
    }
