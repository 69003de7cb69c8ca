#!/usr/bin/env bash
# test-tidb.sh - paysvc's MySQL-facing integration tests, and one fault
# scenario, against TiDB: a tidb-server of its own (scripts/build-tidb.sh,
# built once and kept) with its embedded unistore store, on loopback ports
# of its own, removed at the end. RabbitMQ and Redis are the shared ones.
# Not part of make test or CI: TiDB is served only as a master snapshot,
# and docs/deployment.md ("TiDB") says what differs there and why the tests
# below are left out.
#
# The server runs with CHECK constraints on (tidb_enable_check_constraint,
# global, before any table is created: TiDB drops the constraints of a
# table created while it is off) and optimistic transactions as its
# default (tidb_txn_mode), so that paysvc's own sessions must ask for
# pessimistic ones, as they do.
#
# Environment (defaults in brackets):
#   TIDB_CHAOS    [mysql-commit-unknown]  the paychaos scenario(s), comma
#                 separated; "none": no scenario. The scenarios whose
#                 payments time out in lock waits (mysql-locks-deadlocks,
#                 mysql-connections-killed) pass or fail by chance here:
#                 TiDB's KILL can leave a transaction's locks for 20 s
#                 (docs/deployment.md, "TiDB")
#   TESTFLAGS     [-race -count=1 -timeout 15m]
#   TIDB_KEEP_LOG [tmp/tidb/tidb.log]  where the server's log is kept
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
TESTFLAGS=${TESTFLAGS:--race -count=1 -timeout 15m}
CHAOS=${TIDB_CHAOS:-mysql-commit-unknown}
KEEP_LOG=${TIDB_KEEP_LOG:-tmp/tidb/tidb.log}

# The packages whose tests need only MySQL (and the shared RabbitMQ and
# Redis), and of the consumer's tests the payment path.
PACKAGES=(./internal/sqldb/ ./internal/order/ ./internal/outbox/ ./internal/reconcile/)
LISTENER_RUN='^(TestAppliesOnceAndAcksDuplicates|TestTwoConsumersDuplicateStormAppliesOnce|TestInsufficientBalanceWalksWaitQueuesToTerminal|TestRetryAppliesAfterTopUp|TestBadInputGoesTerminalAtOnce|TestRefundedOrderCopyIsADuplicate|TestRedisKeyLostDatabaseStillRefuses|TestCommitUnknownIsRequeuedAloneThenCountedFirst)$'
# Left out, each for a difference of TiDB's (docs/deployment.md):
#   TestServerErrorsSorted               CREATE USER ... WITH MAX_USER_CONNECTIONS is
#                                        accepted and not enforced
#   TestKillOnlyOnTheStatementsServer,   a load balancer in front of this server and a
#   TestKillGivesUpWhenNoSideConnectionReachesTheServer
#                                        throwaway MariaDB, where TiDB's session settings
#                                        (tidb_txn_mode) fail
# The tests of the Grouper's diagnosis of locked rows skip themselves on a
# server whose SKIP LOCKED locks nothing.
SKIP='^(TestServerErrorsSorted|TestKillOnlyOnTheStatementsServer|TestKillGivesUpWhenNoSideConnectionReachesTheServer)$'

client=$(command -v mariadb || command -v mysql || true)
[ -n "$client" ] || { echo "test-tidb: no mariadb or mysql client (make services installs one)" >&2; exit 2; }

bin=$(scripts/build-tidb.sh | tail -n 1)
dir=$(mktemp -d /tmp/paysvc-tidb.XXXXXX)
pid=
stop() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill "$pid"
		# It closes its sessions and store first: a few seconds.
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -9 "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	mkdir -p "$(dirname "$KEEP_LOG")"
	cp "$dir/tidb.log" "$KEEP_LOG" 2>/dev/null || true
	rm -rf "$dir"
}
trap stop EXIT

# A loopback port nothing listens on now.
free_port() {
	local p
	for _ in $(seq 100); do
		p=$((20000 + RANDOM % 20000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	echo "test-tidb: no free port" >&2
	return 1
}
port=$(free_port)
status=$(free_port)
while [ "$status" = "$port" ]; do status=$(free_port); done

# Started in its directory: it writes files relative to its working
# directory (oom_record/) besides those named here.
(cd "$dir" && exec "$bin" --store=unistore --path="$dir/data" --host=127.0.0.1 -P "$port" \
	--status="$status" --status-host=127.0.0.1 --temp-dir="$dir/tmp" \
	--log-file="$dir/tidb.log" --log-slow-query="$dir/tidb-slow.log" >"$dir/stdout" 2>&1) &
pid=$!
deadline=$((SECONDS + 60))
until "$client" -h127.0.0.1 -P"$port" -uroot -e 'SELECT 1' >/dev/null 2>&1; do
	if ! kill -0 "$pid" 2>/dev/null; then
		echo "test-tidb: tidb-server exited at start:" >&2
		tail -n 20 "$dir/stdout" "$dir/tidb.log" >&2 || true
		exit 1
	fi
	if [ "$SECONDS" -ge "$deadline" ]; then
		echo "test-tidb: tidb-server did not answer on 127.0.0.1:$port within 60 s" >&2
		exit 1
	fi
	sleep 0.5
done
"$client" -h127.0.0.1 -P"$port" -uroot -e \
	"SET GLOBAL tidb_enable_check_constraint = ON; SET GLOBAL tidb_txn_mode = 'optimistic'"
echo "test-tidb: $("$client" -h127.0.0.1 -P"$port" -uroot -N -e 'SELECT @@version') on 127.0.0.1:$port (unistore)"
export PAYSVC_TEST_MYSQL_DSN="root@tcp(127.0.0.1:$port)/"

# alive fails, with the server's last words, once tidb-server has died.
alive() {
	kill -0 "$pid" 2>/dev/null && return 0
	echo "test-tidb: tidb-server died ($1); its log:" >&2
	grep -n -A 30 -m 1 'panic' "$dir/stdout" "$dir/tidb.log" >&2 || tail -n 40 "$dir/tidb.log" >&2 || true
	return 1
}

failed=0
# shellcheck disable=SC2086 # TESTFLAGS is a list of flags
$GO test $TESTFLAGS -skip "$SKIP" "${PACKAGES[@]}" || failed=1
alive "the package tests" || exit 1
# shellcheck disable=SC2086
$GO test $TESTFLAGS -run "$LISTENER_RUN" ./internal/listener/ || failed=1
alive "the consumer's tests" || exit 1

if [ "$CHAOS" != none ]; then
	$GO build -tags faultinject -o bin/paysvc-faultinject ./cmd/paysvc
	(cd tools && $GO build -o ../bin/paychaos ./paychaos)
	bin/paychaos -binary bin/paysvc-faultinject -only "$CHAOS" -logs tmp/chaos-tidb || failed=1
	alive "the fault scenario $CHAOS" || exit 1
fi
if [ "$failed" -ne 0 ]; then
	echo "test-tidb: FAIL (tidb-server's log: $KEEP_LOG)"
	exit 1
fi
echo "test-tidb: ok"
