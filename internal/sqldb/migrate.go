package sqldb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
)

// Migration is one embedded NNNN_name.sql file, or a step in Go where SQL
// cannot say it portably.
type Migration struct {
	Version int
	Name    string
	SQL     string
	Run     func(ctx context.Context, conn *sqlx.Conn) error
}

// goMigrations run between the SQL files, by version.
var goMigrations = []Migration{
	{Version: 3, Name: "0003_flow_unique_index", Run: flowUniqueIndex},
	{Version: 5, Name: "0005_trace", Run: traceColumns},
	{Version: 10, Name: "0010_prune_indexes", Run: pruneIndexes},
}

// traceColumns adds the W3C trace context: the trace id of a parked payment
// (to find its spans and log lines) and the traceparent a payment's notice
// is published with, each only if it is missing (addMissing).
func traceColumns(ctx context.Context, conn *sqlx.Conn) error {
	return addMissing(ctx, conn, []schemaChange{
		{"t_dead_letter", "column", "trace_id", "ALTER TABLE t_dead_letter ADD COLUMN trace_id VARCHAR(32) NOT NULL DEFAULT ''"},
		{"t_dead_letter", "index", "idx_trace_id", "ALTER TABLE t_dead_letter ADD KEY idx_trace_id (trace_id)"},
		{"t_outbox", "column", "traceparent", "ALTER TABLE t_outbox ADD COLUMN traceparent VARCHAR(55) NOT NULL DEFAULT ''"},
	})
}

// pruneIndexes adds the indexes `paysvc prune` finds its rows by in the
// two tables whose rows go by a time that is not their insertion order: a
// dead letter resolved (REPLAYED or DISCARDED) before its window, by its
// status and update_time, and a sign-in expired before its window. Both
// tables take few writes (a dead letter, a sign-in), none on a payment's
// path; t_outbox and t_payment_event are walked by their primary key and
// get no index (a notice's insert and mark stay as they are).
func pruneIndexes(ctx context.Context, conn *sqlx.Conn) error {
	return addMissing(ctx, conn, []schemaChange{
		{"t_dead_letter", "index", "idx_status_update_time", "ALTER TABLE t_dead_letter ADD KEY idx_status_update_time (status, update_time)"},
		{"t_admin_session", "index", "idx_expires_at", "ALTER TABLE t_admin_session ADD KEY idx_expires_at (expires_at)"},
	})
}

// schemaChange is a column or index a Go migration adds, with its DDL.
type schemaChange struct{ table, kind, name, ddl string }

// addMissing makes each change only if it is missing: a migration is
// recorded after its last change, and one cut half way (a pod evicted, a
// lost connection) must complete on the next run instead of failing on the
// column or index it added (MySQL 8 has no ADD COLUMN IF NOT EXISTS).
func addMissing(ctx context.Context, conn *sqlx.Conn, changes []schemaChange) error {
	for _, c := range changes {
		q := `SELECT COUNT(*) FROM information_schema.columns
			WHERE table_schema = DATABASE() AND table_name = ? AND column_name = ?`
		if c.kind == "index" {
			q = `SELECT COUNT(*) FROM information_schema.statistics
				WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?`
		}
		var n int
		if err := conn.GetContext(ctx, &n, q, c.table, c.name); err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if _, err := conn.ExecContext(ctx, c.ddl); err != nil {
			return err
		}
	}
	return nil
}

// LoadMigrations reads the *.sql files of fsys, sorted by version.
func LoadMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, name := range names {
		prefix, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.sql", name)
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: strings.TrimSuffix(path.Base(name), ".sql"), SQL: string(body)})
	}
	ms = append(ms, goMigrations...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", ms[i-1].Name, ms[i].Name, ms[i].Version)
		}
	}
	return ms, nil
}

