#!/usr/bin/env bash
# build-tidb.sh - build TiDB's server (tidb-server) from the Go module proxy,
# once per version, and print the binary's path on the last line.
#
# The proxy serves TiDB only as a snapshot of its master branch: the server
# module at a pseudo-version, and its SQL parser (which TiDB's own go.mod
# takes from ./pkg/parser) as a module of its own at the same commit. A
# scratch module requires both, carries TiDB's other replace directives
# (a dependency's replaces do not apply to the module that requires it),
# and builds github.com/pingcap/tidb/cmd/tidb-server. The download is about
# 1.9 GB of modules; the build takes about 10 CPU-minutes.
#
# Environment (defaults in brackets):
#   TIDB_CACHE  [${XDG_CACHE_HOME:-$HOME/.cache}/paysvc-tidb]  where the
#               binary is kept, outside the checkout: make clean and a
#               fresh clone keep it
set -euo pipefail

readonly TIDB_COMMIT=e4e814fdc0af
readonly TIDB_VERSION=v1.1.0-beta.0.20251126154744-$TIDB_COMMIT
readonly PARSER_VERSION=v0.0.0-20251126154744-$TIDB_COMMIT

cache="${TIDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/paysvc-tidb}"
bin="$cache/tidb-server-$TIDB_VERSION"
if [ -x "$bin" ]; then
	echo "tidb-server: present" >&2
	echo "$bin"
	exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/go.mod" <<EOF
module paysvc.invalid/tidbbuild

go 1.23.6

require (
	github.com/pingcap/tidb $TIDB_VERSION
	github.com/pingcap/tidb/pkg/parser $PARSER_VERSION
)

replace (
	github.com/go-ldap/ldap/v3 => github.com/YangKeao/ldap/v3 v3.4.5-0.20230421065457-369a3bab1117
	sourcegraph.com/sourcegraph/appdash => github.com/sourcegraph/appdash v0.0.0-20190731080439-ebfcffb1b5c0
	sourcegraph.com/sourcegraph/appdash-data => github.com/sourcegraph/appdash-data v0.0.0-20151005221446-73f23eafcf67
)
EOF
echo "tidb-server: building $TIDB_VERSION (a few minutes)" >&2
start=$(date +%s)
(
	cd "$work"
	export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local
	go build -trimpath -o "$bin.part" \
		-ldflags "-X github.com/pingcap/tidb/pkg/util/versioninfo.TiDBGitHash=$TIDB_COMMIT -X github.com/pingcap/tidb/pkg/util/versioninfo.TiDBGitBranch=master" \
		github.com/pingcap/tidb/cmd/tidb-server
)
mv "$bin.part" "$bin"
echo "tidb-server: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
