#!/usr/bin/env bash
# The Node packages the contract's tests use, in tmp/node/node_modules,
# installed from the npm registry when missing, fast when present:
#   amqplib          the Node example producer's client
#                    (docs/contract/examples/package.json names its version);
#   @asyncapi/specs  the AsyncAPI JSON Schemas, to validate
#                    docs/contract/asyncapi.yaml.
# The tests run it; so does make test (through ensure-test-tools.sh, which
# also installs node and npm).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=tmp/node
amqplib=$(sed -n 's/.*"amqplib": *"\([^"]*\)".*/\1/p' docs/contract/examples/package.json)
specs=6.11.1
version() { sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$dir/node_modules/$1/package.json" 2>/dev/null || true; }
if [ "$(version amqplib)" = "$amqplib" ] && [ "$(version @asyncapi/specs)" = "$specs" ]; then
	echo "amqplib $amqplib, @asyncapi/specs $specs: present ($dir)"
	exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "ERROR: npm is missing: run scripts/ensure-test-tools.sh" >&2; exit 1; }
mkdir -p "$dir"
cat >"$dir/package.json" <<JSON
{"private": true, "dependencies": {"amqplib": "$amqplib", "@asyncapi/specs": "$specs"}}
JSON
(cd "$dir" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
echo "amqplib $amqplib, @asyncapi/specs $specs: installed ($dir)"
