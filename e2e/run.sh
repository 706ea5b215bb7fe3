#!/usr/bin/env bash
# End-to-end run on a local kind cluster: create the cluster, build the images and smoke-test
# them (e2e/images_smoke.sh), load them, install the chart, run e2e/ with pytest. Needs docker
# and kind; helm and kubectl come from scripts/setup.sh (.tools/bin) or PATH.
#
#   bash e2e/run.sh                 # create (or reuse) the cluster, then test
#   KEEP_CLUSTER=0 bash e2e/run.sh  # delete the cluster afterwards
#   SKIP_IMAGES=1 bash e2e/run.sh   # reuse images already loaded into the cluster
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CLUSTER="${CLUSTER:-prefixserving-e2e}"
NAMESPACE="${NAMESPACE:-prefixserving-system}"
REGISTRY="${REGISTRY:-ghcr.io/prefixserving}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
export PATH="$ROOT/.tools/bin:$ROOT/.venv/bin:$PATH"

need() {
  command -v "$1" >/dev/null || { echo "e2e: '$1' is not installed. $2" >&2; exit 2; }
}
need docker "Install Docker Engine: https://docs.docker.com/engine/install/"
need kind "Install kind: go install sigs.k8s.io/kind@v0.27.0 (or see https://kind.sigs.k8s.io/docs/user/quick-start/)"
need helm "Run: bash scripts/setup.sh"
need kubectl "Run: bash scripts/setup.sh"
[ -x .venv/bin/pytest ] || { echo "e2e: run 'bash scripts/setup.sh' first" >&2; exit 2; }

if ! kind get clusters | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --wait 180s
fi
KUBECONFIG_FILE="$(mktemp)"
trap 'rm -f "$KUBECONFIG_FILE"' EXIT
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG_FILE"
export KUBECONFIG="$KUBECONFIG_FILE"

if [ "${SKIP_IMAGES:-0}" != "1" ]; then
  make images REGISTRY="$REGISTRY"
  REGISTRY="$REGISTRY" bash e2e/images_smoke.sh
  for image in engine router operator; do
    kind load docker-image "$REGISTRY/$image:$VERSION" --name "$CLUSTER"
  done
fi

helm upgrade --install prefixserving charts/prefixserving-operator \
  --namespace "$NAMESPACE" --create-namespace \
  --set image.repository="$REGISTRY/operator" --set image.tag="$VERSION" \
  --set image.pullPolicy=Never --wait --timeout 5m
kubectl -n "$NAMESPACE" rollout status deployment --timeout=180s

status=0
.venv/bin/pytest -q -rs e2e "$@" || status=$?

if [ "$status" != "0" ]; then
  echo "e2e failed; operator logs:" >&2
  kubectl -n "$NAMESPACE" logs deployment/prefixserving-prefixserving-operator --tail=200 >&2 || \
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/name=prefixserving-operator --tail=200 >&2 || true
fi
if [ "${KEEP_CLUSTER:-1}" = "0" ]; then
  kind delete cluster --name "$CLUSTER"
fi
exit "$status"
