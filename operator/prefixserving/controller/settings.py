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
``PREFIXSERVING_PEERING_PRIORITY``     kopf peering priority; the live peer with  (start
                                       the highest one is the active operator     time, µs)
``PREFIXSERVING_PEERING_CHECK_S``      how often the periodic jobs re-read the    5
                                       peering object (see ``controller/
                                       activity.py``)
``PREFIXSERVING_HEALTH_PORT``          liveness endpoint port (``/healthz``)       8081
``PREFIXSERVING_STATUS_INTERVAL_S``    children -> status refresh period          30
``PREFIXSERVING_METRICS_INTERVAL_S``   Prometheus -> status.metrics period        30
``PREFIXSERVING_RESYNC_INTERVAL_S``    full re-apply of every resource's          300
                                       children (catches missed events, KEDA
                                       installed later, refused children)
=====================================  =========================================  =========

Peering priority (active-passive HA): kopf makes the live peer with the highest priority the
active operator and pauses the others; peers with the *same* priority pause each other (all
of them: nothing reconciles). So every replica needs its own priority, and without
``--priority`` it is the operator's start time in microseconds since the epoch
(:func:`start_priority`): distinct for every replica without any coordination (two pods would
have to start within the same microsecond), and the newest replica wins. During a rolling
upgrade the new pod, running the new version, takes over the moment it registers (kopf pauses
the old one on the peering event, no lifetime to wait out). A tie (equal explicit
``--priority`` values, or the same microsecond) pauses every tied replica, as kopf does, and
kopf logs "Possibly conflicting operators with the same priority"; delete one of the pods and
its replacement gets a new start time. The values stay below 2**53, so they survive JSON
clients that read numbers as doubles.
"""

from __future__ import annotations

import logging
import os
import time
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
# kopf peering: a peer whose keep-alive is older than this is dead (kopf's default, written
# down here so that the docs can name it); kopf renews it every lifetime minus 5-10 s.
PEERING_LIFETIME_S = 60
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
    peering_priority: int | None = None  # None: start_priority() when the operator starts
    peering_check_s: float = 5.0
    health_port: int = constants.OPERATOR_HEALTH_PORT
    status_interval_s: float = 30.0
    metrics_interval_s: float = 30.0
    resync_interval_s: float = 300.0

    @property
    def all_namespaces(self) -> bool:
        return not self.namespaces


def start_priority() -> int:
    """The default peering priority: now, in microseconds since the epoch (see the module
    docstring for why)."""
    return time.time_ns() // 1000


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
    priority = get("PEERING_PRIORITY", "")
    try:
        peering_priority = int(priority) if priority else default.peering_priority
    except ValueError:
        raise ValueError(
            f"{ENV_PREFIX}PEERING_PRIORITY must be an integer, not {priority!r}; "
            "leave it empty to use the start time"
        ) from None
    return Settings(
        namespaces=namespaces,
        prometheus_url=get("PROMETHEUS_URL", default.prometheus_url),
        prometheus_timeout_s=float(get("PROMETHEUS_TIMEOUT_S", str(default.prometheus_timeout_s))),
        log_format=log_format,
        peering=get("PEERING", default.peering),
        peering_priority=peering_priority,
        peering_check_s=float(get("PEERING_CHECK_S", str(default.peering_check_s))),
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
        ENV_PREFIX + "PEERING_PRIORITY": (
            "" if settings.peering_priority is None else str(settings.peering_priority)
        ),
        ENV_PREFIX + "PEERING_CHECK_S": str(settings.peering_check_s),
        ENV_PREFIX + "HEALTH_PORT": str(settings.health_port),
        ENV_PREFIX + "STATUS_INTERVAL_S": str(settings.status_interval_s),
        ENV_PREFIX + "METRICS_INTERVAL_S": str(settings.metrics_interval_s),
        ENV_PREFIX + "RESYNC_INTERVAL_S": str(settings.resync_interval_s),
    }


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: Settings) -> None:
    """Finalizer and progress/diff-base storage under the operator's API group, watch timeouts,
    worker pool, peering (name, scope, lifetime and this replica's priority: the explicit one,
    else :func:`start_priority` now), and quieter kopf Events (the operator posts its own)."""
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
        kopf_settings.peering.lifetime = PEERING_LIFETIME_S
        kopf_settings.peering.priority = (
            start_priority() if settings.peering_priority is None else settings.peering_priority
        )
    else:
        kopf_settings.peering.standalone = True
