"""The figures of ``status.metrics``, queried from Prometheus with ``prometheus-api-client``.

Six instant queries per resource (the PromQL is in ``prefixserving.autoscaling.promql``,
shared with the autoscalers and alerts): the prefix-cache hit rate over 5 minutes (rate of hit
tokens / rate of queried tokens), the average KV cache usage, the average queue depth per
engine pod, the engines' PEEK info (which vLLM scheduler base PEEK runs on, shown as
``schedulerBase``, and a hint for each reason engines keep vLLM's own order), and the router's
prefix hygiene: the largest share of requests whose first prefix block was never seen before,
and, per model above the threshold, the cause the router diagnosed, turned into a hint
(``status.hints``) by the router's own wording.
A query with no series (no engine scraped yet, or no traffic in the window: 0/0) yields None
for that figure. Any transport error, timeout or Prometheus error raises
:class:`MetricsUnavailable` with a message fit for a condition; the caller degrades only the
metrics block. Cost: six HTTP requests, each bounded by ``timeout_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from prefixserving.api import defaults
from prefixserving.autoscaling import promql
from prefixserving.router.hygiene import Cause, hint


class MetricsUnavailable(Exception):
    """Prometheus could not answer; the message says why (shown in the condition)."""


@dataclass(frozen=True)
class Figures:
    hit_rate: float | None
    kv_cache_usage: float | None
    queue_depth: float | None
    first_block_new_fraction: float | None = None
    scheduler_base: str | None = None
    hints: tuple[str, ...] = ()

    def as_status(self, as_of: str) -> dict[str, float | str | None]:
        """camelCase keys of ``status.metrics``."""
        return {
            "hitRate": self.hit_rate,
            "kvCacheUsage": self.kv_cache_usage,
            "queueDepth": self.queue_depth,
            "firstBlockNewFraction": self.first_block_new_fraction,
            "schedulerBase": self.scheduler_base,
            "asOf": as_of,
        }


def _scalar(client: PrometheusConnect, query: str, timeout_s: float) -> float | None:
    result = client.custom_query(query, timeout=timeout_s)  # type: ignore[arg-type]
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) or math.isinf(value) else round(value, 6)


def _hygiene_hints(
    client: PrometheusConnect, namespace: str, name: str, threshold: float, timeout_s: float
) -> tuple[str, ...]:
    """One hint per model whose new-first-block share is above ``threshold``."""
    query = promql.prefix_hygiene(promql.resource_scope(namespace, name), threshold)
    result = client.custom_query(query, timeout=timeout_s)  # type: ignore[arg-type]
    return tuple(
        sorted(
            hint(
                r["metric"].get("model", ""),
                float(r["value"][1]),
                Cause(r["metric"]["cause"]),
                None,
            )
            for r in result
            if r["metric"].get("cause") in Cause.__members__.values()
        )
    )


def _peek_engines(
    client: PrometheusConnect, namespace: str, name: str, timeout_s: float
) -> tuple[str | None, tuple[str, ...]]:
    """The vLLM scheduler base PEEK runs on ("AsyncScheduler", or each base with its engine
    count when engines differ) and a hint per reason some engines keep vLLM's order."""
    result = client.custom_query(  # type: ignore[arg-type]
        promql.peek_engines(namespace, name), timeout=timeout_s
    )
    bases: dict[str, int] = {}
    fallbacks: dict[str, int] = {}
    for row in result:
        count = int(float(row["value"][1]))
        base, fallback = row["metric"].get("base", ""), row["metric"].get("fallback", "")
        bases[base] = bases.get(base, 0) + count
        if fallback:
            fallbacks[fallback] = fallbacks.get(fallback, 0) + count
    if not bases:
        return None, ()
    base = (
        next(iter(bases))
        if len(bases) == 1
        else ", ".join(f"{b} ({n})" for b, n in sorted(bases.items()))
    )
    hints = tuple(
        f"PEEK keeps vLLM's own order on {n} engine(s): {reason}; see docs/peek.md (Compatibility)"
        for reason, n in sorted(fallbacks.items())
    )
    return base, hints


def query(
    url: str,
    namespace: str,
    name: str,
    timeout_s: float,
    hygiene_threshold: float = defaults.FIRST_BLOCK_NEW_THRESHOLD,
) -> Figures:
    """Query the figures of one PrefixServing; raises :class:`MetricsUnavailable`."""
    # No retries: a slow or missing Prometheus must cost at most one timeout per query.
    client = PrometheusConnect(url=url, disable_ssl=True, retry=Retry(total=0, read=False))
    try:
        base, peek_hints = _peek_engines(client, namespace, name, timeout_s)
        return Figures(
            hit_rate=_scalar(client, promql.prefix_cache_hit_rate(namespace, name), timeout_s),
            kv_cache_usage=_scalar(client, promql.kv_cache_usage(namespace, name), timeout_s),
            queue_depth=_scalar(client, promql.queue_depth_per_replica(namespace, name), timeout_s),
            first_block_new_fraction=_scalar(
                client, promql.first_block_new_fraction(namespace, name), timeout_s
            ),
            scheduler_base=base,
            hints=peek_hints
            + _hygiene_hints(client, namespace, name, hygiene_threshold, timeout_s),
        )
    except requests.Timeout as exc:
        raise MetricsUnavailable(
            f"Prometheus at {url} did not answer within {timeout_s:g}s"
        ) from exc
    except requests.RequestException as exc:
        raise MetricsUnavailable(
            f"Prometheus at {url} is unreachable: {type(exc).__name__}"
        ) from exc
    except PrometheusApiClientException as exc:
        raise MetricsUnavailable(f"Prometheus at {url} refused the query: {exc}") from exc
