package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/migrations"
)

// A seeded database is a deterministic function of its shape: order i
// (1..orders) has order number L%010d, user 1 + (i·userMul mod accounts)
// and amount (100 + i·40503 mod 99999) cents; every initEvery-th order is
// INIT, every other one PAID with its PAY_DEDUCT flow and its SENT notice,
// and every tenth PAID order a DUPLICATE event (paysvc's 10% of copies).
// The bench computes the same functions in Go, so it needs no list of the
// INIT orders: it draws their indexes.
type shape struct {
	DB        string
	Accounts  int64
	Orders    int64
	InitEvery int64 // 1: every order INIT
}

// userMul is odd and not a multiple of 5, so i → i·userMul mod 10^k is a
// bijection on each block of 10^k orders: orders spread evenly over users.
const userMul = 2654435761

func (s shape) user(i int64) int64 { return 1 + (i*userMul)%s.Accounts }
func (s shape) amount(i int64) money.Cents {
	return money.Cents(100 + (i*40503)%99999)
}
func (s shape) orderNo(i int64) string { return fmt.Sprintf("L%010d", i) }
func (s shape) inits() int64           { return s.Orders / s.InitEvery }
func (s shape) paid() int64            { return s.Orders - s.inits() }

func (s shape) String() string {
	return fmt.Sprintf("%s: %d accounts, %d orders (%d PAID with a flow and a sent notice each, %d INIT)",
		s.DB, s.Accounts, s.Orders, s.paid(), s.inits())
}

// seedInfo is what the seed table remembers of a database's seeding.
type seedInfo struct {
	shape
	seconds float64
	at      time.Time
}

// seedStatements fill the empty migrated tables of s, each one INSERT …
// SELECT from MariaDB's sequence engine: into an empty table with
// unique_checks and foreign_key_checks off, MariaDB (10.6 and later) skips
// the undo log and builds every index by sorting, so the load takes minutes
// with any buffer pool.
func seedStatements(s shape) []struct{ table, sql string } {
	status := func(col string) string { // 1 when order `col` is INIT
		return fmt.Sprintf("(%s %% %d = 0)", col, s.InitEvery)
	}
	created := "TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq*700000 MICROSECOND"
	cols := fmt.Sprintf("seq, CONCAT('L', LPAD(seq, 10, '0')) AS order_no, 1 + (seq*%d) %% %d AS user_id, "+
		"CAST((100 + (seq*40503) %% 99999)/100 AS DECIMAL(18,2)) AS amount, %s AS created", userMul, s.Accounts, created)
	from := fmt.Sprintf("(SELECT %s FROM seq_1_to_%d) o", cols, s.Orders)
	paid := "WHERE NOT " + status("seq")
	return []struct{ table, sql string }{
		{"t_account", fmt.Sprintf("INSERT INTO t_account (user_id, balance, update_time) "+
			"SELECT seq, 100000000.00, TIMESTAMP'2026-01-01 00:00:00' FROM seq_1_to_%d", s.Accounts)},
		{"t_order", fmt.Sprintf("INSERT INTO t_order (id, order_no, user_id, amount, status, pay_time, create_time, update_time) "+
			"SELECT seq, order_no, user_id, amount, IF(%s, 'INIT', 'PAID'), IF(%s, NULL, created + INTERVAL 2 SECOND), "+
			"created, created + INTERVAL 2 SECOND FROM %s", status("seq"), status("seq"), from)},
		{"t_account_flow", fmt.Sprintf("INSERT INTO t_account_flow (user_id, amount, biz_no, type, remark, create_time) "+
			"SELECT user_id, -amount, order_no, 'PAY_DEDUCT', CONCAT('payment ', order_no), created + INTERVAL 2 SECOND FROM %s %s ORDER BY seq",
			from, paid)},
		{"t_outbox", fmt.Sprintf("INSERT INTO t_outbox (event_type, biz_no, payload, status, attempts, next_attempt_at, create_time, sent_time) "+
			"SELECT '%s', order_no, CONCAT('{\"event\":\"%s\",\"orderNo\":\"', order_no, '\",\"userId\":', user_id, "+
			"',\"amount\":\"', amount, '\",\"paidAt\":\"', DATE_FORMAT(created + INTERVAL 2 SECOND, '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ'), '\"}'), "+
			"'SENT', 1, created + INTERVAL 2 SECOND, created + INTERVAL 2 SECOND, created + INTERVAL 2100000 MICROSECOND FROM %s %s ORDER BY seq",
			outbox.EventPaymentSucceeded, outbox.EventPaymentSucceeded, from, paid)},
		{"t_payment_event", fmt.Sprintf("INSERT INTO t_payment_event (order_no, event, attempt, detail, instance, create_time) "+
			"SELECT order_no, 'DUPLICATE', 0, 'already paid', 'paysvc-seed', created + INTERVAL 3 SECOND FROM %s %s AND seq %% 10 = 1 ORDER BY seq",
			from, paid)},
	}
}

