"""``prefixserving router``: run the prefix router in front of vLLM engines, or (``--mode
endpoint-picker``) the endpoint picker a gateway asks for each request (``router.picker``).

With ``--workers N`` (N > 1) uvicorn binds the port once and starts N worker processes that
accept from it; the parent checks the flags, then hands them to the workers as JSON in the
``PREFIXSERVING_ROUTER_SETTINGS`` environment variable, and each worker builds its own router
with :func:`app_from_environment`. :class:`RouterSettings` is the one list of the settings that
shape a router; the command's other flags (address, log format, workers) shape the process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prefixserving import constants
from prefixserving.router.policies.registry import DEFAULT_POLICY, POLICY_NAMES
from prefixserving.router.prefix_hashing import (
    DEFAULT_BLOCK_CHARS,
    DEFAULT_PREFIX_BLOCKS,
    KeyConfig,
)

if TYPE_CHECKING:
    from prefixserving.router.app import Router, RouterApp

POLICIES = tuple(name.replace("_", "-") for name in POLICY_NAMES)
MODES = ("proxy", "endpoint-picker")
SETTINGS_ENV = "PREFIXSERVING_ROUTER_SETTINGS"
# Policies with a load bound (the others balance without affinity).
_BOUNDED_POLICIES = {"prefix-affinity", "two-choice"}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def log_config(log_format: str) -> dict[str, Any]:
    """A ``logging.config`` dict for the router and uvicorn, as text or JSON lines."""
    formatter: dict[str, Any] = (
        {"()": _JsonFormatter}
        if log_format == "json"
        else {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "default"}},
        "root": {"handlers": ["stderr"], "level": "INFO"},
        "loggers": {"uvicorn": {"level": "INFO"}, "aiohttp": {"level": "WARNING"}},
    }


@dataclass(frozen=True)
class RouterSettings:
    """The settings of ``prefixserving router`` that shape a router (one field per flag)."""

    backends: tuple[str, ...] = ()
    dns: str | None = None
    identity_port: int | None = None
    policy: str = DEFAULT_POLICY.replace("_", "-")
    load_bound: float = constants.ROUTER_LOAD_BOUND
    prefix_blocks: int = DEFAULT_PREFIX_BLOCKS
    block_chars: int = DEFAULT_BLOCK_CHARS
    model: str | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    scrape_interval_s: float = 1.0
    no_engine_hold_seconds: float = 0.0
    kv_events: bool = False
    kv_events_port: int = constants.KV_EVENTS_PORT
    kv_events_replay_port: int = constants.KV_EVENTS_REPLAY_PORT
    kv_events_block_size: int = 16
    kv_events_hash_seed: str = constants.KV_EVENTS_HASH_SEED
    kv_events_max_blocks: int = 200_000
    tokenizer: str | None = None
    tokenizer_revision: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "backends", tuple(self.backends))  # JSON gives a list


_DEFAULTS = RouterSettings()


def _parse_dns(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    name, sep, port = value.rpartition(":")
    if not sep or not name or not port.isdigit():
        raise ValueError(
            f"--dns {value!r}: expected NAME:PORT, "
            "e.g. --dns my-model-engine.default.svc.cluster.local:8000"
        )
    return name, int(port)


@click.command()
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=constants.ROUTER_PORT, show_default=True, type=int, help="Port.")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="URL",
    help="Engine base URL, e.g. http://127.0.0.1:8000 (repeat for each engine).",
)
@click.option(
    "--dns",
    metavar="NAME:PORT",
    help="Headless Service of the engines, resolved continuously (Ready pods only).",
)
@click.option(
    "--identity-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Warm-up sidecar port of the engine pods: rank each engine by the routing identity "
    "its sidecar reports (a pod that replaced another in a rolling update takes that pod's "
    "place). Rendered by the operator when spec.warmup.handover is on.",
)
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    default=_DEFAULTS.policy,
    show_default=True,
)
@click.option(
    "--load-bound",
    type=float,
    default=_DEFAULTS.load_bound,
    show_default=True,
    help=(
        "Largest load relative to the mean before a heavy prefix (a popular document or "
        "system prompt) spills to its next backend; light prefixes get up to 2.0."
    ),
)
@click.option(
    "--prefix-blocks",
    type=click.IntRange(min=1),
    default=_DEFAULTS.prefix_blocks,
    show_default=True,
    help="Depth of the prefix key, in blocks.",
)
@click.option(
    "--block-chars",
    type=click.IntRange(min=4),
    default=_DEFAULTS.block_chars,
    show_default=True,
    help="Characters per key block (token prompts: a quarter as many ids).",
)
@click.option(
    "--model",
    metavar="NAME",
    help="Base model name; any other 'model' value is keyed as a LoRA adapter of its own.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=_DEFAULTS.max_body_bytes,
    show_default=True,
    help="Largest request body; bigger ones answer 413.",
)
@click.option(
    "--scrape-interval-s",
    type=click.FloatRange(min=0.05),
    default=_DEFAULTS.scrape_interval_s,
    show_default=True,
    help="How often each engine's /metrics is read for its queue and KV usage.",
)
@click.option(
    "--no-engine-hold-seconds",
    type=click.FloatRange(min=0),
    default=_DEFAULTS.no_engine_hold_seconds,
    show_default=True,
    help="While no engine is Ready, hold each request this long for one to start, then 503 "
    "with Retry-After (0: 503 at once). For scale from zero (autoscaling.minReplicas: 0).",
)
@click.option(
    "--kv-events/--no-kv-events",
    default=False,
    show_default=True,
    help="Follow the engines' KV cache events (vLLM --kv-events-config, ZMQ) and prefer the "
    "engine that holds the most leading blocks of each request; needs --tokenizer and the "
    f"engines' --prefix-caching-hash-algo {constants.KV_EVENTS_HASH_ALGO}.",
)
@click.option(
    "--kv-events-port",
    type=click.IntRange(1, 65535),
    default=_DEFAULTS.kv_events_port,
    show_default=True,
    help="The engines' KV event publisher port (on each engine's address).",
)
@click.option(
    "--kv-events-replay-port",
    type=click.IntRange(1, 65535),
    default=_DEFAULTS.kv_events_replay_port,
    show_default=True,
    help="The engines' KV event replay port, asked after missed events.",
)
@click.option(
    "--kv-events-block-size",
    type=click.IntRange(min=1),
    default=_DEFAULTS.kv_events_block_size,
    show_default=True,
    help="The engines' KV block size in tokens (vLLM --block-size; 16 on GPUs).",
)
@click.option(
    "--kv-events-hash-seed",
    default=_DEFAULTS.kv_events_hash_seed,
    show_default=True,
    help="The engines' PYTHONHASHSEED if they set one (vLLM seeds block hashes with it).",
)
@click.option(
    "--kv-events-max-blocks",
    type=click.IntRange(min=1),
    default=_DEFAULTS.kv_events_max_blocks,
    show_default=True,
    help="Block hashes kept per engine (about 150 bytes each); the oldest go first.",
)
@click.option(
    "--tokenizer",
    metavar="NAME_OR_PATH",
    help="--kv-events: the engines' Hugging Face tokenizer (model name or folder).",
)
@click.option(
    "--tokenizer-revision",
    metavar="REVISION",
    help="--kv-events: the branch, tag or commit of --tokenizer on the Hub (the engines' "
    "--revision).",
)
@click.option(
    "--log-format", type=click.Choice(("text", "json")), default="text", show_default=True
)
@click.option(
    "--mode",
    type=click.Choice(MODES),
    default="proxy",
    show_default=True,
    help="proxy: serve the OpenAI API and forward each request; endpoint-picker: answer a "
    "gateway's ext_proc stream with the engine to use (docs/gateway.md).",
)
@click.option(
    "--grpc-port",
    default=constants.PICKER_GRPC_PORT,
    show_default=True,
    type=int,
    help="endpoint-picker: port of the ext_proc and gRPC health services.",
)
@click.option(
    "--secure-serving/--no-secure-serving",
    default=constants.PICKER_SECURE_SERVING,
    show_default=True,
    help="endpoint-picker: TLS on the gRPC port (self-signed unless --tls-cert-file is given).",
)
@click.option(
    "--tls-cert-file",
    type=click.Path(exists=True, dir_okay=False),
    help="endpoint-picker: PEM certificate for the gRPC port (with --tls-key-file).",
)
@click.option(
    "--tls-key-file",
    type=click.Path(exists=True, dir_okay=False),
    help="endpoint-picker: PEM private key of --tls-cert-file.",
)
@click.option(
    "--shed-waiting-requests",
    type=click.IntRange(min=0),
    default=constants.PICKER_SHED_WAITING_REQUESTS,
    show_default=True,
    help="endpoint-picker: answer 429 when every engine has this many requests waiting (0: never).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes serving the port, each with its own backend pool, in-flight counts and "
    "metrics (see docs/router.md, Performance); more router replicas scale the same way.",
)
def router(
    host: str,
    port: int,
    log_format: str,
    workers: int,
    mode: str,
    grpc_port: int,
    secure_serving: bool,
    tls_cert_file: str | None,
    tls_key_file: str | None,
    shed_waiting_requests: int,
    **options: Any,
) -> None:
    """Route OpenAI requests to the engine that has their prefix cached.

    \b
    Local:      prefixserving router --backend http://127.0.0.1:8000 --backend http://127.0.0.1:8001
    Kubernetes: prefixserving router --dns my-model-engine.ns.svc.cluster.local:8000
    Gateway:    prefixserving router --mode endpoint-picker --dns NAME:PORT (docs/gateway.md)
    """
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from prefixserving.router.server import uvicorn_config

    settings = RouterSettings(**options)
    if bool(settings.backends) == (settings.dns is not None):
        raise click.UsageError(
            "give the engines either as --backend URL (repeatable) or as --dns NAME:PORT"
        )
    if mode == "endpoint-picker":
        if workers != 1:
            raise click.UsageError("--workers applies to --mode proxy only")
        tls = _tls(secure_serving, tls_cert_file, tls_key_file)
        _run_picker(settings, host, port, grpc_port, tls, shed_waiting_requests, log_format)
        return
    try:
        app = build_router_app(settings)  # also checks the settings before any worker starts
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    logs = log_config(log_format)
    if workers == 1:
        uvicorn.Server(uvicorn_config(app, host=host, port=port, log_config=logs)).run()
        return
    os.environ[SETTINGS_ENV] = json.dumps(dataclasses.asdict(settings))
    factory = f"{__name__}:{app_from_environment.__name__}"
    config = uvicorn_config(factory, host=host, port=port, log_config=logs, workers=workers)
    Multiprocess(config, sockets=[config.bind_socket()]).run()


def _tls(secure: bool, cert_file: str | None, key_file: str | None) -> tuple[bytes, bytes] | None:
    """``(key, certificate)`` PEM for the picker's gRPC port, or None for plaintext."""
    if (cert_file is None) != (key_file is None):
        raise click.UsageError("give --tls-cert-file and --tls-key-file together")
    if not secure:
        if cert_file is not None:
            raise click.UsageError("--tls-cert-file needs --secure-serving")
        return None
    if cert_file is not None and key_file is not None:
        return Path(key_file).read_bytes(), Path(cert_file).read_bytes()
    from prefixserving.router.picker.server import self_signed_certificate

    return self_signed_certificate()


