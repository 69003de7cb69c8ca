#!/usr/bin/env bash
# build-k8s.sh - build kube-apiserver and etcd from the Go module proxy, once
# per version, and print the directory holding both binaries on the last
# line (make test-k8s runs them; scripts/test-k8s.sh).
#
# kube-apiserver: a scratch module requires k8s.io/kubernetes and replaces
# every staging module its go.mod takes from ./staging/src/k8s.io/... (a
# dependency's replaces do not apply to the module that requires it) by that
# module's own release, v0.X.Y for kubernetes v1.X.Y; the list is read from
# the go.mod the proxy serves, so a new staging module needs no edit here.
# etcd: the same for go.etcd.io/etcd/server/v3, whose go.mod takes its
# api, client and pkg siblings from ../; they are released at its version.
# Cold, about 5 minutes of both cores and 2.4 GB of memory; the Go build
# cache makes a rebuild (a version bump, a lost binary) much quicker.
#
# Environment (defaults in brackets):
#   K8S_CACHE  [${XDG_CACHE_HOME:-$HOME/.cache}/paysvc-k8s]  where the
#              binaries are kept, outside the checkout: make clean and a
#              fresh clone keep them
#   K8S_BUILD_PROCS [1]  go build -p: packages compiled at once (the build
#              of one package is already parallel; 1 keeps the peak memory
#              and a shared machine's load down)
set -euo pipefail

readonly K8S_VERSION=v1.37.2
readonly ETCD_VERSION=v3.7.3

cache="${K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/paysvc-k8s}"
dir="$cache/kube-apiserver-$K8S_VERSION-etcd-$ETCD_VERSION"
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
	echo "kube-apiserver $K8S_VERSION, etcd $ETCD_VERSION: present" >&2
	echo "$dir"
	exit 0
fi

mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local
procs="${K8S_BUILD_PROCS:-1}"

# The go.mod of a module as the proxy serves it (the module cache's copy).
gomod() {
	(cd "$work" && go mod download -json "$1@$2") |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p'
}

# scratch NAME MODULE VERSION PREFIX RELEASE: a module at $work/NAME that
# requires MODULE@VERSION and replaces each of its local replaces whose
# target starts with PREFIX by the replaced module at RELEASE.
scratch() {
	local name=$1 module=$2 version=$3 prefix=$4 release=$5 mod
	mod=$(gomod "$module" "$version")
	[ -s "$mod" ] || { echo "build-k8s: no go.mod for $module@$version" >&2; exit 1; }
	mkdir -p "$work/$name"
	{
		printf 'module paysvc.invalid/%s\n\ngo 1.26\n\nrequire %s %s\n\nreplace (\n' "$name" "$module" "$version"
		awk -v p="$prefix" -v r="$release" '
			$2 == "=>" && index($3, p) == 1 { printf "\t%s => %s %s\n", $1, $1, r }
			$1 == "replace" && $3 == "=>" && index($4, p) == 1 { printf "\t%s => %s %s\n", $2, $2, r }
		' "$mod"
		printf ')\n'
	} >"$work/$name/go.mod"
	if ! grep -q ' => ' "$work/$name/go.mod"; then
		echo "build-k8s: $module@$version replaces nothing under $prefix: its layout changed" >&2
		exit 1
	fi
}

start=$(date +%s)
if [ ! -x "$dir/kube-apiserver" ]; then
	echo "kube-apiserver: building $K8S_VERSION (a few minutes)" >&2
	scratch apiserver k8s.io/kubernetes "$K8S_VERSION" ./staging/ "v0.${K8S_VERSION#v1.}"
	(cd "$work/apiserver" && go build -p "$procs" -trimpath -o "$dir/kube-apiserver.part" \
		-ldflags "-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)" \
		k8s.io/kubernetes/cmd/kube-apiserver)
	mv "$dir/kube-apiserver.part" "$dir/kube-apiserver"
fi
if [ ! -x "$dir/etcd" ]; then
	echo "etcd: building $ETCD_VERSION" >&2
	scratch etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" ../ "$ETCD_VERSION"
	(cd "$work/etcd" && go build -p "$procs" -trimpath -o "$dir/etcd.part" go.etcd.io/etcd/server/v3)
	mv "$dir/etcd.part" "$dir/etcd"
fi
echo "kube-apiserver $K8S_VERSION, etcd $ETCD_VERSION: built in $(($(date +%s) - start)) s" >&2
echo "$dir"
