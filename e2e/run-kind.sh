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
# Operator image, chart, examples (docs/helm.md shows the same commands).
# ---------------------------------------------------------------------------------------
IMAGE="localhost/joblease-operator:e2e"
HELM="${HELM:-$(command -v helm || echo "$HOME/.cache/joblease/bin/helm-v4.3.2/helm")}"
K() { kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }
DOCKER_BUILDKIT=1 docker build -t "$IMAGE" "$ROOT"
kind load docker-image "$IMAGE" --name "$NAME"
"$HELM" --kubeconfig "$KUBECONFIG_FILE" upgrade --install jl "$ROOT/charts/joblease-operator" \
  -n joblease-system --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Never --wait --timeout 180s \
  --set 'admission.exemptGroups[0]=system:masters' \
  --set 'admission.exemptGroups[1]=kubeadm:cluster-admins'  # the suite below claims as kind's
# admin for other holders; kind's admin (kubeadm >= 1.29) is in kubeadm:cluster-admins, not
# system:masters (its certificate: O = kubeadm:cluster-admins, CN = kubernetes-admin).
K -n joblease-system rollout status deployment/jl-joblease-operator --timeout=120s

# Examples: a throwaway PostgreSQL, the worker Deployment; the fence table must show rows
# from exactly one token at a time, and a deleted holder must be followed by generation+1.
K create namespace joblease-examples --dry-run=client -o yaml | K apply -f -
K -n joblease-examples create deployment pg --image=postgres:17.6-bookworm --port=5432 \
  --dry-run=client -o yaml | K apply -f -
K -n joblease-examples set env deployment/pg POSTGRES_PASSWORD=e2e
K -n joblease-examples expose deployment pg --port=5432 --dry-run=client -o yaml | K apply -f -
K -n joblease-examples rollout status deployment/pg --timeout=180s
K -n joblease-examples create secret generic joblease-db \
  --from-literal=url=postgresql://postgres:e2e@pg:5432/postgres --dry-run=client -o yaml | K apply -f -
K -n joblease-examples create configmap joblease-worker \
  --from-file=worker.py="$ROOT/examples/worker.py" --dry-run=client -o yaml | K apply -f -
sed "s#ghcr.io/joblease/joblease-operator:0.1.0#$IMAGE#" "$ROOT/examples/worker-deployment.yaml" \
  | K -n joblease-examples apply -f "$ROOT/examples/jobleases.yaml" -f -
K -n joblease-examples rollout status deployment/report-worker --timeout=180s
gen() { K -n joblease-examples get jl nightly-report -o jsonpath='{.status.generation}'; }
for _ in $(seq 60); do [[ "$(gen)" -ge 1 ]] && break; sleep 2; done
first="$(gen)"; holder="$(K -n joblease-examples get jl nightly-report -o jsonpath='{.status.holder}')"
echo "e2e: nightly-report held by $holder at generation $first"
pod="$(echo "$holder" | cut -d/ -f2)"
K -n joblease-examples delete pod "$pod" --wait=true
for _ in $(seq 60); do [[ "$(gen)" -gt "$first" ]] && break; sleep 2; done
[[ "$(gen)" -eq $((first + 1)) ]] || { echo "e2e: no takeover at generation $((first + 1))" >&2; exit 1; }
echo "e2e: taken over at generation $(gen) after deleting $pod"

cd "$ROOT"
JOBLEASE_E2E_KUBECONFIG="$KUBECONFIG_FILE" .venv/bin/pytest tests -m cluster "$@"
