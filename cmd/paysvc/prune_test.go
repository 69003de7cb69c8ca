package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/prune"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// seedPrunable writes, in each pruned table, two rows past the default
// windows and one inside them (a notice never sent, however old, and a NEW
// dead letter stay too), and money rows older than any window.
func seedPrunable(t *testing.T, db *sqlx.DB) {
	t.Helper()
	for _, q := range []string{
		`INSERT INTO t_outbox (event_type, biz_no, payload, status, create_time, sent_time) VALUES
			('PAYMENT_SUCCEEDED', 'PR-OLD1', '{}', 'SENT', UTC_TIMESTAMP() - INTERVAL 100 DAY, UTC_TIMESTAMP() - INTERVAL 100 DAY),
			('PAYMENT_SUCCEEDED', 'PR-OLD2', '{}', 'SENT', UTC_TIMESTAMP() - INTERVAL 95 DAY, UTC_TIMESTAMP() - INTERVAL 95 DAY),
			('PAYMENT_SUCCEEDED', 'PR-UNSENT', '{}', 'PENDING', UTC_TIMESTAMP() - INTERVAL 95 DAY, '1000-01-01'),
			('PAYMENT_SUCCEEDED', 'PR-NEW', '{}', 'SENT', UTC_TIMESTAMP(), UTC_TIMESTAMP())`,
		`INSERT INTO t_payment_event (order_no, event, create_time) VALUES
			('PR-OLD1', 'RETRY', UTC_TIMESTAMP() - INTERVAL 100 DAY), ('PR-OLD2', 'RETRY', UTC_TIMESTAMP() - INTERVAL 91 DAY),
			('PR-NEW', 'RETRY', UTC_TIMESTAMP())`,
		`INSERT INTO t_admin_session (id, operator, expires_at) VALUES
			('s-old1', 'ops', UTC_TIMESTAMP() - INTERVAL 30 DAY), ('s-old2', 'ops', UTC_TIMESTAMP() - INTERVAL 8 DAY),
			('s-new', 'ops', UTC_TIMESTAMP() + INTERVAL 1 HOUR)`,
		`INSERT INTO t_dead_letter (id, dedup_key, body, headers, error_class, last_error, fingerprint, first_failed_at, last_failed_at, status, update_time) VALUES
			(1, 'd-old1', '{}', '{}', 'bad_message', 'x', 'f', UTC_TIMESTAMP(), UTC_TIMESTAMP(), 'REPLAYED', UTC_TIMESTAMP() - INTERVAL 200 DAY),
			(2, 'd-old2', '{}', '{}', 'bad_message', 'x', 'f', UTC_TIMESTAMP(), UTC_TIMESTAMP(), 'DISCARDED', UTC_TIMESTAMP() - INTERVAL 181 DAY),
			(3, 'd-unresolved', '{}', '{}', 'bad_message', 'x', 'f', UTC_TIMESTAMP(), UTC_TIMESTAMP(), 'NEW', UTC_TIMESTAMP() - INTERVAL 400 DAY)`,
		`INSERT INTO t_dead_letter_event (dead_letter_id, event, operator, result) VALUES (1, 'PARKED', 'paysvc', ''), (2, 'PARKED', 'paysvc', ''), (3, 'PARKED', 'paysvc', '')`,
		`INSERT INTO t_account (user_id, balance, update_time) VALUES (91, 10.00, UTC_TIMESTAMP() - INTERVAL 1000 DAY)`,
		`INSERT INTO t_order (order_no, user_id, amount, status, create_time) VALUES ('PR-OLD1', 91, 5.00, 'PAID', UTC_TIMESTAMP() - INTERVAL 1000 DAY)`,
		`INSERT INTO t_account_flow (user_id, amount, biz_no, type, create_time) VALUES (91, -5.00, 'PR-OLD1', 'PAY_DEDUCT', UTC_TIMESTAMP() - INTERVAL 1000 DAY)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// prunableCounts is each table's rows, in a fixed order: outbox, events,
// sessions, dead letters, their events, orders, accounts, flows.
func prunableCounts(t *testing.T, db *sqlx.DB) []int {
	t.Helper()
	var out []int
	for _, table := range []string{"t_outbox", "t_payment_event", "t_admin_session", "t_dead_letter", "t_dead_letter_event",
		"t_order", "t_account", "t_account_flow"} {
		var n int
		if err := db.Get(&n, "SELECT COUNT(*) FROM "+table); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

var (
	seededCounts = []int{4, 3, 3, 3, 3, 1, 1, 1}
	prunedCounts = []int{2, 1, 1, 1, 1, 1, 1, 1}
)

// paysvc prune with the default windows: --dry-run counts what would go
// and deletes nothing; the run deletes it, logging a line per table with
// its rows, then the total; the money rows stay.
func TestPruneCommand(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	seedPrunable(t, db)
	env := []string{"PAYSVC_MYSQL_DSN=" + dsn}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"prune", "--dry-run"}, env, &out); err != nil {
		t.Fatalf("prune --dry-run: %v\n%s", err, out.String())
	}
	if got := prunableCounts(t, db); !equalInts(got, seededCounts) {
		t.Fatalf("after --dry-run: %v, want %v", got, seededCounts)
	}
	for _, want := range []string{`"msg":"prune: rows that would go","table":"t_outbox","dry_run":true,"window":"2160h0m0s"`,
		`"rows":2,`, `"msg":"prune: done","dry_run":true,"rows":8`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("prune --dry-run's log lacks %s:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"prune"}, env, &out); err != nil {
		t.Fatalf("prune: %v\n%s", err, out.String())
	}
	if got := prunableCounts(t, db); !equalInts(got, prunedCounts) {
		t.Fatalf("after prune: %v, want %v", got, prunedCounts)
	}
	for _, table := range []string{"t_outbox", "t_payment_event", "t_admin_session", "t_dead_letter"} {
		if !strings.Contains(out.String(), `"msg":"prune: table pruned","table":"`+table+`"`) {
			t.Errorf("prune logged no summary of %s:\n%s", table, out.String())
		}
	}
	if !strings.Contains(out.String(), `"msg":"prune: done","dry_run":false,"rows":8`) {
		t.Errorf("prune logged no total of 8 rows:\n%s", out.String())
	}

	// While another run holds the lease: exit status 1, nothing deleted.
	_, release, err := sqldb.Lease(context.Background(), db, prune.LeaseName, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	db.MustExec("INSERT INTO t_payment_event (order_no, event, create_time) VALUES ('PR-LATE', 'RETRY', UTC_TIMESTAMP() - INTERVAL 100 DAY)")
	out.Reset()
	err = run(context.Background(), []string{"prune"}, env, &out)
	var exit *exitError
	if !errors.As(err, &exit) || exit.code != exitFailure || !errors.Is(err, prune.ErrRunning) {
		t.Fatalf("prune while another holds the lease: %v, want ErrRunning, exit status 1\n%s", err, out.String())
	}
	var n int
	db.Get(&n, "SELECT COUNT(*) FROM t_payment_event WHERE order_no = 'PR-LATE'")
	if n != 1 {
		t.Fatal("a run without the lease deleted rows")
	}
}

// With prune.interval the daemon prunes on its own and counts the rows in
// paysvc_pruned_rows_total{table}.
func TestScheduledPrune(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	seedPrunable(t, w.db)
	addr, _ := w.daemonInProcess("PAYSVC_PRUNE_INTERVAL=1s", "PAYSVC_PRUNE_BATCH=1")
	// The counters move table by table; the last run's time once the run
	// is over.
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.metric(addr, `paysvc_pruned_rows_total{table="t_outbox"}`) == "2" &&
			w.metric(addr, `paysvc_pruned_rows_total{table="t_payment_event"}`) == "2" &&
			w.metric(addr, `paysvc_pruned_rows_total{table="t_admin_session"}`) == "2" &&
			w.metric(addr, `paysvc_pruned_rows_total{table="t_dead_letter"}`) == "2" &&
			w.metric(addr, "paysvc_prune_last_run_timestamp_seconds") != "0"
	}, "the daemon's prune did not count 2 rows in each table and set its last run's time")
	if got := prunableCounts(t, w.db); !equalInts(got, prunedCounts) {
		t.Fatalf("after the daemon's prune: %v, want %v", got, prunedCounts)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
