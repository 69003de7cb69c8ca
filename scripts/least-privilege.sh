#!/usr/bin/env bash
# Least privilege for paysvc: a MySQL user for the daemon that can never
# delete a row (and never update a flow), a separate migration user, a
# pruning user (paysvc prune) that may delete only from the tables it
# prunes and cannot read or write a money row, a RabbitMQ user limited to
# the q.pay.* / ex.pay.* names, and a Redis ACL user limited to the
# idempotency key prefix.
#
#   scripts/least-privilege.sh mysql|rabbitmq|redis|all
#
# Passwords come from the environment and are passed on standard input, never
# as arguments (which other users can read in the process list):
#   APP_PASSWORD, MIGRATE_PASSWORD (mysql), RABBITMQ_PASSWORD, REDIS_PASSWORD
#   PRUNE_PASSWORD (mysql, optional: without it no pruning user is made)
# Names, with their defaults:
#   MYSQL_DATABASE=paysvc APP_USER=paysvc APP_HOST=% MIGRATE_USER=paysvc_migrate
#   PRUNE_USER=paysvc_prune
#   RABBITMQ_VHOST=/ RABBITMQ_USER=paysvc
#   REDIS_USER=paysvc REDIS_KEY_PREFIX=mq:consumed:pay_success:
# Admin access: MYSQL="mariadb -uroot" REDIS_CLI="redis-cli"; rabbitmqctl as root.
# The mysql part creates the database and both users; the daemon's grants
# need its tables, so on a database not migrated yet run it again after
# `paysvc migrate` (it says so, and names the tables it could not grant on).
set -euo pipefail

# MYSQL_DATABASE, not PAYSVC_DB: paysvc refuses PAYSVC_* names it does not
# know, and both may be exported in one shell (PAYSVC_DB still works here).
DB=${MYSQL_DATABASE:-${PAYSVC_DB:-paysvc}}
APP_USER=${APP_USER:-paysvc}
APP_HOST=${APP_HOST:-%}
MIGRATE_USER=${MIGRATE_USER:-paysvc_migrate}
PRUNE_USER=${PRUNE_USER:-paysvc_prune}
VHOST=${RABBITMQ_VHOST:-/}
RMQ_USER=${RABBITMQ_USER:-paysvc}
REDIS_USER=${REDIS_USER:-paysvc}
PREFIX=${REDIS_KEY_PREFIX:-mq:consumed:pay_success:}
MYSQL=${MYSQL:-mariadb -uroot}
REDIS_CLI=${REDIS_CLI:-redis-cli}

need() { [ -n "${!1:-}" ] || { echo "least-privilege: set $1" >&2; exit 2; }; }
sql_quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/\\\\/\\\\\\\\/g; s/'/''/g")"; }