// statements splits a migration into statements: each ends with ';' at the
// end of a line; whole-line '--' comments are dropped.
func statements(sqlText string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(sqlText, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// VersionsTable records the applied migrations, a row each. Its name is
// paysvc's own: schema_migrations, the name paysvc used before, is also
// golang-migrate's and Rails', and in a database shared with such a tool
// each would read the other's versions.
const VersionsTable = "paysvc_schema_migrations"

const createVersions = `CREATE TABLE IF NOT EXISTS paysvc_schema_migrations (
  version    INT          NOT NULL,
  name       VARCHAR(255) NOT NULL,
  applied_at DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`

// Migrate applies the migrations not yet recorded in
// paysvc_schema_migrations, one at a time, under a named lock so that
// replicas starting together do not race. It is safe to re-run. First it
// moves the versions an earlier paysvc recorded in schema_migrations
// (moveVersions). It returns the names it applied, then checks the schema's
// guards (CheckSchema). The named lock is the server's own: two runs
// through two nodes of a Galera cluster may both hold it, and then the
// second to record a version fails on its row of paysvc_schema_migrations
// (every migration's statements may run twice: they check what exists
// first).
func Migrate(ctx context.Context, db *sqlx.DB, ms []Migration) ([]string, error) {
	conn, release, err := Lock(ctx, db, "paysvc.migrate", 60*time.Second)
	if errors.Is(err, ErrLocked) {
		return nil, fmt.Errorf("migrate lock: another migration holds 'paysvc.migrate'")
	}
	if err != nil {
		return nil, fmt.Errorf("migrate lock: %w", err)
	}
	defer release()

	if err := moveVersions(ctx, conn, ms); err != nil {
		return nil, fmt.Errorf("move schema_migrations to %s: %w", VersionsTable, err)
	}
	if _, err := conn.ExecContext(ctx, createVersions); err != nil {
		return nil, fmt.Errorf("create %s: %w", VersionsTable, err)
	}
	applied := map[int]bool{}
	var versions []int
	if err := conn.SelectContext(ctx, &versions, "SELECT version FROM paysvc_schema_migrations"); err != nil {
		return nil, err
	}
	for _, v := range versions {
		applied[v] = true
	}
	var done []string
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		for _, stmt := range statements(m.SQL) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return done, fmt.Errorf("migration %s: %w", m.Name, err)
			}
		}
		if m.Run != nil {
			if err := m.Run(ctx, conn); err != nil {
				return done, fmt.Errorf("migration %s: %w", m.Name, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO paysvc_schema_migrations (version, name) VALUES (?, ?)", m.Version, m.Name); err != nil {
			return done, fmt.Errorf("migration %s: record version: %w", m.Name, err)
		}
		done = append(done, m.Name)
	}
	return done, CheckSchema(ctx, db, ms)
}

// moveVersions moves the versions an earlier paysvc recorded in
// schema_migrations to paysvc_schema_migrations, the table's own name, with
// their times. A schema_migrations that is not paysvc's (ownFormerVersions)
// is left alone and never read. It runs under the migration lock and is
// idempotent: the rename is atomic, and when both tables exist (a paysvc
// from before the move ran its migrate again, after a rollback, and made
// the old table anew) the old table's rows are added to the new one's and
// the old table dropped, so a step cut between the two is done again.
func moveVersions(ctx context.Context, conn *sqlx.Conn, ms []Migration) error {
	own, err := ownFormerVersions(ctx, conn, ms)
	if err != nil || !own {
		return err
	}
	var exists int
	if err := conn.GetContext(ctx, &exists, `SELECT COUNT(*) FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name = ?`, VersionsTable); err != nil {
		return err
	}
	if exists == 0 {
		_, err := conn.ExecContext(ctx, "RENAME TABLE schema_migrations TO paysvc_schema_migrations")
		return err
	}
	if _, err := conn.ExecContext(ctx, `INSERT IGNORE INTO paysvc_schema_migrations (version, name, applied_at)
		SELECT version, name, applied_at FROM schema_migrations`); err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, "DROP TABLE schema_migrations")
	return err
}

// ownFormerVersions reports whether the database holds a schema_migrations
// that paysvc made: paysvc's three columns (version, name, applied_at) in
// its order, the row of 0001_init, and no row but paysvc's migrations of
// ms, by version and name. golang-migrate's (version, dirty), Rails'
// (version), Ecto's (version, inserted_at), or a table with paysvc's
// columns and another tool's rows are not.
//
// The columns come from the table's own result set, not from
// information_schema.columns: every migrate (each test database's too) asks,
// and MariaDB 10.11 was seen to crash freeing the temporary table of an
// information_schema.columns query while other sessions dropped databases.
func ownFormerVersions(ctx context.Context, q queryer, ms []Migration) (bool, error) {
	rs, err := q.QueryxContext(ctx, "SELECT * FROM schema_migrations LIMIT 0")
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1146 { // no such table
		return false, nil
	}
	if err != nil {
		return false, err
	}
	cols, err := rs.Columns()
	rs.Close()
	if err != nil {
		return false, err
	}
	if strings.ToLower(strings.Join(cols, ",")) != "version,name,applied_at" {
		return false, nil
	}
	var rows []struct {
		Version int    `db:"version"`
		Name    string `db:"name"`
	}
	if err := q.SelectContext(ctx, &rows, "SELECT version, name FROM schema_migrations"); err != nil {
		return false, err
	}
	names := map[int]string{}
	for _, m := range ms {
		names[m.Version] = m.Name
	}
	init := false
	for _, r := range rows {
		if names[r.Version] != r.Name {
			return false, nil
		}
		init = init || r.Name == "0001_init"
	}
	return init, nil
}