def _run_picker(
    settings: RouterSettings,
    host: str,
    port: int,
    grpc_port: int,
    tls: tuple[bytes, bytes] | None,
    shed_waiting_requests: int,
    log_format: str,
) -> None:
    """Serve the endpoint picker (gRPC) and the admin routes (HTTP) until SIGTERM."""
    import asyncio
    import logging.config

    from prefixserving.router.picker.server import run
    from prefixserving.router.picker.stream import PickerConfig

    try:
        router = build_router(settings)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    logs = log_config(log_format)
    logging.config.dictConfig(logs)
    main = run(
        router,
        PickerConfig(shed_waiting_requests=shed_waiting_requests),
        host=host,
        grpc_port=grpc_port,
        http_port=port,
        tls=tls,
        log_config=logs,
    )
    try:
        import uvloop
    except ImportError:  # uvicorn[standard] brings it on Linux
        asyncio.run(main)
    else:
        uvloop.run(main)


def build_router(settings: RouterSettings) -> Router:
    """The router (pool, policy, key, metrics) from the command-line settings; ``ValueError``
    for bad ones. The HTTP router and the endpoint picker are built alike."""
    from prefixserving.router.app import Router, RouterConfig
    from prefixserving.router.backends import BackendPool, PoolConfig
    from prefixserving.router.policies.registry import make_policy

    s = settings
    policy_config: dict[str, Any] = (
        {"load_bound": s.load_bound, "max_depth_blocks": s.prefix_blocks}
        if s.policy in _BOUNDED_POLICIES
        else {}
    )
    pool = BackendPool(
        static=s.backends,
        dns=_parse_dns(s.dns),
        config=PoolConfig(scrape_interval_s=s.scrape_interval_s, identity_port=s.identity_port),
    )
    return Router(
        kv_events=_kv_events(s),
        pool=pool,
        policy=make_policy(s.policy, **policy_config),
        key_config=KeyConfig(
            block_chars=s.block_chars, prefix_blocks=s.prefix_blocks, base_model=s.model
        ),
        config=RouterConfig(
            max_body_bytes=s.max_body_bytes, no_engine_hold_s=s.no_engine_hold_seconds
        ),
    )