mysql_part() {
	need APP_PASSWORD
	need MIGRATE_PASSWORD
	local app mig prn=""
	app="$(sql_quote "$APP_USER")@$(sql_quote "$APP_HOST")"
	mig="$(sql_quote "$MIGRATE_USER")@$(sql_quote "$APP_HOST")"
	$MYSQL <<SQL
CREATE DATABASE IF NOT EXISTS \`$DB\` DEFAULT CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS $app IDENTIFIED BY $(sql_quote "$APP_PASSWORD");
ALTER USER $app IDENTIFIED BY $(sql_quote "$APP_PASSWORD");
CREATE USER IF NOT EXISTS $mig IDENTIFIED BY $(sql_quote "$MIGRATE_PASSWORD");
ALTER USER $mig IDENTIFIED BY $(sql_quote "$MIGRATE_PASSWORD");
GRANT ALL PRIVILEGES ON \`$DB\`.* TO $mig;
SQL
	if [ -n "${PRUNE_PASSWORD:-}" ]; then
		prn="$(sql_quote "$PRUNE_USER")@$(sql_quote "$APP_HOST")"
		$MYSQL <<SQL
CREATE USER IF NOT EXISTS $prn IDENTIFIED BY $(sql_quote "$PRUNE_PASSWORD");
ALTER USER $prn IDENTIFIED BY $(sql_quote "$PRUNE_PASSWORD");
SQL
	fi
	# The daemon: no DELETE anywhere; flows and events are insert-only. A
	# table grant needs the table: on a database not migrated yet the
	# tables missing are named, and a run after the migration grants them.
	local grants=(
		"t_order:SELECT, INSERT, UPDATE"
		"t_account:SELECT, INSERT, UPDATE"
		"t_account_flow:SELECT, INSERT"
		"t_outbox:SELECT, INSERT, UPDATE"
		"t_dead_letter:SELECT, INSERT, UPDATE"
		"t_dead_letter_event:SELECT, INSERT"
		"t_payment_event:SELECT, INSERT"
		"t_account_opening:SELECT"
		"paysvc_schema_migrations:SELECT"
		"t_admin_session:SELECT, INSERT, UPDATE"
		"t_write_probe:SELECT, INSERT, UPDATE"
		"t_lease:SELECT, INSERT, UPDATE"
	)
	# paysvc prune: reads and deletes the rows past their windows (a dead
	# letter with its history), takes its lease, reads the schema's
	# versions; no grant on t_order, t_account or t_account_flow.
	local prune_grants=(
		"t_outbox:SELECT, DELETE"
		"t_payment_event:SELECT, DELETE"
		"t_admin_session:SELECT, DELETE"
		"t_dead_letter:SELECT, DELETE"
		"t_dead_letter_event:SELECT, DELETE"
		"t_lease:SELECT, INSERT, UPDATE"
		"paysvc_schema_migrations:SELECT"
	)
	local tables sql="" missing=() g
	tables=$($MYSQL -N -B -e "SELECT table_name FROM information_schema.tables WHERE table_schema = $(sql_quote "$DB")")
	for g in "${grants[@]}"; do
		if grep -qx "${g%%:*}" <<<"$tables"; then
			sql+="GRANT ${g#*:} ON \`$DB\`.${g%%:*} TO $app;"$'\n'
		else
			missing+=("${g%%:*}")
		fi
	done
	if [ -n "$prn" ]; then
		for g in "${prune_grants[@]}"; do
			if grep -qx "${g%%:*}" <<<"$tables"; then
				sql+="GRANT ${g#*:} ON \`$DB\`.${g%%:*} TO $prn;"$'\n'
			fi
		done
	fi
	[ -z "$sql" ] || $MYSQL <<<"$sql"
	echo "mysql: $APP_USER (daemon, no DELETE) and $MIGRATE_USER (migrations) on $DB"
	if [ -n "$prn" ]; then
		echo "mysql: $PRUNE_USER (paysvc prune: SELECT, DELETE on t_outbox, t_payment_event, t_admin_session, t_dead_letter, t_dead_letter_event; no money table)"
	else
		echo "mysql: PRUNE_PASSWORD not set: no $PRUNE_USER user for paysvc prune"
	fi
	if [ ${#missing[@]} -gt 0 ]; then
		echo "mysql: not migrated yet, no grant on ${missing[*]}: run this again after \`paysvc migrate\` (until then the daemon waits for MySQL)"
	fi
}

rabbitmq_part() {
	need RABBITMQ_PASSWORD
	local ctl=(rabbitmqctl -q)
	[ "$(id -u)" -eq 0 ] || ctl=(sudo -n rabbitmqctl -q)
	if "${ctl[@]}" list_users | awk '{print $1}' | grep -qx "$RMQ_USER"; then
		printf '%s' "$RABBITMQ_PASSWORD" | "${ctl[@]}" change_password "$RMQ_USER" >/dev/null
	else
		printf '%s' "$RABBITMQ_PASSWORD" | "${ctl[@]}" add_user "$RMQ_USER" >/dev/null
	fi
	# configure: declare its own names; write: publish to them and to the
	# default exchange (replays); read: consume its queues, bind from ex.pay.*
	"${ctl[@]}" set_permissions -p "$VHOST" "$RMQ_USER" \
		'^(q|ex)\.pay\..*$' '^((q|ex)\.pay\..*|amq\.default)$' '^(q|ex)\.pay\..*$' >/dev/null
	echo "rabbitmq: $RMQ_USER limited to q.pay.* and ex.pay.* in vhost $VHOST"
}

redis_part() {
	need REDIS_PASSWORD
	# Through stdin: the password never appears in a process list. redis-cli
	# reads the line with its own quoting: escape backslashes and quotes.
	local pw=${REDIS_PASSWORD//\\/\\\\}
	pw=${pw//\"/\\\"}
	printf 'ACL SETUSER %s reset on ">%s" "~%s*" resetchannels -@all +@connection +ping +get +set +del +pttl +eval +evalsha +zadd +zrem +zcount +zremrangebyscore +zscan +scan\n' \
		"$REDIS_USER" "$pw" "$PREFIX" | $REDIS_CLI | { read -r reply; [ "$reply" = "OK" ] || { echo "redis: ACL SETUSER failed: $reply" >&2; exit 1; }; }
	echo "redis: $REDIS_USER limited to keys ${PREFIX}*"
}

case "${1:-}" in
mysql) mysql_part ;;
rabbitmq) rabbitmq_part ;;
redis) redis_part ;;
all) mysql_part; rabbitmq_part; redis_part ;;
*) echo "usage: $0 mysql|rabbitmq|redis|all" >&2; exit 2 ;;
esac
