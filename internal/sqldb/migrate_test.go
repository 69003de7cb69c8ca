package sqldb_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
	"github.com/paysvc/paysvc/migrations"
)

func loadMigrations(t *testing.T) []sqldb.Migration {
	t.Helper()
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func TestStatementsAndVersions(t *testing.T) {
	ms := loadMigrations(t)
	for i, m := range ms {
		if m.Version != i+1 {
			t.Fatalf("migration %d is %s: versions must run 1, 2, 3 ...", i, m.Name)
		}
	}
}

// A t_account_flow from before paysvc, without the unique index: migrate adds
// the index, or refuses naming reconcile when duplicates exist.
func TestLegacyFlowTableGetsUniqueIndexOrRefuses(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t) // fully migrated
	ctx, ms := context.Background(), loadMigrations(t)
	db.MustExec("ALTER TABLE t_account_flow DROP INDEX uk_biz_no_type")
	db.MustExec("DELETE FROM paysvc_schema_migrations WHERE version = 3")
	db.MustExec(`INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES
		(1, -5.00, 'LEG1', 'PAY_DEDUCT'), (1, -5.00, 'LEG1', 'PAY_DEDUCT'), (1, -3.00, 'LEG2', 'PAY_DEDUCT')`)
	if err := sqldb.CheckSchema(ctx, db, ms); err == nil {
		t.Fatal("CheckSchema accepted a flow table without the unique index")
	}
	_, err := sqldb.Migrate(ctx, db, ms)
	if err == nil || !strings.Contains(err.Error(), "paysvc reconcile") || !strings.Contains(err.Error(), "1 (biz_no, type) pairs") {
		t.Fatalf("migrate with duplicates: %v, want a refusal pointing to reconcile", err)
	}
	// Once the duplicate is gone the index is added.
	db.MustExec("DELETE FROM t_account_flow WHERE biz_no = 'LEG1' ORDER BY id DESC LIMIT 1")
	if _, err := sqldb.Migrate(ctx, db, ms); err != nil {
		t.Fatal(err)
	}
	if err := sqldb.CheckSchema(ctx, db, ms); err != nil {
		t.Fatal(err)
	}
}

// Migration 0007 gives t_outbox a fixed-length status and a NOT NULL
// sent_time, so that marking a notice SENT rewrites its row in place (a
// change of length made InnoDB move the row and reorganise its page: ten
// times the redo). Notices from before keep their state and time.
func TestOutboxMigrationKeepsNoticesAndFixesTheRowLength(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t) // fully migrated
	ctx, ms := context.Background(), loadMigrations(t)
	db.MustExec(`ALTER TABLE t_outbox MODIFY status VARCHAR(16) NOT NULL DEFAULT 'PENDING', MODIFY sent_time DATETIME(3) NULL`)
	db.MustExec("DELETE FROM paysvc_schema_migrations WHERE version = 7")
	db.MustExec(`INSERT INTO t_outbox (event_type, biz_no, payload, sent_time) VALUES ('payment.succeeded', 'OB1', '{}', NULL)`)
	db.MustExec(`INSERT INTO t_outbox (event_type, biz_no, payload, status, sent_time)
		VALUES ('payment.succeeded', 'OB2', '{}', 'SENT', '2026-11-30 10:00:00.250')`)
	if err := sqldb.CheckSchema(ctx, db, ms); err == nil {
		t.Fatal("CheckSchema accepted a database without migration 7")
	}
	if _, err := sqldb.Migrate(ctx, db, ms); err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		BizNo  string `db:"biz_no"`
		Status string `db:"status"`
		Sent   string `db:"sent"`
	}
	if err := db.Select(&rows, `SELECT biz_no, status, DATE_FORMAT(sent_time, '%Y-%m-%d %H:%i:%s.%f') AS sent
		FROM t_outbox ORDER BY biz_no`); err != nil {
		t.Fatal(err)
	}
	want := "[{OB1 PENDING 1000-01-01 00:00:00.000000} {OB2 SENT 2026-11-30 10:00:00.250000}]"
	if got := fmt.Sprint(rows); got != want {
		t.Fatalf("after the migration: %s, want %s", got, want)
	}
	var cols []struct {
		Name     string  `db:"COLUMN_NAME"`
		Type     string  `db:"COLUMN_TYPE"`
		Nullable string  `db:"IS_NULLABLE"`
		Charset  *string `db:"CHARACTER_SET_NAME"`
	}
	if err := db.Select(&cols, `SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, CHARACTER_SET_NAME FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 't_outbox' AND COLUMN_NAME IN ('status', 'sent_time')
		ORDER BY COLUMN_NAME`); err != nil {
		t.Fatal(err)
	}
	if len(cols) != 2 || cols[0].Type != "datetime(3)" || cols[0].Nullable != "NO" ||
		cols[1].Type != "char(7)" || cols[1].Nullable != "NO" || cols[1].Charset == nil || *cols[1].Charset != "ascii" {
		t.Fatalf("t_outbox columns %+v: a SENT mark would change the row's length", cols)
	}
	if _, err := db.Exec(`INSERT INTO t_outbox (event_type, biz_no, payload, status) VALUES ('payment.succeeded', 'OB3', '{}', 'BOGUS')`); err == nil {
		t.Fatal("a status outside PENDING and SENT was accepted")
	}
}

