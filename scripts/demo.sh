#!/usr/bin/env bash
# make demo: bring up MariaDB, Redis and RabbitMQ on loopback (installing them
# if missing), migrate a demo database, start paysvc, publish payments with
# duplicates, an insufficient balance and malformed messages, and print the
# orders, balances, flows and queue depths that result.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-services.sh
make --no-print-directory build
go build -o bin/paydemo ./cmd/paydemo

VHOST=paysvc_demo
DSN='root@tcp(127.0.0.1:3306)/paysvc_demo'
AMQP="amqp://guest:guest@127.0.0.1:5672/$VHOST"
LOG=tmp/demo/paysvc.log
mkdir -p tmp/demo

echo "== resetting the demo database, vhost and Redis keys"
rabbitmqctl -q delete_vhost "$VHOST" >/dev/null 2>&1 || true
rabbitmqctl -q add_vhost "$VHOST" >/dev/null
rabbitmqctl -q set_permissions -p "$VHOST" guest '.*' '.*' '.*' >/dev/null
bin/paydemo -dsn "$DSN" reset
redis-cli -n 0 --scan --pattern 'demo:pay_success:*' | xargs -r redis-cli -n 0 del >/dev/null

export PAYSVC_MYSQL_DSN="$DSN"
export PAYSVC_AMQP_URL="$AMQP"
export PAYSVC_IDEMPOTENT_KEYPREFIX='demo:pay_success:'
export PAYSVC_RETRY_DELAYS=1s,2s
export PAYSVC_RETRY_MAXATTEMPTS=2
export PAYSVC_HTTP_ADDR=127.0.0.1:18080
export PAYSVC_ADMIN_SECURECOOKIE=false # the admin pages over plain HTTP
export PAYSVC_METRICS_QUEUEINTERVAL=1s

echo "== paysvc migrate"
bin/paysvc migrate | tail -n 1
bin/paydemo -dsn "$DSN" seed

echo "== paysvc run (log: $LOG)"
bin/paysvc run >"$LOG" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  grep -q '"msg":"consuming"' "$LOG" && break
  kill -0 "$PID" 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done

echo "== publishing"
bin/paydemo -amqp "$AMQP" publish
bin/paydemo -dsn "$DSN" -amqp "$AMQP" report

echo
echo "OUTCOMES (from the log)"
grep -o '"result":"[A-Z]*"' "$LOG" | sort | uniq -c

echo
echo "== paysvc dlq list   (terminal messages, kept in t_dead_letter)"
bin/paysvc dlq list
echo
echo "== paysvc dlq replay --class balance_not_enough --dry-run"
bin/paysvc dlq replay --class balance_not_enough --dry-run --reason "demo"
echo
echo "== paysvc trace P20260928003"
bin/paysvc trace P20260928003 --log "$LOG"
echo
echo "== paysvc reconcile"
bin/paysvc reconcile

echo "== SIGTERM: paysvc drains and exits"
kill -TERM "$PID"
wait "$PID" && echo "paysvc exited 0"
trap - EXIT
