#!/usr/bin/env bash
# Test tools beyond the servers: Debian's headless Chromium for the admin
# page's browser test. Installs it when missing; fast when present.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
	echo "chromium: present"
	exit 0
fi
SUDO=
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null 2>&1 || { echo "ERROR: chromium is missing and this is not root (no sudo)" >&2; exit 1; }
	SUDO=sudo
fi
echo "chromium: installing Debian's chromium"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null 2>&1 || { echo "ERROR: chromium did not install" >&2; exit 1; }
echo "chromium: installed"