// Migration 7 runs while pods of the previous image go on paying: their
// notices leave sent_time out (NULL by the old default), and one written
// between the migration's UPDATE and its MODIFY must not make the MODIFY
// fail (a rollout would stall on its init container).
func TestOutboxMigrationWhileOldPodsWriteNotices(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t) // fully migrated
	ctx, ms := context.Background(), loadMigrations(t)
	for round := range 3 {
		db.MustExec(`ALTER TABLE t_outbox MODIFY status VARCHAR(16) NOT NULL DEFAULT 'PENDING', MODIFY sent_time DATETIME(3) NULL DEFAULT NULL`)
		db.MustExec("DELETE FROM paysvc_schema_migrations WHERE version = 7")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var written atomic.Int64
		for w := range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					// The previous image's notice insert: no sent_time.
					if _, err := db.Exec(`INSERT INTO t_outbox (event_type, biz_no, payload) VALUES ('payment.succeeded', ?, '{}')`,
						fmt.Sprintf("OLD%d-%d-%d", round, w, i)); err == nil {
						written.Add(1)
					}
				}
			})
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return written.Load() >= 20 }, "the old pods wrote nothing")
		_, err := sqldb.Migrate(ctx, db, ms)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("round %d: migration 7 with old pods writing (%d notices): %v", round, written.Load(), err)
		}
		var nulls int
		if err := db.Get(&nulls, "SELECT COUNT(*) FROM t_outbox WHERE sent_time IS NULL"); err != nil || nulls != 0 {
			t.Fatalf("round %d: %d notices without sent_time (%v)", round, nulls, err)
		}
	}
}

// A migration cut half way (the pod evicted after its first ALTER) is not
// recorded; the next `paysvc migrate` completes it instead of failing on
// what it already added.
func TestTraceMigrationCompletesAfterBeingCutHalfWay(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t) // fully migrated
	ctx, ms := context.Background(), loadMigrations(t)
	// 0005's first change applied, the rest not, nothing recorded.
	db.MustExec("ALTER TABLE t_dead_letter DROP KEY idx_trace_id")
	db.MustExec("ALTER TABLE t_outbox DROP COLUMN traceparent")
	db.MustExec("DELETE FROM paysvc_schema_migrations WHERE version = 5")
	if _, err := sqldb.Migrate(ctx, db, ms); err != nil {
		t.Fatalf("migrate after a cut 0005: %v", err)
	}
	var n int
	db.Get(&n, `SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE()
		AND ((table_name = 't_dead_letter' AND column_name = 'trace_id') OR (table_name = 't_outbox' AND column_name = 'traceparent'))`)
	var keys int
	db.Get(&keys, `SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE()
		AND table_name = 't_dead_letter' AND index_name = 'idx_trace_id'`)
	if n != 2 || keys != 1 {
		t.Fatalf("after the re-run: %d of 2 columns, %d of 1 index", n, keys)
	}
	if _, err := sqldb.Migrate(ctx, db, ms); err != nil {
		t.Fatalf("a second run: %v", err)
	}
}