const seedTable = "bench_seed"

// openSeeded returns a pool on s's database, seeding it first unless it
// holds a complete seed of the same shape (a database of another shape, or
// a seed cut half way, is dropped and seeded anew). Migrations the database
// lacks are applied on every open: a new one runs on the seeded tables, as
// it would in production.
func openSeeded(ctx context.Context, rootDSN string, s shape, log func(string)) (*sqlx.DB, string, seedInfo, error) {
	cfg, err := mysql.ParseDSN(rootDSN)
	if err != nil {
		return nil, "", seedInfo{}, err
	}
	admin, err := sqlx.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, "", seedInfo{}, err
	}
	defer admin.Close()
	cfg.DBName = s.DB
	dsn := cfg.FormatDSN()
	info, ok, err := readSeed(ctx, admin, s)
	if err != nil {
		return nil, "", info, err
	}
	if !ok {
		if info, err = seed(ctx, admin, dsn, s, log); err != nil {
			return nil, "", info, err
		}
	}
	db, err := sqldb.Open(ctx, dsn, 40)
	if err != nil {
		return nil, "", info, err
	}
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err == nil {
		start := time.Now()
		var done []string
		if done, err = sqldb.Migrate(ctx, db, ms); err == nil && len(done) > 0 {
			log(fmt.Sprintf("%s: applied %s on the seeded tables in %.1f s", s.DB, strings.Join(done, ", "), time.Since(start).Seconds()))
		}
	}
	if err != nil {
		db.Close()
		return nil, "", info, fmt.Errorf("migrate %s: %w", s.DB, err)
	}
	return db, dsn, info, nil
}

// readSeed reports whether s.DB holds a complete seed of shape s.
func readSeed(ctx context.Context, admin *sqlx.DB, s shape) (seedInfo, bool, error) {
	info := seedInfo{shape: s}
	var row struct {
		Accounts, Orders, InitEvery int64
		Seconds                     float64
		At                          []byte
	}
	err := admin.QueryRowxContext(ctx, fmt.Sprintf("SELECT accounts, orders, init_every, seconds, seeded_at FROM `%s`.%s", s.DB, seedTable)).
		Scan(&row.Accounts, &row.Orders, &row.InitEvery, &row.Seconds, &row.At)
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me) && (me.Number == 1049 || me.Number == 1146): // no database, no seed table
		return info, false, nil
	case errors.Is(err, sql.ErrNoRows):
		return info, false, nil
	case err != nil:
		return info, false, err
	}
	info.seconds = row.Seconds
	info.at, _ = time.Parse("2006-01-02 15:04:05", string(row.At))
	return info, row.Accounts == s.Accounts && row.Orders == s.Orders && row.InitEvery == s.InitEvery, nil
}