// flowUniqueIndex adds UNIQUE uk_biz_no_type to a t_account_flow that
// predates paysvc (0001 creates the table with it, but keeps an existing
// table). Legacy duplicates make it refuse, naming the way out.
func flowUniqueIndex(ctx context.Context, conn *sqlx.Conn) error {
	cols, err := flowIndexColumns(ctx, conn)
	if err != nil {
		return err
	}
	if cols == "biz_no,type" {
		return nil
	}
	var dups int
	err = conn.GetContext(ctx, &dups, `SELECT COUNT(*) FROM (SELECT biz_no, type FROM t_account_flow
		GROUP BY biz_no, type HAVING COUNT(*) > 1) d`)
	if err != nil {
		return err
	}
	if dups > 0 {
		return fmt.Errorf("t_account_flow has %d (biz_no, type) pairs booked more than once, so UNIQUE "+
			"uk_biz_no_type cannot be added: run `paysvc reconcile` to list them and `paysvc reconcile --fix` "+
			"to book their reversals, then move the reversed duplicates out of t_account_flow "+
			"(docs/operations.md, \"Legacy duplicates\") and run `paysvc migrate` again", dups)
	}
	_, err = conn.ExecContext(ctx, "ALTER TABLE t_account_flow ADD UNIQUE KEY uk_biz_no_type (biz_no, type)")
	return err
}

type queryer interface {
	SelectContext(ctx context.Context, dest any, query string, args ...any) error
	QueryxContext(ctx context.Context, query string, args ...any) (*sqlx.Rows, error)
}

func flowIndexColumns(ctx context.Context, q queryer) (string, error) {
	var cols []string
	err := q.SelectContext(ctx, &cols, `SELECT column_name FROM information_schema.statistics
		WHERE table_schema = DATABASE() AND table_name = 't_account_flow'
		  AND index_name = 'uk_biz_no_type' AND non_unique = 0
		ORDER BY seq_in_index`)
	return strings.Join(cols, ","), err
}

// CheckSchema verifies that every migration is applied and that the last
// wall against double charges stands: the unique index over
// t_account_flow(biz_no, type). paysvc refuses to run without it. It reads
// paysvc_schema_migrations alone: versions recorded in schema_migrations,
// the name an earlier paysvc used, count only once `paysvc migrate` has
// moved them.
func CheckSchema(ctx context.Context, db *sqlx.DB, ms []Migration) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := CheckApplied(ctx, db, ms); err != nil {
		return err
	}
	cols, err := flowIndexColumns(ctx, db)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	if cols != "biz_no,type" {
		return fmt.Errorf("schema: t_account_flow lacks UNIQUE uk_biz_no_type(biz_no, type) (found %q): duplicate payments would not be refused", cols)
	}
	return nil
}

// CheckApplied verifies that every migration is applied, as CheckSchema
// does, for a user that may not see the money tables (paysvc prune's).
func CheckApplied(ctx context.Context, db *sqlx.DB, ms []Migration) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var versions []int
	if err := db.SelectContext(ctx, &versions, "SELECT version FROM paysvc_schema_migrations"); err != nil {
		if own, ferr := ownFormerVersions(ctx, db, ms); ferr == nil && own {
			return fmt.Errorf("schema: the applied migrations are recorded in schema_migrations, the table an earlier paysvc used (run `paysvc migrate`: it moves them to %s)", VersionsTable)
		}
		if IsNoGrant(err) {
			return fmt.Errorf("schema: %w: the MySQL user needs SELECT on %s (scripts/least-privilege.sh mysql grants it once `paysvc migrate` has made it)", err, VersionsTable)
		}
		return fmt.Errorf("schema: %w (run `paysvc migrate`)", err)
	}
	have := map[int]bool{}
	for _, v := range versions {
		have[v] = true
	}
	for _, m := range ms {
		if !have[m.Version] {
			return fmt.Errorf("schema: migration %s is not applied (run `paysvc migrate`)", m.Name)
		}
	}
	return nil
}
