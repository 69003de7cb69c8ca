#!/usr/bin/env bash
# ensure-services.sh - make sure the services paysvc needs run on loopback:
#
#   MariaDB   127.0.0.1:3306  root, empty password, usable over TCP
#   Redis     127.0.0.1:6379
#   RabbitMQ  127.0.0.1:5672  guest/guest (>= 3.10 for quorum queues with
#                             at-least-once dead-lettering)
#
# For Debian/Ubuntu developer machines, containers and CI. Never uses systemd.
# A service whose port already answers is left alone, so the script is
# idempotent and returns in well under a second when everything runs.
# Missing packages are installed with apt-get. Needs root for installing and
# starting (uses sudo when not root); the "already running" path does not.
#
# Environment (defaults in brackets):
#   SERVICES_REDIS_PORT       [6379] port Redis is checked on / started with
#   SERVICES_MYSQL_TIMEOUT    [60]   seconds to wait for MariaDB
#   SERVICES_REDIS_TIMEOUT    [60]   seconds to wait for Redis
#   SERVICES_RABBITMQ_TIMEOUT [120]  seconds to wait for RabbitMQ
set -euo pipefail

export PATH="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"

readonly HOST=127.0.0.1
readonly MYSQL_PORT=3306
readonly REDIS_PORT="${SERVICES_REDIS_PORT:-6379}"
readonly RABBITMQ_PORT=5672
readonly MYSQL_TIMEOUT="${SERVICES_MYSQL_TIMEOUT:-60}"
readonly REDIS_TIMEOUT="${SERVICES_REDIS_TIMEOUT:-60}"
readonly RABBITMQ_TIMEOUT="${SERVICES_RABBITMQ_TIMEOUT:-120}"
readonly MARIADBD=/usr/sbin/mariadbd
readonly RABBITMQ_MIN_MAJOR=3 RABBITMQ_MIN_MINOR=10

