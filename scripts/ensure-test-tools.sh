#!/usr/bin/env bash
# Test tools beyond the servers, installed when missing, fast when present:
#   gcc       a C compiler: go test -race (make test's TESTFLAGS) needs cgo,
#             which Go turns off when it finds no C compiler;
#   chromium  Debian's headless Chromium, for the admin pages' browser
#             tests (tools/browsertest);
#   promtool  from Debian's prometheus package, for the alert rules' unit
#             tests. Only the promtool binary is taken (into
#             /usr/local/bin as root, else tmp/tools/, or PROMTOOL_DIR):
#             the package's Prometheus server is never installed or started;
#   node, npm Debian's nodejs and npm, and amqplib from the npm registry
#             (into tmp/node: scripts/example-deps.sh), for the Node
#             example producer's test;
#   pika      Debian's python3-pika, for the Python example producer's
#             test (it runs /usr/bin/python3, which has Debian's packages).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
	SUDO=sudo
fi

if command -v "$(go env CC 2>/dev/null || echo gcc)" >/dev/null 2>&1; then
	echo "C compiler (for -race): present"
else
	[ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ] || { echo "ERROR: no C compiler for go test -race, and this is not root (no sudo)" >&2; exit 1; }
	echo "C compiler (for -race): installing Debian's gcc"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null
	command -v gcc >/dev/null 2>&1 || { echo "ERROR: gcc did not install" >&2; exit 1; }
	echo "C compiler (for -race): installed"
fi

if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
	echo "chromium: present"
else
	[ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ] || { echo "ERROR: chromium is missing and this is not root (no sudo)" >&2; exit 1; }
	echo "chromium: installing Debian's chromium"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
	command -v chromium >/dev/null 2>&1 || { echo "ERROR: chromium did not install" >&2; exit 1; }
	echo "chromium: installed"
fi

# Root installs it for the machine (/usr/local/bin, as apt would); anyone
# else into the checkout.
default_dir=tmp/tools
if [ -w /usr/local/bin ]; then default_dir=/usr/local/bin; fi
dir=${PROMTOOL_DIR:-$default_dir}
if command -v promtool >/dev/null 2>&1 || [ -x "$dir/promtool" ] || [ -x tmp/tools/promtool ]; then
	echo "promtool: present"
else
	echo "promtool: taking it from Debian's prometheus package"
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	(cd "$work" && apt-get download prometheus >/dev/null 2>&1) || {
		$SUDO apt-get update -qq
		(cd "$work" && apt-get download prometheus >/dev/null)
	}
	dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
	mkdir -p "$dir"
	install -m 0755 "$work/x/usr/bin/promtool" "$dir/promtool"
	"$dir/promtool" --version >/dev/null
	echo "promtool: $dir/promtool"
fi

if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
	echo "node, npm: present"
else
	[ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ] || { echo "ERROR: node or npm is missing and this is not root (no sudo)" >&2; exit 1; }
	echo "node, npm: installing Debian's nodejs and npm"
	$SUDO apt-get update -qq
	# A nodejs from another repository may carry npm itself, and conflict
	# with Debian's npm: then only what is missing is installed.
	pkgs=npm
	command -v node >/dev/null 2>&1 || pkgs="nodejs npm"
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
	command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { echo "ERROR: node or npm did not install" >&2; exit 1; }
	echo "node, npm: installed"
fi
scripts/example-deps.sh

if /usr/bin/python3 -c 'import pika' >/dev/null 2>&1; then
	echo "python3-pika: present"
else
	[ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ] || { echo "ERROR: python3-pika is missing and this is not root (no sudo)" >&2; exit 1; }
	echo "python3-pika: installing Debian's python3-pika"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pika >/dev/null
	/usr/bin/python3 -c 'import pika' || { echo "ERROR: python3-pika did not install" >&2; exit 1; }
	echo "python3-pika: installed"
fi
