#!/usr/bin/env bash
# Smoke test of the built images (after `make images`), on a machine with Docker. It checks what
# tests/test_images.py cannot without a Docker engine: the images as built on their real base
# images (python:3.12 slim, vllm/vllm-openai with vLLM 0.33).
#
#   make images && bash e2e/images_smoke.sh
#   GPU=1 bash e2e/images_smoke.sh   # also build the PEEK scheduler in the engine image (--gpus all)
#
# Each image runs what it runs in a cluster: the operator renders every PrefixServing example from
# its packaged templates, the router and the operator start (--help), and the engine image loads
# the scheduler class the operator passes to --scheduler-cls.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REGISTRY="${REGISTRY:-ghcr.io/prefixserving}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
export PATH="$ROOT/.venv/bin:$PATH"
command -v docker >/dev/null || { echo "images smoke: install Docker Engine first" >&2; exit 2; }
[ -x .venv/bin/python ] || { echo "images smoke: run 'bash scripts/setup.sh' first" >&2; exit 2; }
SCHEDULER_CLS="$(.venv/bin/python -c 'from prefixserving import constants; print(constants.PEEK_SCHEDULER_CLS)')"

operator="$REGISTRY/operator:$VERSION"
router="$REGISTRY/router:$VERSION"
engine="$REGISTRY/engine:$VERSION"

docker run --rm "$operator" --help >/dev/null
docker run --rm "$router" --help >/dev/null
# router --kv-events: its extra (ZMQ, msgspec, cbor2, transformers) is installed
docker run --rm --entrypoint python "$router" -c \
  "from prefixserving.router.kv_events import hashing, subscriber, tokens; import transformers"
for example in examples/*.yaml; do
  grep -q '^kind: PrefixServing' "$example" || continue  # a ScalingPolicy preset alone renders nothing
  rendered="$(docker run --rm -v "$ROOT/examples:/examples:ro" --entrypoint prefixserving \
    "$operator" render -f "/examples/$(basename "$example")")"
  grep -q '^kind: Deployment' <<<"$rendered" \
    || { echo "images smoke: $operator rendered no Deployment for $example" >&2; exit 1; }
done

# vLLM seeds block hashes with PYTHONHASHSEED: an image that sets it would make the engines'
# hashes differ from what routers with --kv-events compute (router.kvEvents, docs/router.md).
if docker run --rm --entrypoint printenv "$engine" PYTHONHASHSEED >/dev/null; then
  echo "images smoke: $engine sets PYTHONHASHSEED; router.kvEvents needs it unset" >&2; exit 1
fi

if [ "${GPU:-0}" = "1" ]; then
  # vLLM's own loader builds the class, as the engine core does (tests/support/engine_image_check.py).
  docker run --rm --gpus all -v "$ROOT/tests/support/engine_image_check.py:/check.py:ro" \
    --entrypoint python3 "$engine" -P /check.py "$SCHEDULER_CLS"
else
  docker run --rm --entrypoint python3 "$engine" -c \
    "import importlib; m, _, n = '$SCHEDULER_CLS'.rpartition('.'); getattr(importlib.import_module(m), n)"
fi
echo "images smoke: $operator, $router and $engine run"