def _kv_events(s: RouterSettings) -> tuple[Any, Any] | None:
    """The KV event subscriptions and lookup of ``--kv-events`` (None without it)."""
    if not s.kv_events:
        return None
    if not s.tokenizer:
        raise ValueError(
            "--kv-events needs --tokenizer: the engines' model name or tokenizer folder, "
            "e.g. --tokenizer meta-llama/Llama-3.1-8B-Instruct"
        )
    try:
        from prefixserving.router.kv_events.hashing import BlockHasher
        from prefixserving.router.kv_events.index import KvIndex
        from prefixserving.router.kv_events.lookup import CachedBlocks
        from prefixserving.router.kv_events.subscriber import FeedConfig, KvEventSubscriptions
        from prefixserving.router.kv_events.tokens import RequestTokenizer
    except ImportError as error:
        raise ValueError(
            f"--kv-events needs {error.name}: pip install 'prefixserving[kv-events]'"
        ) from error
    index = KvIndex(s.kv_events_max_blocks)
    subscriptions = KvEventSubscriptions(
        index, FeedConfig(port=s.kv_events_port, replay_port=s.kv_events_replay_port)
    )
    lookup = CachedBlocks(
        index,
        BlockHasher(s.kv_events_block_size, s.kv_events_hash_seed),
        RequestTokenizer(
            s.tokenizer, s.kv_events_block_size * s.prefix_blocks, s.tokenizer_revision
        ),
        base_model=s.model,
    )
    return subscriptions, lookup


def build_router_app(settings: RouterSettings) -> RouterApp:
    """The router's ASGI app from the command-line settings; ``ValueError`` for bad ones."""
    from prefixserving.router.app import build_app

    return build_app(build_router(settings))


def app_from_environment() -> RouterApp:
    """The app of one ``--workers`` process, from the settings the parent left in
    ``PREFIXSERVING_ROUTER_SETTINGS``."""
    return build_router_app(RouterSettings(**json.loads(os.environ[SETTINGS_ENV])))
