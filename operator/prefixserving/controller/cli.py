"""``prefixserving operator``: run the operator (kopf) with settings from flags or environment.

Each flag overrides its ``PREFIXSERVING_*`` variable (see ``settings.py``); the chart passes
the flags. The command exports the resolved settings to the environment before kopf imports the
handlers (``prefixserving.controller.main``), then runs kopf until SIGTERM/SIGINT.
"""

from __future__ import annotations

import dataclasses
import importlib
import os

import click

from prefixserving.controller import settings as operator_settings

HANDLERS_MODULE = "prefixserving.controller.main"


@click.command("operator")
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Namespace to watch (repeat for several). Default: all namespaces.",
)
@click.option(
    "--all-namespaces",
    is_flag=True,
    help="Watch every namespace (the default when no --namespace is given).",
)
@click.option("--prometheus-url", default=None, help="Prometheus URL for status.metrics.")
@click.option(
    "--prometheus-timeout",
    "prometheus_timeout_s",
    type=float,
    default=None,
    help="Per-query Prometheus timeout in seconds (default 5).",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None, help="Log format.")
@click.option(
    "--peering",
    default=None,
    help="kopf peering name for active-passive HA (needs the KopfPeering CRDs). "
    "Default: standalone.",
)
@click.option(
    "--priority",
    "peering_priority",
    type=int,
    default=None,
    help="kopf peering priority: the live replica with the highest one is active. "
    "Default: the operator's start time in microseconds (the newest replica takes over).",
)
@click.option("--health-port", type=int, default=None, help="Liveness port (GET /healthz).")
@click.option("--verbose", is_flag=True, help="Debug logging.")
def operator(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    prometheus_url: str | None,
    prometheus_timeout_s: float | None,
    log_format: str | None,
    peering: str | None,
    peering_priority: int | None,
    health_port: int | None,
    verbose: bool,
) -> None:
    """Run the PrefixServing operator.

    \b
    Examples:
      prefixserving operator --all-namespaces --prometheus-url http://prometheus:9090
      prefixserving operator --namespace llm --namespace llm-staging --log-format json
    """
    if namespaces and all_namespaces:
        raise click.UsageError("use either --namespace or --all-namespaces, not both")
    base = operator_settings.load()
    overrides = {
        "namespaces": () if all_namespaces else (tuple(namespaces) or base.namespaces),
        "prometheus_url": prometheus_url,
        "prometheus_timeout_s": prometheus_timeout_s,
        "log_format": log_format,
        "peering": peering,
        "peering_priority": peering_priority,
        "health_port": health_port,
    }
    settings = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    os.environ.update(operator_settings.to_environ(settings))
    run(settings, verbose=verbose)


def run(settings: operator_settings.Settings, verbose: bool = False) -> None:
    """Configure logging and run kopf over the handlers module until stopped."""
    import kopf  # imported here so that `prefixserving --help` stays fast

    kopf.configure(
        debug=verbose,
        verbose=verbose,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
    )
    importlib.import_module(HANDLERS_MODULE)  # registers the handlers with kopf
    kopf.run(
        standalone=not settings.peering,
        peering_name=settings.peering or None,
        clusterwide=settings.all_namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz",
    )
