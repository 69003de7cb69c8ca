package prune_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/paysvc/paysvc/internal/prune"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

const day = 24 * time.Hour

// windows are the windows of the tests: 90 days for notices and events,
// 7 for sessions, 180 for dead letters.
func windows() prune.Options {
	return prune.Options{OutboxAfter: 90 * day, EventsAfter: 90 * day, SessionsAfter: 7 * day, DeadLettersAfter: 180 * day}
}

// ago is a time n days before the server's now, as SQL.
func ago(days int) string {
	return fmt.Sprintf("UTC_TIMESTAMP(3) - INTERVAL %d DAY", days)
}

// seedAll writes rows on both sides of every window, and money rows older
// than any, with names that say whether each must stay: the key of each
// row that must go starts with "GO", of each that must stay with "KEEP".
func seedAll(t *testing.T, db *sqlx.DB) {
	t.Helper()
	exec := func(q string) {
		t.Helper()
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Notices: sent long ago (go); pending, written long ago (stay: never
	// sent); written long ago and sent lately (stay); recent (stay).
	for i, n := range []struct{ biz, status, created, sent string }{
		{"GO-N1", "SENT", ago(200), ago(199)},
		{"KEEP-N2", "PENDING", ago(200), "'1000-01-01 00:00:00'"},
		{"GO-N3", "SENT", ago(150), ago(150)},
		{"KEEP-N4", "SENT", ago(100), ago(10)},
		{"GO-N5", "SENT", ago(95), ago(95)},
		{"KEEP-N6", "PENDING", ago(95), "'1000-01-01 00:00:00'"},
		{"KEEP-N7", "SENT", ago(1), ago(1)},
		{"KEEP-N8", "PENDING", "UTC_TIMESTAMP(3)", "'1000-01-01 00:00:00'"},
	} {
		exec(fmt.Sprintf(`INSERT INTO t_outbox (id, event_type, biz_no, payload, status, create_time, sent_time)
			VALUES (%d, 'PAYMENT_SUCCEEDED', '%s', '{}', '%s', %s, %s)`, i+1, n.biz, n.status, n.created, n.sent))
	}
	// Events: by their time.
	for i, e := range []struct {
		order string
		days  int
	}{{"GO-E1", 300}, {"GO-E2", 91}, {"KEEP-E3", 89}, {"KEEP-E4", 0}} {
		exec(fmt.Sprintf(`INSERT INTO t_payment_event (id, order_no, event, create_time) VALUES (%d, '%s', 'RETRY', %s)`,
			i+1, e.order, ago(e.days)))
	}
	// Sessions: by their expiry, revoked or not.
	for _, s := range []struct {
		id        string
		expiresIn string
	}{{"GO-S1", ago(30)}, {"GO-S2", ago(8)}, {"KEEP-S3", ago(6)}, {"KEEP-S4", "UTC_TIMESTAMP(3) + INTERVAL 1 HOUR"}} {
		exec(fmt.Sprintf(`INSERT INTO t_admin_session (id, operator, created_at, expires_at, revoked_at)
			VALUES ('%s', 'ops', %s - INTERVAL 8 HOUR, %s, NULL)`, s.id, s.expiresIn, s.expiresIn))
	}
	exec("UPDATE t_admin_session SET revoked_at = created_at WHERE id IN ('GO-S2', 'KEEP-S4')")
	// Dead letters: resolved long ago (go, with their history); NEW however
	// old (stay); resolved lately (stay).
	for i, d := range []struct {
		key, status string
		days        int
	}{{"GO-D1", "REPLAYED", 400}, {"GO-D2", "DISCARDED", 181}, {"KEEP-D3", "NEW", 400}, {"KEEP-D4", "REPLAYED", 179},
		{"KEEP-D5", "DISCARDED", 10}, {"GO-D6", "REPLAYED", 200}} {
		exec(fmt.Sprintf(`INSERT INTO t_dead_letter (id, dedup_key, order_no, body, headers, error_class, last_error, fingerprint,
			first_failed_at, last_failed_at, status, create_time, update_time)
			VALUES (%d, '%s', '%s', '{}', '{}', 'bad_message', 'x', 'f', %s, %s, '%s', %s, %s)`,
			i+1, d.key, d.key, ago(d.days+1), ago(d.days+1), d.status, ago(d.days+1), ago(d.days)))
		exec(fmt.Sprintf(`INSERT INTO t_dead_letter_event (dead_letter_id, event, operator, result) VALUES
			(%d, 'PARKED', 'paysvc', ''), (%d, '%s', 'ops', '')`, i+1, i+1, d.status))
	}
	// Money rows, older than every window: never touched.
	exec("INSERT INTO t_account (user_id, balance, update_time) VALUES (1, 10.00, " + ago(1000) + ")")
	exec("INSERT INTO t_order (order_no, user_id, amount, status, create_time) VALUES ('KEEP-O1', 1, 5.00, 'PAID', " + ago(1000) + ")")
	exec("INSERT INTO t_account_flow (user_id, amount, biz_no, type, create_time) VALUES (1, -5.00, 'KEEP-O1', 'PAY_DEDUCT', " + ago(1000) + ")")
}

// keys lists what each table holds, by the key the seed named it with.
func keys(t *testing.T, db *sqlx.DB) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for table, q := range map[string]string{
		"t_outbox":            "SELECT biz_no FROM t_outbox",
		"t_payment_event":     "SELECT order_no FROM t_payment_event",
		"t_admin_session":     "SELECT id FROM t_admin_session",
		"t_dead_letter":       "SELECT dedup_key FROM t_dead_letter",
		"t_dead_letter_event": "SELECT d.dedup_key FROM t_dead_letter_event e JOIN t_dead_letter d ON d.id = e.dead_letter_id",
		"orphan_events":       "SELECT CAST(dead_letter_id AS CHAR) FROM t_dead_letter_event WHERE dead_letter_id NOT IN (SELECT id FROM t_dead_letter)",
		"t_order":             "SELECT order_no FROM t_order",
		"t_account_flow":      "SELECT biz_no FROM t_account_flow",
		"t_account":           "SELECT CAST(user_id AS CHAR) FROM t_account",
	} {
		var ks []string
		if err := db.Select(&ks, q); err != nil {
			t.Fatal(err)
		}
		slices.Sort(ks)
		out[table] = slices.Compact(ks)
	}
	return out
}

// kept is what must stay of seedAll's rows.
func kept(all map[string][]string) map[string][]string {
	out := map[string][]string{}
	for table, ks := range all {
		out[table] = slices.DeleteFunc(slices.Clone(ks), func(k string) bool { return strings.HasPrefix(k, "GO") })
	}
	return out
}

// Each window is honoured: what is older goes, what is younger stays; a
// notice never sent and a dead letter still NEW stay however old, and a
// dead letter's history goes with it. The money rows are never touched.
// A dry run first counts exactly what the run then deletes, and deletes
// nothing; the counts the metric is given add up to the rows deleted.
func TestPruneHonoursTheWindows(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seedAll(t, db)
	before := keys(t, db)
	ctx := context.Background()

	o := windows()
	o.Batch = 2 // several batches per table
	o.DryRun = true
	dry, err := prune.Run(ctx, db, o)
	if err != nil {
		t.Fatal(err)
	}
	if after := keys(t, db); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a dry run deleted rows:\n%v\nwere\n%v", after, before)
	}
	want := map[string]int64{"t_outbox": 3, "t_payment_event": 2, "t_admin_session": 2, "t_dead_letter": 3}
	for _, r := range dry {
		if r.Rows != want[r.Table] {
			t.Errorf("dry run: %s: %d rows would go, want %d", r.Table, r.Rows, want[r.Table])
		}
	}

	core, logs := observer.New(zap.InfoLevel)
	o.DryRun, o.Log = false, zap.New(core)
	var mu sync.Mutex
	metric := map[string]int64{}
	o.OnPruned = func(table string, n int64) { mu.Lock(); metric[table] += n; mu.Unlock() }
	res, err := prune.Run(ctx, db, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Rows != want[r.Table] || metric[r.Table] != want[r.Table] {
			t.Errorf("%s: %d rows deleted, the metric told %d, want %d", r.Table, r.Rows, metric[r.Table], want[r.Table])
		}
	}
	if got, want := keys(t, db), kept(before); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the run:\n%v\nwant\n%v", got, want)
	}
	if n := logs.FilterMessage("prune: table pruned").Len(); n != 4 {
		t.Errorf("%d summary lines, want one per table:\n%v", n, logs.All())
	}
	for _, e := range logs.FilterMessage("prune: table pruned").All() {
		if c := e.ContextMap(); c["rows"] != want[c["table"].(string)] {
			t.Errorf("summary of %v: rows %v", c["table"], c["rows"])
		}
	}

	// Again: nothing left to go.
	res, err = prune.Run(ctx, db, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Rows != 0 {
			t.Errorf("second run: %s: %d rows deleted", r.Table, r.Rows)
		}
	}
}

