#!/usr/bin/env bash
# kind end-to-end: builds the image, loads it into a kind cluster, installs the pinned GAIE CRDs,
# applies the manifests and runs the 6-step validation (e2e-validate.ts, through kubectl).
# Needs docker, kind, kubectl and bun; without docker or kind it says so and exits 0 ("skipped"):
# CI runs the same scenario without a cluster: packages/cluster-sim (bun test packages/cluster-sim).
#
# Environment:
#   GAIE_CRDS     URL or local path of the GAIE manifests (default: the pinned release below)
#   OVERLAY       kustomization to apply, relative to the repo root (default deploy/base)
#   KIND_CLUSTER  cluster name (default kv-epp-e2e); an existing cluster of that name is reused
#   KEEP_CLUSTER  1 keeps the cluster afterwards (default: deleted when this script created it)
#   IMAGE         image tag (default kv-epp:dev, the tag the manifests use)
#   IMAGE_ARCHIVE a docker-archive of the image to load instead of building one: the image CI built
#                 and ran (IMAGE_ARCHIVE=/tmp/kv-epp.tar deploy/image/build.sh writes it)
#   NODE_EXTRA_CA_CERTS  extra CA bundle for `bun install` in the docker build (a build secret, not kept)
set -euo pipefail

GAIE_VERSION="v1.0.0"
GAIE_CRDS="${GAIE_CRDS:-https://github.com/kubernetes-sigs/gateway-api-inference-extension/releases/download/${GAIE_VERSION}/manifests.yaml}"
OVERLAY="${OVERLAY:-deploy/base}"
CLUSTER="${KIND_CLUSTER:-kv-epp-e2e}"
IMAGE="${IMAGE:-kv-epp:dev}"
NS="kv-epp"

skip() { echo "skipped: $1"; exit 0; }
command -v docker >/dev/null 2>&1 || skip "docker is not installed"
command -v kind >/dev/null 2>&1 || skip "kind is not installed"
docker info >/dev/null 2>&1 || skip "the docker daemon is not reachable"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
command -v kubectl >/dev/null 2>&1 || { echo "e2e: kubectl is required" >&2; exit 2; }
command -v bun >/dev/null 2>&1 || { echo "e2e: bun is required (it runs the validation)" >&2; exit 2; }

created=0
cleanup() {
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "e2e: failed (exit $rc); state of namespace $NS:" >&2
    kubectl -n "$NS" get pods,endpointslices -o wide >&2 || true
    for p in $(kubectl -n "$NS" get pods -l app.kubernetes.io/name=dynamo-epp -o name 2>/dev/null); do
      echo "--- logs $p" >&2
      kubectl -n "$NS" logs "$p" -c epp --tail=50 >&2 || true
    done
  fi
  if [[ $created -eq 1 && "${KEEP_CLUSTER:-0}" != "1" ]]; then
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  exit $rc
}
trap cleanup EXIT

echo "== cluster $CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --config "$ROOT/deploy/kind/kind-config.yaml" --wait 180s
  created=1
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null

echo "== image $IMAGE"
if [[ -n ${IMAGE_ARCHIVE:-} ]]; then
  kind load image-archive "$IMAGE_ARCHIVE" --name "$CLUSTER"
else
  secret=()
  if [[ -n ${NODE_EXTRA_CA_CERTS:-} && -r $NODE_EXTRA_CA_CERTS ]]; then secret=(--secret "id=extra_ca,src=$NODE_EXTRA_CA_CERTS"); fi
  DOCKER_BUILDKIT=1 docker build "${secret[@]}" -f "$ROOT/deploy/Dockerfile" -t "$IMAGE" "$ROOT"
  kind load docker-image "$IMAGE" --name "$CLUSTER"
fi

echo "== GAIE CRDs from $GAIE_CRDS"
kubectl apply -f "$GAIE_CRDS"
kubectl wait --for condition=established --timeout=60s crd/inferencepools.inference.networking.k8s.io

echo "== manifests $OVERLAY"
kubectl delete namespace "$NS" --ignore-not-found --wait=true
kubectl apply -k "$ROOT/$OVERLAY"
if [[ "$IMAGE" != "kv-epp:dev" ]]; then
  kubectl -n "$NS" set image deploy/dynamo-epp epp="$IMAGE"
  kubectl -n "$NS" set image deploy/vllm-mock vllm="$IMAGE" || true
fi

echo "== validation"
E2E_NAMESPACE="$NS" bun "$ROOT/deploy/kind/e2e-validate.ts"
