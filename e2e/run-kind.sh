#!/usr/bin/env bash
# Run the cluster tests against a kind cluster (needs Docker and kind on PATH).
# Usage: e2e/run-kind.sh [extra pytest args]   KEEP_CLUSTER=1 keeps the cluster afterwards.
set -euo pipefail

NAME="${KIND_CLUSTER_NAME:-joblease-e2e}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
KUBECONFIG_FILE="$(mktemp -t joblease-e2e-kubeconfig.XXXXXX)"

for tool in docker kind; do
  command -v "$tool" >/dev/null || { echo "e2e: '$tool' is not installed" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "e2e: no Docker engine reachable; kind cannot run" >&2; exit 2; }

cleanup() {
  rm -f "$KUBECONFIG_FILE"
  if [[ -z "${KEEP_CLUSTER:-}" ]]; then kind delete cluster --name "$NAME" || true; fi
}
trap cleanup EXIT

kind get clusters | grep -qx "$NAME" || kind create cluster --name "$NAME" --wait 120s
kind get kubeconfig --name "$NAME" > "$KUBECONFIG_FILE"   # current context: kind-$NAME

# ---------------------------------------------------------------------------------------
# LATER STEPS GO HERE (added by others): build the operator image, `kind load
# docker-image`, `helm install` the chart and wait for the operator to be Ready.
# ---------------------------------------------------------------------------------------

cd "$ROOT"
JOBLEASE_E2E_KUBECONFIG="$KUBECONFIG_FILE" .venv/bin/pytest tests -m cluster "$@"