// A window of 0 leaves its table whole.
func TestPruneWindowZeroKeepsTheTable(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seedAll(t, db)
	before := keys(t, db)
	o := windows()
	o.OutboxAfter, o.DeadLettersAfter = 0, 0
	if _, err := prune.Run(context.Background(), db, o); err != nil {
		t.Fatal(err)
	}
	after := keys(t, db)
	for _, table := range []string{"t_outbox", "t_dead_letter", "t_dead_letter_event"} {
		if fmt.Sprint(after[table]) != fmt.Sprint(before[table]) {
			t.Errorf("%s pruned with its window 0: %v, was %v", table, after[table], before[table])
		}
	}
	if fmt.Sprint(after["t_payment_event"]) != fmt.Sprint(kept(before)["t_payment_event"]) {
		t.Errorf("t_payment_event not pruned: %v", after["t_payment_event"])
	}
}

// Two runs never prune at once: a run started while another holds the
// lease returns ErrRunning and deletes nothing, whether the other is a
// run in this process or a lease held elsewhere; once released, a run
// proceeds.
func TestPruneRunsOneAtATime(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seedAll(t, db)
	ctx := context.Background()
	o := windows()
	o.Batch = 1
	var second error
	var secondRes []prune.Result
	var once sync.Once
	o.OnPruned = func(string, int64) {
		// The first run is in its first batch: start the second.
		once.Do(func() {
			o2 := windows()
			secondRes, second = prune.Run(ctx, db, o2)
		})
	}
	if _, err := prune.Run(ctx, db, o); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(second, prune.ErrRunning) || secondRes != nil {
		t.Fatalf("a run during another: %v, %v; want ErrRunning", secondRes, second)
	}

	// A lease held by another process.
	_, release, err := sqldb.Lease(ctx, db, prune.LeaseName, 0)
	if err != nil {
		t.Fatal(err)
	}
	db.MustExec("INSERT INTO t_payment_event (order_no, event, create_time) VALUES ('GO-LATE', 'RETRY', " + ago(100) + ")")
	if _, err := prune.Run(ctx, db, windows()); !errors.Is(err, prune.ErrRunning) {
		t.Fatalf("a run while another holds the lease: %v, want ErrRunning", err)
	}
	var n int
	db.Get(&n, "SELECT COUNT(*) FROM t_payment_event WHERE order_no = 'GO-LATE'")
	if n != 1 {
		t.Fatal("a run that did not get the lease deleted rows")
	}
	release()
	if _, err := prune.Run(ctx, db, windows()); err != nil {
		t.Fatalf("after the release: %v", err)
	}
	db.Get(&n, "SELECT COUNT(*) FROM t_payment_event WHERE order_no = 'GO-LATE'")
	if n != 0 {
		t.Fatal("the run after the release did not prune")
	}
}