// emptyDatabase is a database of the test's own with no table in it.
func emptyDatabase(t *testing.T) *sqlx.DB {
	t.Helper()
	_, db := testenv.MySQL(t)
	var tables []string
	if err := db.Select(&tables, "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"); err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		db.MustExec("DROP TABLE `" + table + "`")
	}
	return db
}

func versionRows(t *testing.T, db *sqlx.DB, table string) string {
	t.Helper()
	var rows []struct {
		Version int    `db:"version"`
		Name    string `db:"name"`
		At      string `db:"at"`
	}
	if err := db.Select(&rows, "SELECT version, name, DATE_FORMAT(applied_at, '%Y-%m-%d %H:%i:%s.%f') AS at FROM "+table+" ORDER BY version"); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(rows)
}

func tableExists(t *testing.T, db *sqlx.DB, table string) bool {
	t.Helper()
	var n int
	if err := db.Get(&n, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", table); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// A database migrated by a paysvc that recorded its versions in
// schema_migrations: the daemon refuses it, naming `paysvc migrate`, which
// moves the table (rows and times kept) and goes on from the versions it
// holds; run again, it does nothing.
func TestMigrateMovesTheFormerVersionsTable(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t) // fully migrated
	ctx, ms := context.Background(), loadMigrations(t)
	// The state an earlier paysvc left, one migration behind.
	db.MustExec("RENAME TABLE paysvc_schema_migrations TO schema_migrations")
	db.MustExec("UPDATE schema_migrations SET applied_at = '2026-11-01 10:00:00.125' - INTERVAL version DAY")
	db.MustExec("DELETE FROM schema_migrations WHERE version = ?", ms[len(ms)-1].Version)
	before := versionRows(t, db, "schema_migrations")

	err := sqldb.CheckSchema(ctx, db, ms)
	if err == nil || !strings.Contains(err.Error(), "recorded in schema_migrations") || !strings.Contains(err.Error(), "run `paysvc migrate`") {
		t.Fatalf("CheckSchema with the former table only: %v, want it to name schema_migrations and paysvc migrate", err)
	}
	applied, err := sqldb.Migrate(ctx, db, ms)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{ms[len(ms)-1].Name}; fmt.Sprint(applied) != fmt.Sprint(want) {
		t.Fatalf("applied %v, want %v: the moved versions were not read", applied, want)
	}
	if tableExists(t, db, "schema_migrations") {
		t.Fatal("schema_migrations is still there")
	}
	after := versionRows(t, db, "paysvc_schema_migrations")
	if !strings.HasPrefix(after, strings.TrimSuffix(before, "]")) {
		t.Fatalf("versions after the move:\n%s\nwant those before:\n%s", after, before)
	}
	if applied, err := sqldb.Migrate(ctx, db, ms); err != nil || len(applied) != 0 {
		t.Fatalf("a second run: applied %v, %v", applied, err)
	}
}

// After a rollback to a paysvc from before the move, its migrate makes
// schema_migrations anew and records there what it finds missing: the next
// migrate adds those rows to paysvc_schema_migrations and drops the old
// table.
func TestMigrateMergesAFormerVersionsTableMadeAgain(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t) // fully migrated
	ctx, ms := context.Background(), loadMigrations(t)
	db.MustExec("CREATE TABLE schema_migrations LIKE paysvc_schema_migrations")
	db.MustExec("INSERT INTO schema_migrations SELECT * FROM paysvc_schema_migrations")
	last := ms[len(ms)-1]
	db.MustExec("DELETE FROM paysvc_schema_migrations WHERE version = ?", last.Version)
	want := versionRows(t, db, "schema_migrations")
	applied, err := sqldb.Migrate(ctx, db, ms)
	if err != nil || len(applied) != 0 {
		t.Fatalf("migrate: applied %v, %v; want nothing (the old table records %s)", applied, err, last.Name)
	}
	if tableExists(t, db, "schema_migrations") {
		t.Fatal("schema_migrations is still there")
	}
	if got := versionRows(t, db, "paysvc_schema_migrations"); got != want {
		t.Fatalf("versions %s, want %s", got, want)
	}
}

