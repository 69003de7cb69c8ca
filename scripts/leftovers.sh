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
# killed earlier run left is not this run's doing. Looks at the databases
# and users of MariaDB, the vhosts, users and policies of RabbitMQ, and
# Redis's ACL users and keys (every database). Uses the test servers'
# defaults (the environment's PAYSVC_TEST_* addresses are not parsed).
set -euo pipefail

export PATH="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"
SUDO=()
[ "$(id -u)" -eq 0 ] || SUDO=(sudo -n)

state() {
	mariadb -h127.0.0.1 -uroot -N -e "SHOW DATABASES" | sed 's/^/mariadb database /'
	mariadb -h127.0.0.1 -uroot -N -e "SELECT CONCAT(user, '@', host) FROM mysql.user" | sed 's/^/mariadb user /'
	"${SUDO[@]}" rabbitmqctl -q list_vhosts --no-table-headers name | sed 's/^/rabbitmq vhost /'
	"${SUDO[@]}" rabbitmqctl -q list_users --no-table-headers | awk '{print "rabbitmq user " $1}'
	"${SUDO[@]}" rabbitmqctl -q list_policies -p / --no-table-headers | awk 'NF {print "rabbitmq policy / " $2}'
	redis-cli -h 127.0.0.1 ACL USERS | sed 's/^/redis user /'
	for db in $(redis-cli -h 127.0.0.1 INFO keyspace | sed -n 's/^db\([0-9]*\):.*/\1/p'); do
		redis-cli -h 127.0.0.1 -n "$db" --scan | awk 'NR <= 10000' | sed "s/^/redis key db$db /"
	done
}

case "${1:-}:${2:-}" in
snapshot:?*)
	mkdir -p "$(dirname "$2")"
	state | sort -u >"$2"
	;;
check:?*)
	new=$(state | sort -u | comm -13 "$2" -)
	if [ -n "$new" ]; then
		printf 'leftovers: the run left these on the shared servers (a test whose cleanup failed or is missing):\n%s\n' \
			"$(printf '%s\n' "$new" | head -n 50)" >&2
		exit 1
	fi
	echo "leftovers: none"
	;;
*)
	echo "usage: $0 snapshot|check FILE" >&2
	exit 2
	;;
esac