log() { printf '%s\n' "$*"; }
warn() { printf 'WARNING: %s\n' "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# Privileged commands go through "${SUDO[@]}": empty as root, sudo otherwise.
SUDO=()
need_root() {
	if [[ ${EUID} -eq 0 || ${#SUDO[@]} -gt 0 ]]; then
		return 0
	fi
	command -v sudo >/dev/null 2>&1 ||
		die "not root and sudo is not installed: cannot install or start $1"
	SUDO=(sudo)
}

# Output of the commands we run goes to a scratch log, shown on failure.
WORK_LOG=$(mktemp "${TMPDIR:-/tmp}/ensure-services.XXXXXX")
trap 'rm -f "${WORK_LOG}"' EXIT
show_log() {
	if [[ -s ${WORK_LOG} ]]; then
		printf -- '--- output of the last commands ---\n' >&2
		tail -n 30 "${WORK_LOG}" >&2
	fi
}

# port_open PORT: does something accept TCP connections on HOST:PORT?
port_open() {
	# shellcheck disable=SC2016 # $1/$2 expand in the child bash
	timeout 1 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "${HOST}" "$1" 2>/dev/null
}

# wait_port NAME PORT SECONDS
wait_port() {
	local name=$1 port=$2 deadline=$((SECONDS + $3))
	until port_open "${port}"; do
		if ((SECONDS >= deadline)); then
			show_log
			die "${name} did not come up on ${HOST}:${port} within $3s"
		fi
		sleep 0.5
	done
}

APT_UPDATED=0
apt_install() { # apt_install NAME PACKAGE
	need_root "$1"
	command -v apt-get >/dev/null 2>&1 ||
		die "$1 is not installed and apt-get is not available (not Debian/Ubuntu?)"
	if ((APT_UPDATED == 0)); then
		"${SUDO[@]}" apt-get update >>"${WORK_LOG}" 2>&1 ||
			{ show_log; die "apt-get update failed (needed to install $1)"; }
		APT_UPDATED=1
	fi
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y --no-install-recommends "$2" >>"${WORK_LOG}" 2>&1 ||
		{ show_log; die "apt-get install $2 failed"; }
}

# ---------------------------------------------------------------- MariaDB --

mysql_client() {
	if command -v mariadb >/dev/null 2>&1; then echo mariadb; else echo mysql; fi
}

mysql_tcp_root_ok() {
	# --no-defaults: ignore any ~/.my.cnf; no -p means an empty password,
	# exactly what the Go driver does with root@tcp(127.0.0.1:3306)/.
	"$(mysql_client)" --no-defaults --protocol=TCP -h"${HOST}" -P"${MYSQL_PORT}" -uroot \
		-e 'SELECT 1' >/dev/null 2>&1
}

# Debian creates root@localhost with unix_socket auth only, which a TCP
# client cannot use. Over the socket (as OS root), give root an empty
# password in addition to unix_socket, and add root@127.0.0.1 (the account a
# TCP connection from 127.0.0.1 matches under skip-name-resolve). Every
# statement is idempotent on MariaDB >= 10.4.
readonly MYSQL_FIX_ROOT_SQL="
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
ALTER USER 'root'@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
"

mysql_fix_root() {
	if ! command -v mariadb >/dev/null 2>&1 && ! command -v mysql >/dev/null 2>&1; then
		warn "no mariadb/mysql client installed: cannot check root login over TCP"
		return 0
	fi
	mysql_tcp_root_ok && return 0
	need_root "root access for MariaDB"
	"${SUDO[@]}" "$(mysql_client)" -uroot -e "${MYSQL_FIX_ROOT_SQL}" >>"${WORK_LOG}" 2>&1 ||
		{ show_log; die "MariaDB: could not enable empty-password root login over TCP (tried over the socket as OS root)"; }
	mysql_tcp_root_ok ||
		die "MariaDB: root still cannot log in over TCP ${HOST}:${MYSQL_PORT} with an empty password"
}

mysql_error_log() {
	my_print_defaults --mysqld 2>/dev/null | sed -n 's/^--log[-_]error=//p' | tail -n 1
}

ensure_mariadb() {
	local state=started
	if port_open "${MYSQL_PORT}"; then
		mysql_fix_root
		log "mariadb:  already running on ${HOST}:${MYSQL_PORT}"
		return 0
	fi
	if [[ ! -x ${MARIADBD} ]] || ! command -v mariadb >/dev/null 2>&1; then
		apt_install MariaDB mariadb-server
		state=installed
	fi
	# The package's postinst may have started it already.
	if ! port_open "${MYSQL_PORT}"; then
		need_root MariaDB
		"${SUDO[@]}" mkdir -p /run/mysqld
		"${SUDO[@]}" chown mysql:mysql /run/mysqld
		local errlog
		errlog=$(mysql_error_log)
		if [[ -n ${errlog} && ! -d ${errlog%/*} ]]; then
			"${SUDO[@]}" mkdir -p "${errlog%/*}"
			"${SUDO[@]}" chown mysql:mysql "${errlog%/*}"
		fi
		if [[ ! -d /var/lib/mysql/mysql ]]; then
			"${SUDO[@]}" mariadb-install-db --user=mysql >>"${WORK_LOG}" 2>&1 ||
				{ show_log; die "MariaDB: mariadb-install-db failed"; }
		fi
		# mariadbd refuses to run as root unless the config names a user
		# (Debian's stock config leaves "user = mysql" commented out).
		local extra=()
		if ! my_print_defaults --mysqld 2>/dev/null | grep -q '^--user='; then
			extra=(-- --user=mysql)
		fi
		"${SUDO[@]}" start-stop-daemon --start --oknodo --background \
			--exec "${MARIADBD}" "${extra[@]}" >>"${WORK_LOG}" 2>&1 ||
			{ show_log; die "MariaDB: start-stop-daemon failed"; }
		if ! (wait_port MariaDB "${MYSQL_PORT}" "${MYSQL_TIMEOUT}"); then
			if [[ -n ${errlog} ]]; then
				printf -- '--- tail of %s ---\n' "${errlog}" >&2
				"${SUDO[@]}" tail -n 20 "${errlog}" >&2 || true
			fi
			exit 1
		fi
	fi
	mysql_fix_root
	log "mariadb:  ${state} on ${HOST}:${MYSQL_PORT}"
}

# ------------------------------------------------------------------ Redis --

ensure_redis() {
	local state=started
	if port_open "${REDIS_PORT}"; then
		log "redis:    already running on ${HOST}:${REDIS_PORT}"
		return 0
	fi
	if ! command -v redis-server >/dev/null 2>&1; then
		apt_install Redis redis-server
		state=installed
		# The package's postinst may have started it on the default port.
		if port_open "${REDIS_PORT}"; then
			log "redis:    ${state} on ${HOST}:${REDIS_PORT}"
			return 0
		fi
	fi
	need_root Redis
	"${SUDO[@]}" mkdir -p /var/lib/redis /var/log/redis
	"${SUDO[@]}" redis-server --daemonize yes --bind 127.0.0.1 -::1 \
		--port "${REDIS_PORT}" --save "" --appendonly no \
		--dir /var/lib/redis --logfile /var/log/redis/ci.log >>"${WORK_LOG}" 2>&1 ||
		{ show_log; die "Redis: redis-server failed to start (see /var/log/redis/ci.log)"; }
	wait_port Redis "${REDIS_PORT}" "${REDIS_TIMEOUT}"
	log "redis:    ${state} on ${HOST}:${REDIS_PORT}"
}

# --------------------------------------------------------------- RabbitMQ --

# Version of the broker actually listening: from the server-properties of
# the AMQP Connection.Start frame (costs one "client unexpectedly closed TCP
# connection" line in the broker's log). Falls back to the Debian package.
rabbitmq_version() {
	local v
	# shellcheck disable=SC2016 # $1/$2 expand in the child bash
	v=$(timeout 2 bash -c '
		exec 3<>"/dev/tcp/$1/$2" || exit 1
		printf "AMQP\0\0\011\001" >&3
		dd bs=8192 count=1 status=none <&3' _ "${HOST}" "${RABBITMQ_PORT}" 2>/dev/null |
		LC_ALL=C tr -c '[:print:]' ' ' |
		LC_ALL=C sed -nE 's/.*versionS.{4}([0-9]+\.[0-9]+(\.[0-9]+)?).*/\1/p') || true
	if [[ -z ${v} ]]; then
		v=$(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null |
			sed -nE 's/^([0-9]+:)?([0-9]+\.[0-9]+(\.[0-9]+)?).*/\2/p') || true
	fi
	printf '%s' "${v}"
}

rabbitmq_check_version() {
	local v major minor
	v=$(rabbitmq_version)
	if [[ ! ${v} =~ ^([0-9]+)\.([0-9]+) ]]; then
		warn "could not determine the RabbitMQ version; paysvc needs >= ${RABBITMQ_MIN_MAJOR}.${RABBITMQ_MIN_MINOR}"
		return 0
	fi
	major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
	if ((major < RABBITMQ_MIN_MAJOR || (major == RABBITMQ_MIN_MAJOR && minor < RABBITMQ_MIN_MINOR))); then
		printf 'ERROR: RabbitMQ %s is too old: paysvc needs >= %s.%s (quorum queues with message TTL and at-least-once dead-lettering).\n' \
			"${v}" "${RABBITMQ_MIN_MAJOR}" "${RABBITMQ_MIN_MINOR}" >&2
		printf '       Debian 12 ships 3.10; on older releases install a newer rabbitmq-server (the RabbitMQ apt repository).\n' >&2
		exit 1
	fi
	RABBITMQ_VERSION=${v}
}

ensure_rabbitmq() {
	local state=started
	RABBITMQ_VERSION=unknown
	if port_open "${RABBITMQ_PORT}"; then
		rabbitmq_check_version
		log "rabbitmq: already running on ${HOST}:${RABBITMQ_PORT} (${RABBITMQ_VERSION})"
		return 0
	fi
	if ! command -v rabbitmq-server >/dev/null 2>&1 || ! command -v rabbitmqctl >/dev/null 2>&1; then
		apt_install RabbitMQ rabbitmq-server
		state=installed
	fi
	if ! port_open "${RABBITMQ_PORT}"; then
		need_root RabbitMQ
		local deadline=$((SECONDS + RABBITMQ_TIMEOUT)) left
		"${SUDO[@]}" rabbitmq-server -detached >>"${WORK_LOG}" 2>&1 ||
			{ show_log; die "RabbitMQ: rabbitmq-server -detached failed (see /var/log/rabbitmq/)"; }
		# await_startup fails at once while the node is not yet reachable,
		# so retry it until the deadline.
		until
			left=$((deadline - SECONDS))
			((left > 0)) &&
				"${SUDO[@]}" timeout "${left}" rabbitmqctl await_startup >>"${WORK_LOG}" 2>&1
		do
			if ((SECONDS >= deadline)); then
				show_log
				die "RabbitMQ did not finish starting within ${RABBITMQ_TIMEOUT}s (see /var/log/rabbitmq/)"
			fi
			sleep 1
		done
		left=$((deadline - SECONDS))
		wait_port RabbitMQ "${RABBITMQ_PORT}" $((left > 5 ? left : 5))
	fi
	rabbitmq_check_version
	log "rabbitmq: ${state} on ${HOST}:${RABBITMQ_PORT} (${RABBITMQ_VERSION})"
}

ensure_mariadb
ensure_redis
ensure_rabbitmq