// A schema_migrations of another tool in the same database is neither read
// nor moved nor changed, whether paysvc migrates the database from empty or
// finds it migrated: golang-migrate's (version, dirty), and tables with
// paysvc's columns but another tool's rows, even one that names its first
// migration 0001_init.
func TestMigrateLeavesAnotherToolsSchemaMigrationsAlone(t *testing.T) {
	t.Parallel()
	for _, tool := range []struct{ name, create, insert string }{
		{"golang-migrate", "CREATE TABLE schema_migrations (version BIGINT NOT NULL, dirty BOOLEAN NOT NULL, PRIMARY KEY (version))",
			"INSERT INTO schema_migrations VALUES (20240101120000, 0)"},
		{"same columns", "CREATE TABLE schema_migrations (version INT NOT NULL, name VARCHAR(255) NOT NULL, applied_at DATETIME(3) NOT NULL, PRIMARY KEY (version))",
			"INSERT INTO schema_migrations VALUES (1, 'create_users', '2024-01-01'), (2, '0002_operations', '2024-01-02')"},
		{"same first name", "CREATE TABLE schema_migrations (version INT NOT NULL, name VARCHAR(255) NOT NULL, applied_at DATETIME(3) NOT NULL, PRIMARY KEY (version))",
			"INSERT INTO schema_migrations VALUES (1, '0001_init', '2024-01-01'), (2, '0002_users', '2024-01-02')"},
	} {
		for _, empty := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/empty=%v", tool.name, empty), func(t *testing.T) {
				t.Parallel()
				var db *sqlx.DB
				if empty {
					db = emptyDatabase(t)
				} else {
					_, db = testenv.MySQL(t)
				}
				ctx, ms := context.Background(), loadMigrations(t)
				db.MustExec(tool.create)
				db.MustExec(tool.insert)
				before := fmt.Sprint(tableDump(t, db, "schema_migrations"))
				applied, err := sqldb.Migrate(ctx, db, ms)
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]int{true: len(ms), false: 0}[empty]; len(applied) != want {
					t.Fatalf("applied %d migrations, want %d: %v", len(applied), want, applied)
				}
				if after := fmt.Sprint(tableDump(t, db, "schema_migrations")); after != before {
					t.Fatalf("the other tool's table changed:\n%s\nwas\n%s", after, before)
				}
				if err := sqldb.CheckSchema(ctx, db, ms); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// A daemon user granted the tables before the move, and not yet
// paysvc_schema_migrations, is told which grant it lacks and where it comes
// from.
func TestCheckSchemaNamesTheMissingGrant(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.Name(t)
	user := "pv_" + name[len(name)-8:]
	db.MustExec("CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw-of-test'")
	t.Cleanup(func() { db.Exec("DROP USER IF EXISTS '" + user + "'@'%'") })
	db.MustExec("GRANT SELECT ON `" + cfg.DBName + "`.t_account_flow TO '" + user + "'@'%'")
	cfg.User, cfg.Passwd = user, "pw-of-test"
	app, err := sqldb.Open(context.Background(), cfg.FormatDSN(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	err = sqldb.CheckSchema(context.Background(), app, loadMigrations(t))
	if err == nil || !strings.Contains(err.Error(), "needs SELECT on paysvc_schema_migrations") || !strings.Contains(err.Error(), "least-privilege.sh") {
		t.Fatalf("CheckSchema without a grant on the versions: %v, want it to name the grant", err)
	}
}
