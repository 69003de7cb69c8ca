#!/usr/bin/env bash
# The Node example's dependencies (docs/contract/examples/package.json) in
# tmp/node/node_modules, installed from the npm registry when missing, fast
# when present. The example producers' test runs it; so does make test
# (through ensure-test-tools.sh). Node and npm themselves come from
# ensure-test-tools.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=tmp/node
want=$(sed -n 's/.*"amqplib": *"\([^"]*\)".*/\1/p' docs/contract/examples/package.json)
have=$(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$dir/node_modules/amqplib/package.json" 2>/dev/null || true)
if [ -n "$want" ] && [ "$have" = "$want" ]; then
	echo "amqplib $want: present ($dir)"
	exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "ERROR: npm is missing: run scripts/ensure-test-tools.sh" >&2; exit 1; }
mkdir -p "$dir"
cp docs/contract/examples/package.json "$dir/package.json"
(cd "$dir" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
echo "amqplib $want: installed ($dir)"
