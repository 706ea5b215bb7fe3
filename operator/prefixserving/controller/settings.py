"""Operator settings, read from the environment (``prefixserving operator`` turns its flags into
these variables before kopf imports the handlers), and the kopf start-up configuration.

=====================================  =========================================  =========
Variable                               Meaning                                    Default
=====================================  =========================================  =========
``PREFIXSERVING_NAMESPACES``           comma-separated namespaces to watch;       (all)
                                       empty means every namespace
``PREFIXSERVING_PROMETHEUS_URL``       Prometheus for ``status.metrics``;         (none)
                                       empty disables the metrics block
``PREFIXSERVING_PROMETHEUS_TIMEOUT_S`` per-query timeout                          5
``PREFIXSERVING_LOG_FORMAT``           ``json`` or ``text``                       text
``PREFIXSERVING_PEERING``              kopf peering name for active-passive HA;   (none:
                                       empty runs standalone                      standalone)
``PREFIXSERVING_HEALTH_PORT``          liveness endpoint port (``/healthz``)       8081
``PREFIXSERVING_STATUS_INTERVAL_S``    children -> status refresh period          30
``PREFIXSERVING_METRICS_INTERVAL_S``   Prometheus -> status.metrics period        30
``PREFIXSERVING_RESYNC_INTERVAL_S``    full re-apply of every resource's          300
                                       children (catches missed events, KEDA
                                       installed later, refused children)
=====================================  =========================================  =========
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import kopf

from prefixserving import constants

ENV_PREFIX = "PREFIXSERVING_"
# No handler needs a finalizer (see main.py). The name stays configured so that kopf removes
# the finalizer that earlier operator builds put on every PrefixServing.
FINALIZER = f"{constants.GROUP}/finalizer"
WATCH_SERVER_TIMEOUT_S = 300
WATCH_CLIENT_TIMEOUT_S = 330
WATCH_CONNECT_TIMEOUT_S = 30
# Threads of kopf's sync handlers, and again of the periodic jobs (controller/periodic.py).
MAX_WORKERS = 16


@dataclass(frozen=True)
class Settings:
    """Everything the operator can be told; see the module docstring for the variables."""

    namespaces: tuple[str, ...] = ()
    prometheus_url: str = ""
    prometheus_timeout_s: float = 5.0
    log_format: str = "text"
    peering: str = ""
    health_port: int = constants.OPERATOR_HEALTH_PORT
    status_interval_s: float = 30.0
    metrics_interval_s: float = 30.0
    resync_interval_s: float = 300.0

    @property
    def all_namespaces(self) -> bool:
        return not self.namespaces


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """Read :class:`Settings` from ``environ`` (default: the process environment)."""
    env = os.environ if environ is None else environ

    def get(name: str, default: str) -> str:
        return env.get(ENV_PREFIX + name, "").strip() or default

    default = Settings()
    log_format = get("LOG_FORMAT", default.log_format)
    if log_format not in ("text", "json"):
        raise ValueError(f"{ENV_PREFIX}LOG_FORMAT must be 'text' or 'json', not {log_format!r}")
    namespaces = tuple(ns.strip() for ns in get("NAMESPACES", "").split(",") if ns.strip())
    return Settings(
        namespaces=namespaces,
        prometheus_url=get("PROMETHEUS_URL", default.prometheus_url),
        prometheus_timeout_s=float(get("PROMETHEUS_TIMEOUT_S", str(default.prometheus_timeout_s))),
        log_format=log_format,
        peering=get("PEERING", default.peering),
        health_port=int(get("HEALTH_PORT", str(default.health_port))),
        status_interval_s=float(get("STATUS_INTERVAL_S", str(default.status_interval_s))),
        metrics_interval_s=float(get("METRICS_INTERVAL_S", str(default.metrics_interval_s))),
        resync_interval_s=float(get("RESYNC_INTERVAL_S", str(default.resync_interval_s))),
    )


def to_environ(settings: Settings) -> dict[str, str]:
    """The variables that make :func:`load` return ``settings`` (used by the CLI)."""
    return {
        ENV_PREFIX + "NAMESPACES": ",".join(settings.namespaces),
        ENV_PREFIX + "PROMETHEUS_URL": settings.prometheus_url,
        ENV_PREFIX + "PROMETHEUS_TIMEOUT_S": str(settings.prometheus_timeout_s),
        ENV_PREFIX + "LOG_FORMAT": settings.log_format,
        ENV_PREFIX + "PEERING": settings.peering,
        ENV_PREFIX + "HEALTH_PORT": str(settings.health_port),
        ENV_PREFIX + "STATUS_INTERVAL_S": str(settings.status_interval_s),
        ENV_PREFIX + "METRICS_INTERVAL_S": str(settings.metrics_interval_s),
        ENV_PREFIX + "RESYNC_INTERVAL_S": str(settings.resync_interval_s),
    }


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: Settings) -> None:
    """Finalizer and progress/diff-base storage under the operator's API group, watch timeouts,
    worker pool, peering, and quieter kopf Events (the operator posts its own)."""
    kopf_settings.persistence.finalizer = FINALIZER
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=constants.GROUP
    )
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=constants.GROUP, key="last-handled-configuration"
    )
    kopf_settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    kopf_settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_S
    kopf_settings.watching.connect_timeout = WATCH_CONNECT_TIMEOUT_S
    kopf_settings.execution.max_workers = MAX_WORKERS
    kopf_settings.posting.level = logging.WARNING
    if settings.peering:
        kopf_settings.peering.name = settings.peering
        kopf_settings.peering.standalone = False
        kopf_settings.peering.mandatory = True
        kopf_settings.peering.clusterwide = settings.all_namespaces
    else:
        kopf_settings.peering.standalone = True