// A dead letter replayed or parked again while a run holds its batch is
// not deleted: the run checks each row again under its lock.
func TestPruneLeavesADeadLetterThatChanged(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seedAll(t, db)
	// An operator's transaction holds GO-D1 while it makes it NEW again
	// (a new parking of its payment).
	tx, err := db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	tx.MustExec("UPDATE t_dead_letter SET status = 'NEW' WHERE dedup_key = 'GO-D1'")
	done := make(chan error, 1)
	go func() { _, err := prune.Run(context.Background(), db, windows()); done <- err }()
	// The run waits for the row's lock, in its check under the lock.
	testenv.Eventually(t, 4*time.Second, func() bool {
		var n int
		if err := db.Get(&n, `SELECT COUNT(*) FROM information_schema.processlist
			WHERE db = DATABASE() AND info LIKE 'SELECT id FROM t_dead_letter WHERE id IN%FOR UPDATE'`); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}, "the run never waited for the locked dead letter")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ks := keys(t, db)
	if !slices.Contains(ks["t_dead_letter"], "GO-D1") || len(ks["orphan_events"]) > 0 {
		t.Fatalf("the dead letter made NEW under the run's batch: %v", ks)
	}
	var events int
	db.Get(&events, "SELECT COUNT(*) FROM t_dead_letter_event e JOIN t_dead_letter d ON d.id = e.dead_letter_id WHERE d.dedup_key = 'GO-D1'")
	if events != 2 {
		t.Fatalf("the dead letter kept %d events, want its 2", events)
	}
	if slices.Contains(ks["t_dead_letter"], "GO-D2") || slices.Contains(ks["t_dead_letter"], "GO-D6") {
		t.Fatalf("the other resolved dead letters stayed: %v", ks["t_dead_letter"])
	}
}

