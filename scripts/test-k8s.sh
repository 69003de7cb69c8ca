#!/usr/bin/env bash
# test-k8s.sh - paysvc's Kubernetes manifests (deploy/k8s) against a real
# API server: every overlay, and the production overlay with each
# component, built with kustomize and sent as server-side applies, dry run,
# with strict field validation, into a namespace enforcing Pod Security
# "restricted"; any error or warning fails. An etcd and a kube-apiserver of
# its own on loopback ports of its own (scripts/build-k8s.sh builds them
# once and keeps them), removed at the end, whatever the outcome. What it
# checks and how: tools/paykube. Last line: paykube: N passed, M failed.
#
# The prometheus-operator's CustomResourceDefinitions (PrometheusRule,
# ServiceMonitor) come from its module's example/prometheus-operator-crd,
# through the Go module proxy, into the module cache.
#
# Environment (defaults in brackets):
#   K8S_CACHE        where scripts/build-k8s.sh keeps the binaries
#   PROM_OPERATOR_VERSION [v0.85.0]  the prometheus-operator whose CRDs
#                    are installed
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
PROM_OPERATOR_VERSION=${PROM_OPERATOR_VERSION:-v0.85.0}

bins=$(scripts/build-k8s.sh | tail -n 1)

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mod=$(cd "$scratch" && GOFLAGS=-mod=mod $GO mod download -json \
	"github.com/prometheus-operator/prometheus-operator@$PROM_OPERATOR_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
crds="$mod/example/prometheus-operator-crd"
[ -d "$crds" ] || { echo "test-k8s: no $crds" >&2; exit 2; }

(cd tools && $GO build -o ../bin/paykube ./paykube)
# Its temporary directory (etcd's data, the keys, the logs) in ours, removed
# on exit even if it is killed.
TMPDIR="$scratch" bin/paykube -dir deploy/k8s -bin "$bins" -crds "$crds"
