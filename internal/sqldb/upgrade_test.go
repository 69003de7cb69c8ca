package sqldb_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/sqldb"
)

// Every migration, in turn, upgrades a database that holds the schema before
// it and data written in that schema's form (orders, accounts, flows, dead
// letters and their history, notices, payment events, opening balances,
// sessions, probes): every row is still there with every value, but for the
// changes the migration makes on purpose (dataChanges), and the schema is
// the one the migration gives an empty database. The loop runs over the
// migrations that exist: a new one is covered as it lands, with the rows
// seed writes for its previous schema (a migration that changes rows adds
// its change to dataChanges; one that drops or renames a column the seed
// writes makes the seed write the new form from its version on).
func TestEachMigrationUpgradesADatabaseWithData(t *testing.T) {
	t.Parallel()
	ctx, ms := context.Background(), loadMigrations(t)
	fresh, db := emptyDatabase(t), emptyDatabase(t)
	previous := 0
	for i, m := range ms {
		if _, err := sqldb.Migrate(ctx, fresh, ms[:i+1]); err != nil {
			t.Fatalf("%s on an empty database: %v", m.Name, err)
		}
		seed(t, db, previous)
		before := dumpAll(t, db)
		if _, err := sqldb.Migrate(ctx, db, ms[:i+1]); err != nil {
			t.Fatalf("%s on the previous schema with data: %v", m.Name, err)
		}
		after := dumpAll(t, db)
		for table, rows := range before {
			now, ok := after[table]
			if !ok {
				t.Errorf("%s: table %s is gone", m.Name, table)
				continue
			}
			for key, row := range rows {
				got, ok := now[key]
				if !ok {
					t.Errorf("%s: %s row %s is gone", m.Name, table, key)
					continue
				}
				for col, was := range row {
					want := was
					if change := dataChanges[m.Version][table+"."+col]; change != nil {
						want = change(row, got)
					}
					if got[col] != want {
						t.Errorf("%s: %s row %s: %s is %q, was %q, want %q", m.Name, table, key, col, got[col], was, want)
					}
				}
			}
		}
		if got, want := schemaOf(t, db), schemaOf(t, fresh); got != want {
			t.Errorf("%s: the schema upgraded with data differs from the one it gives an empty database:\n%s\nwant\n%s", m.Name, got, want)
		}
		if t.Failed() {
			t.FailNow()
		}
		previous = m.Version
	}
	if len(dumpAll(t, db)["t_order"]) == 0 {
		t.Fatal("no order was seeded")
	}
}

