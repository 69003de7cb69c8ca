#!/usr/bin/env bash
# leftovers.sh - what a test run left on the shared servers.
#
#   scripts/leftovers.sh snapshot FILE   record the servers' state
#   scripts/leftovers.sh check FILE      exit 1, listing them, if anything
#                                        is there now that FILE did not have
#
# Every test works in a database, vhost and Redis key prefix (or user) of
# its own and removes it at cleanup; the cleanups ignore errors (a failed
# cleanup must not hide the test's own result), so this is where a
# leftover shows. Only what is new since the snapshot counts: what a
# killed earlier run left is not this run's doing. Looks at MariaDB's
# databases and users, RabbitMQ's vhosts, users, and the queues, exchanges
# and policies of "/", Redis's ACL users and keys (every database).
#
# The servers are the tests' own (PAYSVC_TEST_MYSQL_DSN, a Go DSN with
# tcp(host:port); PAYSVC_TEST_REDIS_ADDR; rabbitmqctl reaches the local
# node). Anything else writing to them meanwhile (make demo's traffic, a
# second test run) reads as a leftover: LEFTOVERS=skip turns the check off.
# A server whose client (mariadb, redis-cli, rabbitmqctl) is not installed
# is skipped with a warning.
set -euo pipefail

export PATH="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"
SUDO=()
[ "$(id -u)" -eq 0 ] || SUDO=(sudo -n)

dsn="${PAYSVC_TEST_MYSQL_DSN:-root@tcp(127.0.0.1:3306)/}"
re='^(([^:@/]*)(:([^@]*))?@)?(tcp\(([^)]*)\))?/'
[[ "$dsn" =~ $re ]] || { echo "leftovers: cannot read PAYSVC_TEST_MYSQL_DSN" >&2; exit 2; }
mysql_user="${BASH_REMATCH[2]:-root}"
export MYSQL_PWD="${BASH_REMATCH[4]}"
mysql_addr="${BASH_REMATCH[6]:-127.0.0.1:3306}"
redis_addr="${PAYSVC_TEST_REDIS_ADDR:-127.0.0.1:6379}"

have() {
	command -v "$1" >/dev/null && return 0
	echo "leftovers: $1 is not installed: its server is not checked" >&2
	return 1
}

sql() { mariadb -h"${mysql_addr%:*}" -P"${mysql_addr##*:}" -u"$mysql_user" -N -e "$1"; }
rctl() { "${SUDO[@]}" rabbitmqctl -q "$@" --no-table-headers; }
rcli() { redis-cli -h "${redis_addr%:*}" -p "${redis_addr##*:}" "$@"; }

state() {
	if have mariadb; then
		sql "SHOW DATABASES" | sed 's/^/mariadb database /'
		sql "SELECT CONCAT(user, '@', host) FROM mysql.user" | sed 's/^/mariadb user /'
	fi
	if have rabbitmqctl; then
		rctl list_vhosts name | sed 's/^/rabbitmq vhost /'
		rctl list_users | awk 'NF {print "rabbitmq user " $1}'
		rctl list_policies -p / | awk 'NF {print "rabbitmq policy / " $2}'
		rctl list_queues -p / name | sed 's/^/rabbitmq queue \/ /'
		rctl list_exchanges -p / name | awk 'NF {print "rabbitmq exchange / " $1}'
	fi
	if have redis-cli; then
		rcli ACL USERS | sed 's/^/redis user /'
		for db in $(rcli INFO keyspace | sed -n 's/^db\([0-9]*\):.*/\1/p'); do
			rcli -n "$db" --scan | sed "s/^/redis key db$db /"
		done
	fi
}

if [ "${LEFTOVERS:-}" = skip ]; then
	echo "leftovers: not checked (LEFTOVERS=skip)"
	exit 0
fi
case "${1:-}:${2:-}" in
snapshot:?*)
	mkdir -p "$(dirname "$2")"
	state | sort -u >"$2"
	;;
check:?*)
	new=$(state | sort -u | comm -13 "$2" -)
	if [ -n "$new" ]; then
		printf 'leftovers: the run left these on the shared servers (a test whose cleanup failed or is missing):\n%s\n' \
			"$(printf '%s\n' "$new" | awk 'NR <= 50')" >&2
		exit 1
	fi
	echo "leftovers: none"
	;;
*)
	echo "usage: $0 snapshot|check FILE" >&2
	exit 2
	;;
esac