// seed (re)creates s.DB, migrates it and loads it.
func seed(ctx context.Context, admin *sqlx.DB, dsn string, s shape, log func(string)) (seedInfo, error) {
	info := seedInfo{shape: s}
	log(fmt.Sprintf("seeding %s", s))
	start := time.Now()
	if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+s.DB+"`"); err != nil {
		return info, err
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+s.DB+"`"); err != nil {
		return info, err
	}
	db, err := sqldb.Open(ctx, dsn, 2)
	if err != nil {
		return info, err
	}
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err == nil {
		_, err = sqldb.Migrate(ctx, db, ms)
	}
	db.Close()
	if err != nil {
		return info, fmt.Errorf("migrate %s: %w", s.DB, err)
	}
	// A plain connection: no statement or idle bounds on a load of minutes.
	raw, err := sqlx.Open("mysql", dsn)
	if err != nil {
		return info, err
	}
	defer raw.Close()
	conn, err := raw.Connx(ctx)
	if err != nil {
		return info, err
	}
	defer conn.Close()
	for _, q := range []string{"SET SESSION unique_checks = 0", "SET SESSION foreign_key_checks = 0", "SET SESSION time_zone = '+00:00'"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return info, err
		}
	}
	for _, st := range seedStatements(s) {
		t := time.Now()
		if _, err := conn.ExecContext(ctx, st.sql); err != nil {
			return info, fmt.Errorf("seed %s: %w", st.table, err)
		}
		log(fmt.Sprintf("  %s loaded in %.1f s", st.table, time.Since(t).Seconds()))
	}
	if _, err := conn.ExecContext(ctx, "SET SESSION unique_checks = 1"); err != nil {
		return info, err
	}
	// Statistics for the optimizer, as a long-lived table has them.
	if _, err := conn.ExecContext(ctx, "ANALYZE TABLE t_account, t_order, t_account_flow, t_outbox, t_payment_event"); err != nil {
		return info, err
	}
	if err := checkSeed(ctx, conn, s); err != nil {
		return info, err
	}
	info.seconds, info.at = time.Since(start).Seconds(), time.Now().UTC()
	if _, err := conn.ExecContext(ctx, "CREATE TABLE "+seedTable+" (accounts BIGINT NOT NULL, orders BIGINT NOT NULL, init_every BIGINT NOT NULL, "+
		"seconds DOUBLE NOT NULL, seeded_at DATETIME NOT NULL)"); err != nil {
		return info, err
	}
	_, err = conn.ExecContext(ctx, "INSERT INTO "+seedTable+" VALUES (?, ?, ?, ?, ?)", s.Accounts, s.Orders, s.InitEvery, info.seconds,
		info.at.Format("2006-01-02 15:04:05"))
	log(fmt.Sprintf("seeded %s in %.0f s", s.DB, info.seconds))
	return info, err
}

// checkSeed compares a few seeded orders with the shape's functions in Go:
// the bench draws payments from these functions, never from the table.
func checkSeed(ctx context.Context, conn *sqlx.Conn, s shape) error {
	for _, i := range []int64{1, s.InitEvery, s.Orders / 2, s.Orders/s.InitEvery*s.InitEvery - s.InitEvery, s.Orders} {
		if i < 1 {
			continue
		}
		var o struct {
			OrderNo string      `db:"order_no"`
			UserID  int64       `db:"user_id"`
			Amount  money.Cents `db:"amount"`
			Status  string      `db:"status"`
		}
		if err := conn.GetContext(ctx, &o, "SELECT order_no, user_id, amount, status FROM t_order WHERE id = ?", i); err != nil {
			return fmt.Errorf("seed check, order %d: %w", i, err)
		}
		want := "PAID"
		if i%s.InitEvery == 0 {
			want = "INIT"
		}
		if o.OrderNo != s.orderNo(i) || o.UserID != s.user(i) || o.Amount != s.amount(i) || o.Status != want {
			return fmt.Errorf("seed check, order %d: %+v, want %s user %d amount %s %s", i, o, s.orderNo(i), s.user(i), s.amount(i), want)
		}
	}
	return nil
}

// footprint is the database's size on disk, per table (InnoDB's files).
func footprint(ctx context.Context, db *sqlx.DB, name string) (string, error) {
	var rows []struct {
		Table string `db:"name"`
		Bytes int64  `db:"bytes"`
		Rows  int64  `db:"table_rows"`
	}
	err := db.SelectContext(ctx, &rows, `SELECT SUBSTRING_INDEX(t.name, '/', -1) AS name, t.allocated_size AS bytes,
		COALESCE(i.table_rows, 0) AS table_rows
		FROM information_schema.innodb_sys_tablespaces t
		LEFT JOIN information_schema.tables i ON i.table_schema = ? AND i.table_name = SUBSTRING_INDEX(t.name, '/', -1)
		WHERE t.name LIKE CONCAT(?, '/%') ORDER BY t.allocated_size DESC`, name, name)
	if err != nil {
		return "", err
	}
	var total int64
	var parts []string
	for _, r := range rows {
		total += r.Bytes
		if r.Bytes >= 64<<20 {
			parts = append(parts, fmt.Sprintf("%s %.2f GiB (~%d rows)", r.Table, float64(r.Bytes)/(1<<30), r.Rows))
		}
	}
	return fmt.Sprintf("%.2f GiB on disk: %s", float64(total)/(1<<30), strings.Join(parts, ", ")), nil
}

// dropSeeded drops the seeded databases (make bench-large-drop).
func dropSeeded(ctx context.Context, rootDSN string, names ...string) error {
	admin, err := sqlx.Open("mysql", rootDSN)
	if err != nil {
		return err
	}
	defer admin.Close()
	for _, n := range names {
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+n+"`"); err != nil {
			return err
		}
		fmt.Printf("dropped %s\n", n)
	}
	return nil
}
