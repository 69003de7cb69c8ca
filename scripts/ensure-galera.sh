#!/usr/bin/env bash
# ensure-galera.sh - install what the cluster suite's Galera scenarios run
# (make chaos-cluster): mariadb-server's wsrep build with galera-4 and
# rsync (its dependencies on Debian), and HAProxy. Starts nothing: the
# suite runs its own nodes and proxy on loopback ports of their own.
# Idempotent; needs root (or sudo) only to install.
set -euo pipefail

export PATH="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"

missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v rsync >/dev/null 2>&1 || missing+=(rsync)
[ -e /usr/lib/galera/libgalera_smm.so ] || missing+=(galera-4)
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=()
if [[ ${EUID} -ne 0 ]]; then
	command -v sudo >/dev/null 2>&1 || { echo "ensure-galera: not root and no sudo: install ${missing[*]}" >&2; exit 1; }
	SUDO=(sudo)
fi
echo "ensure-galera: installing ${missing[*]}"
"${SUDO[@]}" apt-get update >/dev/null
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