// dataChanges: what each migration does to the values of rows that exist
// when it runs (a column's value from the row as it was, and as it is), by
// version and table.column.
var dataChanges = map[int]map[string]func(was, now map[string]string) string{
	// Dead letters filed under the order number move to the keys of the
	// payment, or of the body when the message had no payment; the update
	// sets their update_time.
	4: {"t_dead_letter.dedup_key": func(r, _ map[string]string) string {
		if r["dedup_key"] != r["order_no"] {
			return r["dedup_key"]
		}
		if r["user_id"] != "NULL" && r["amount"] != "NULL" {
			return "pay:" + sha(r["order_no"]+"|"+r["user_id"]+"|"+r["amount"])
		}
		return "body:" + sha(r["body"])
	}, "t_dead_letter.update_time": func(r, now map[string]string) string {
		if r["dedup_key"] == r["order_no"] && now["update_time"] >= r["update_time"] {
			return now["update_time"]
		}
		return r["update_time"]
	}},
	// A notice not sent yet holds the fixed time instead of NULL.
	7: {"t_outbox.sent_time": func(r, _ map[string]string) string {
		if r["sent_time"] == "NULL" {
			return "1000-01-01 00:00:00.000"
		}
		return r["sent_time"]
	}},
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// seed writes rows as paysvc writes them in the schema of version v (0: an
// empty database), each call its own keys.
func seed(t *testing.T, db *sqlx.DB, v int) {
	t.Helper()
	if v < 1 {
		return
	}
	user := 1000 + v
	k := func(s string) string { return fmt.Sprintf("%s%d", s, v) }
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatalf("seed at version %d: %s: %v", v, q, err)
		}
	}
	exec("INSERT INTO t_account (user_id, balance) VALUES (?, 95.50)", user)
	exec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, 12.34)", k("NEW"), user)
	exec(`INSERT INTO t_order (order_no, user_id, amount, status, pay_time) VALUES (?, ?, 4.50, 'PAID', '2026-11-02 10:00:00.125')`, k("PAID"), user)
	exec(`INSERT INTO t_account_flow (user_id, amount, biz_no, type, remark) VALUES (?, -4.50, ?, 'PAY_DEDUCT', 'pay')`, user, k("PAID"))
	if v < 2 {
		return
	}
	exec("INSERT INTO t_account_opening (user_id, balance, as_of) VALUES (?, 100.00, '2026-11-01')", user)
	exec(`INSERT INTO t_payment_event (order_no, event, error_class, attempt, detail, instance)
		VALUES (?, 'DUPLICATE', '', 1, 'already paid', 'paysvc-0/1')`, k("PAID"))
	body := fmt.Sprintf(`{"orderNo":"%s","userId":%d,"amount":"7.00"}`, k("DL"), user)
	keyed, unkeyed := k("DL"), k("BAD")
	if v >= 4 {
		keyed, unkeyed = "pay:"+sha(k("DL")+"|"+fmt.Sprint(user)+"|7.00"), "body:"+sha("not json "+k(""))
	}
	exec(`INSERT INTO t_dead_letter (dedup_key, order_no, user_id, amount, body, headers, error_class, last_error,
		retry_count, parked_count, fingerprint, first_failed_at, last_failed_at, status, updated_by, reason, alerted_at)
		VALUES (?, ?, ?, 7.00, ?, '{"x-retry-count":5}', 'balance_not_enough', 'balance 1.00 < 7.00', 5, 2, ?,
		'2026-11-03 08:00:00.001', '2026-11-03 08:05:00.002', 'REPLAYED', 'alice', 'topped up', '2026-11-03 08:05:01.000')`,
		keyed, k("DL"), user, body, sha(body))
	exec(`INSERT INTO t_dead_letter_event (dead_letter_id, event, operator, reason, result, error_class, retry_count)
		VALUES (LAST_INSERT_ID(), 'REPLAYED', 'alice', 'topped up', 'published', 'balance_not_enough', 5)`)
	exec(`INSERT INTO t_dead_letter (dedup_key, order_no, body, headers, error_class, last_error, fingerprint,
		first_failed_at, last_failed_at) VALUES (?, ?, ?, '{}', 'bad_message', 'not JSON', ?, NOW(3), NOW(3))`,
		unkeyed, k("BAD"), "not json "+k(""), sha(k("BAD")))
	unsent := "NULL"
	if v >= 7 {
		unsent = "'1000-01-01 00:00:00'"
	}
	exec(`INSERT INTO t_outbox (event_type, biz_no, payload, attempts, last_error, sent_time)
		VALUES ('payment.succeeded', ?, '{"orderNo":"x"}', 2, 'broker blocked', `+unsent+`)`, k("NEW"))
	exec(`INSERT INTO t_outbox (event_type, biz_no, payload, status, sent_time)
		VALUES ('payment.succeeded', ?, '{"orderNo":"y"}', 'SENT', '2026-11-02 10:00:00.250')`, k("PAID"))
	if v >= 5 {
		exec("UPDATE t_dead_letter SET trace_id = '4bf92f3577b34da6a3ce929d0e0e4736' WHERE order_no = ?", k("DL"))
		exec("UPDATE t_outbox SET traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' WHERE biz_no = ?", k("PAID"))
	}
	if v >= 6 {
		exec(`INSERT INTO t_admin_session (id, operator, expires_at, revoked_at, revoked_by)
			VALUES (?, 'alice', '2026-11-04 08:00:00', '2026-11-03 09:00:00', 'bob')`, sha(k("session")))
	}
	if v >= 8 {
		exec("INSERT INTO t_write_probe (instance, probed_at) VALUES (?, '2026-11-05 00:00:00.500')", k("paysvc-"))
	}
}

// dumpAll is every table's rows by primary key, each a column's value as
// text ("NULL" for NULL).
func dumpAll(t *testing.T, db *sqlx.DB) map[string]map[string]map[string]string {
	t.Helper()
	var tables []string
	if err := db.Select(&tables, "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]map[string]string{}
	for _, table := range tables {
		var pk []string
		if err := db.Select(&pk, `SELECT column_name FROM information_schema.key_column_usage
			WHERE table_schema = DATABASE() AND table_name = ? AND constraint_name = 'PRIMARY' ORDER BY ordinal_position`, table); err != nil {
			t.Fatal(err)
		}
		if len(pk) == 0 {
			t.Fatalf("table %s has no primary key", table)
		}
		out[table] = map[string]map[string]string{}
		for _, row := range tableDump(t, db, table) {
			var key []string
			for _, c := range pk {
				key = append(key, row[c])
			}
			out[table][strings.Join(key, "/")] = row
		}
	}
	return out
}

// tableDump is a table's rows, each a column's value as text.
func tableDump(t *testing.T, db *sqlx.DB, table string) []map[string]string {
	t.Helper()
	rows, err := db.Queryx("SELECT * FROM `" + table + "`")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		m := map[string]any{}
		if err := rows.MapScan(m); err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		for c, v := range m {
			switch v := v.(type) {
			case nil:
				row[c] = "NULL"
			case []byte:
				row[c] = string(v)
			case time.Time:
				row[c] = v.Format("2006-01-02 15:04:05.000")
			default:
				row[c] = fmt.Sprint(v)
			}
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i]) < fmt.Sprint(out[j]) })
	return out
}

var autoIncrement = regexp.MustCompile(` AUTO_INCREMENT=\d+`)

// schemaOf is SHOW CREATE TABLE of every table, by name.
func schemaOf(t *testing.T, db *sqlx.DB) string {
	t.Helper()
	var tables []string
	if err := db.Select(&tables, "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() ORDER BY table_name"); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, table := range tables {
		var name, ddl string
		if err := db.QueryRow("SHOW CREATE TABLE `"+table+"`").Scan(&name, &ddl); err != nil {
			t.Fatal(err)
		}
		b.WriteString(autoIncrement.ReplaceAllString(ddl, "") + ";\n")
	}
	return b.String()
}