// The statements find their rows through the primary key or the indexes
// of migration 0010, never by a scan of the table.
func TestPruneQueriesUseTheirIndexes(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	// Enough rows that a scan would cost more than the index.
	db.MustExec(`INSERT INTO t_admin_session (id, operator, expires_at)
		SELECT SHA2(CONCAT('s', a.d, b.d, c.d), 256), 'ops', UTC_TIMESTAMP(3) - INTERVAL (a.d * 100 + b.d * 10 + c.d) HOUR
		FROM ` + digits("a") + ` CROSS JOIN ` + digits("b") + ` CROSS JOIN ` + digits("c"))
	db.MustExec(`INSERT INTO t_dead_letter (dedup_key, body, headers, error_class, last_error, fingerprint,
		first_failed_at, last_failed_at, status, update_time)
		SELECT CONCAT('k', a.d, b.d, c.d), '{}', '{}', 'bad_message', 'x', 'f', UTC_TIMESTAMP(3), UTC_TIMESTAMP(3),
		ELT(1 + (a.d % 3), 'NEW', 'REPLAYED', 'DISCARDED'), UTC_TIMESTAMP(3) - INTERVAL (b.d * 10 + c.d) DAY
		FROM ` + digits("a") + ` CROSS JOIN ` + digits("b") + ` CROSS JOIN ` + digits("c"))
	db.MustExec(`INSERT INTO t_outbox (event_type, biz_no, payload, status, sent_time)
		SELECT 'PAYMENT_SUCCEEDED', CONCAT('o', a.d, b.d, c.d), '{}', IF(a.d < 5, 'SENT', 'PENDING'), UTC_TIMESTAMP(3)
		FROM ` + digits("a") + ` CROSS JOIN ` + digits("b") + ` CROSS JOIN ` + digits("c"))
	db.MustExec(`INSERT INTO t_payment_event (order_no, event)
		SELECT CONCAT('o', a.d, b.d, c.d), 'RETRY' FROM ` + digits("a") + ` CROSS JOIN ` + digits("b") + ` CROSS JOIN ` + digits("c"))
	db.MustExec("ANALYZE TABLE t_admin_session, t_dead_letter, t_outbox, t_payment_event")
	cutoff := "UTC_TIMESTAMP(3) - INTERVAL 900 HOUR"
	for _, c := range []struct{ query, key string }{
		{"SELECT id, (status = 'SENT' AND sent_time < NOW()) AS gone, (create_time < NOW()) AS old FROM t_outbox WHERE id > 0 ORDER BY id LIMIT 1000", "PRIMARY"},
		{"DELETE FROM t_outbox WHERE id IN (1, 2, 3) AND status = 'SENT' AND sent_time < NOW()", "PRIMARY"},
		{"SELECT id, (create_time < NOW()) AS gone, (create_time < NOW()) AS old FROM t_payment_event WHERE id > 0 ORDER BY id LIMIT 1000", "PRIMARY"},
		{"DELETE FROM t_payment_event WHERE id IN (1, 2, 3) AND create_time < NOW()", "PRIMARY"},
		{"SELECT id FROM t_admin_session WHERE expires_at < " + cutoff + " ORDER BY expires_at, id LIMIT 100", "idx_expires_at"},
		{"SELECT id FROM t_dead_letter WHERE status = 'REPLAYED' AND update_time < UTC_TIMESTAMP(3) - INTERVAL 90 DAY ORDER BY update_time, id LIMIT 100", "idx_status_update_time"},
		{"SELECT COUNT(*) FROM t_dead_letter WHERE status IN ('REPLAYED', 'DISCARDED') AND update_time < UTC_TIMESTAMP(3) - INTERVAL 90 DAY", "idx_status_update_time"},
		{"SELECT id FROM t_dead_letter WHERE id IN (1, 2, 3) AND status IN ('REPLAYED', 'DISCARDED') AND update_time < NOW() FOR UPDATE", "PRIMARY"},
	} {
		var plan []struct {
			Table string  `db:"table"`
			Type  string  `db:"type"`
			Key   *string `db:"key"`
		}
		rows, err := db.Queryx("EXPLAIN " + c.query)
		if err != nil {
			t.Fatalf("EXPLAIN %s: %v", c.query, err)
		}
		for rows.Next() {
			m := map[string]any{}
			if err := rows.MapScan(m); err != nil {
				t.Fatal(err)
			}
			var p struct {
				Table string  `db:"table"`
				Type  string  `db:"type"`
				Key   *string `db:"key"`
			}
			p.Table, p.Type = str(m["table"]), str(m["type"])
			if k := str(m["key"]); k != "" {
				p.Key = &k
			}
			plan = append(plan, p)
		}
		rows.Close()
		if len(plan) != 1 || plan[0].Key == nil || *plan[0].Key != c.key || plan[0].Type == "ALL" || plan[0].Type == "index" {
			t.Errorf("%s:\nplan %s, want a range or lookup on %s", c.query, showPlan(plan), c.key)
		}
	}
}

func showPlan[T any](plan []T) string {
	var b strings.Builder
	for _, p := range plan {
		v := any(p).(struct {
			Table string  `db:"table"`
			Type  string  `db:"type"`
			Key   *string `db:"key"`
		})
		key := "NULL"
		if v.Key != nil {
			key = *v.Key
		}
		fmt.Fprintf(&b, "[%s %s key=%s]", v.Table, v.Type, key)
	}
	return b.String()
}

func str(v any) string {
	switch s := v.(type) {
	case []byte:
		return string(s)
	case string:
		return s
	}
	return ""
}

// digits is a derived table of the digits 0 to 9 in column d.
func digits(alias string) string {
	var b strings.Builder
	b.WriteString("(SELECT 0 AS d")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&b, " UNION ALL SELECT %d", i)
	}
	b.WriteString(") " + alias)
	return b.String()
}
