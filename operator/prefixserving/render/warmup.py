"""Template values of the warm-up sidecar (a native sidecar in the engine pod), its prompts
ConfigMap and the projected API token it posts its timeout Event with. Pure."""

from __future__ import annotations

import json
from typing import Any

from prefixserving import constants
from prefixserving.api import names
from prefixserving.api.types import PrefixServing

# The sidecar reads its prompts from this file (mounted from a ConfigMap).
WARMUP_DIR, WARMUP_FILE = constants.WARMUP_PROMPTS_FILE.rsplit("/", 1)
WARMUP_CPU = "100m"
WARMUP_MEMORY = "256Mi"
# Where in-cluster clients look for the service account token (only the sidecar mounts it).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_EXPIRATION_S = 3600


def handover_selector(name: str) -> str:
    """The label selector of the engine pods, as ``prefixserving warmup --handover-selector``
    takes it."""
    return names.label_selector(names.engine_selector(name))


def warmup_context(resource: PrefixServing) -> dict[str, Any] | None:
    """Values of the warm-up sidecar, its ConfigMap and token; None when warm-up is off."""
    spec, name = resource.spec, resource.metadata.name
    warmup = spec.warmup
    if not warmup.enabled:
        return None
    ref = warmup.config_map_ref
    prompts = [p.model_dump(by_alias=True, exclude_none=True) for p in warmup.prompts]
    return {
        "image": warmup.image,
        "args": [
            "--engine-url",
            f"http://127.0.0.1:{constants.ENGINE_PORT}",
            "--prompts-file",
            constants.WARMUP_PROMPTS_FILE,
            "--router-url",
            names.router_url(name, resource.metadata.namespace),
            "--hot-prefixes",
            str(warmup.hot_prefixes),
            "--timeout-s",
            str(warmup.timeout_seconds),
            "--self-url",
            f"http://$(POD_IP):{constants.ENGINE_PORT}",
            "--port",
            str(constants.WARMUP_PORT),
            "--model",
            spec.model.served_name,
            *(["--handover-selector", handover_selector(name)] if warmup.handover else []),
        ],
        "env": [
            {"name": env, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for env, path in (
                (constants.ENV_POD_IP, "status.podIP"),
                (constants.ENV_POD_NAME, "metadata.name"),
                (constants.ENV_POD_NAMESPACE, "metadata.namespace"),
                (constants.ENV_POD_UID, "metadata.uid"),
                (
                    constants.ENV_POD_TEMPLATE_HASH,
                    f"metadata.labels['{constants.LABEL_POD_TEMPLATE_HASH}']",
                ),
            )
        ],
        "handover": warmup.handover,
        "service_account_dir": SERVICE_ACCOUNT_DIR,
        "token_expiration_s": TOKEN_EXPIRATION_S,
        "port": constants.WARMUP_PORT,
        "inline": ref is None,
        "configmap": ref.name if ref is not None else names.warmup_configmap(name),
        "configmap_key": ref.key if ref is not None else WARMUP_FILE,
        "prompts_json": json.dumps(prompts, indent=2, sort_keys=True, ensure_ascii=False),
        "mount_path": WARMUP_DIR,
        "file": WARMUP_FILE,
        "resources": {"cpu": WARMUP_CPU, "memory": WARMUP_MEMORY},
    }
