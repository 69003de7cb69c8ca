package order_test

import (
	"bytes"
	"context"
	"errors"
	"github.com/go-sql-driver/mysql"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/account"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

func seed(t *testing.T, db *sqlx.DB, orderNo string, userID int64, amount, balance string) {
	t.Helper()
	db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, ?)", orderNo, userID, amount)
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (?, ?) ON DUPLICATE KEY UPDATE balance = VALUES(balance)", userID, balance)
}

type state struct {
	Status  order.Status
	Balance money.Cents
	Flows   int
	Sum     money.Cents
}

func read(t *testing.T, db *sqlx.DB, orderNo string, userID int64) state {
	t.Helper()
	var s state
	if err := db.Get(&s.Status, "SELECT status FROM t_order WHERE order_no = ?", orderNo); err != nil {
		t.Fatal(err)
	}
	if err := db.Get(&s.Balance, "SELECT balance FROM t_account WHERE user_id = ?", userID); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM t_account_flow WHERE biz_no = ? AND type = 'PAY_DEDUCT'", orderNo).Scan(&s.Flows, &s.Sum); err != nil {
		t.Fatal(err)
	}
	return s
}

func pay(no string, user int64, amount money.Cents) order.Payment {
	return order.Payment{OrderNo: no, UserID: user, Amount: amount}
}

func TestPayAppliesOnce(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	store := order.NewStore(db)
	ctx := context.Background()
	seed(t, db, "P1", 7, "199.00", "500.00")

	if err := store.Pay(ctx, pay("P1", 7, 19900)); err != nil {
		t.Fatalf("first Pay: %v", err)
	}
	want := state{Status: order.Paid, Balance: 30100, Flows: 1, Sum: -19900}
	if got := read(t, db, "P1", 7); got != want {
		t.Fatalf("after first Pay: %+v, want %+v", got, want)
	}
	err := store.Pay(ctx, pay("P1", 7, 19900))
	if !errors.Is(err, order.ErrAlreadyPaid) {
		t.Fatalf("second Pay: %v, want ErrAlreadyPaid", err)
	}
	if got := read(t, db, "P1", 7); got != want {
		t.Fatalf("after second Pay: %+v, want %+v", got, want)
	}
}

// The CAS guard on its own: an order already PAID (without a flow, as a legacy
// path could leave it) is never charged again.
func TestPayCASRefusesPaidOrder(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seed(t, db, "P2", 7, "10.00", "100.00")
	db.MustExec("UPDATE t_order SET status = 'PAID' WHERE order_no = 'P2'")
	err := order.NewStore(db).Pay(context.Background(), pay("P2", 7, 1000))
	if !errors.Is(err, order.ErrAlreadyPaid) {
		t.Fatalf("Pay: %v, want ErrAlreadyPaid", err)
	}
	want := state{Status: order.Paid, Balance: 10000}
	if got := read(t, db, "P2", 7); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// The unique index on its own: a second PAY_DEDUCT flow for one biz_no is
// refused, whatever the order says.
func TestDeductUniqueIndexRefusesSecondFlow(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ctx := context.Background()
	seed(t, db, "P3", 7, "10.00", "100.00")
	flow := func() error {
		_, err := db.ExecContext(ctx, "INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES (7, -10.00, 'P3', 'PAY_DEDUCT')")
		return err
	}
	if err := flow(); err != nil {
		t.Fatal(err)
	}
	if err := flow(); !sqldb.IsDuplicateKey(err) {
		t.Fatalf("second flow: %v, want a duplicate key error", err)
	}
	if got := read(t, db, "P3", 7); got.Flows != 1 {
		t.Fatalf("got %+v, want one flow", got)
	}
	// Through Pay, with the order still INIT, the index alone refuses it.
	if err := order.NewStore(db).Pay(ctx, pay("P3", 7, 1000)); !errors.Is(err, account.ErrDuplicateFlow) {
		t.Fatalf("Pay with the flow booked and the order INIT: %v, want ErrDuplicateFlow", err)
	}
}

// A unique index other than the flow's refusing a write is not a duplicate
// payment, even when the order number holds the flow index's name (the
// error quotes the entry before the key): the payment must not be dropped
// as already paid.
func TestPayTellsTheFlowIndexByName(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ctx := context.Background()
	const no = "Xuk_biz_no_type1"
	seed(t, db, no, 8, "10.00", "100.00")
	db.MustExec("INSERT INTO t_outbox (event_type, biz_no, payload) VALUES ('PAYMENT_SUCCEEDED', ?, '{}')", no)
	err := order.NewStore(db).Pay(ctx, pay(no, 8, 1000))
	if err == nil || errors.Is(err, account.ErrDuplicateFlow) {
		t.Fatalf("Pay refused by the notice's index: %v, want an error that is not ErrDuplicateFlow", err)
	}
	if got := read(t, db, no, 8); got.Flows != 0 || got.Status != "INIT" {
		t.Fatalf("got %+v, want the order INIT and no flow", got)
	}
}

// The conditional update on its own: a balance that does not cover the
// amount rolls back everything.
func TestPayInsufficientBalanceChangesNothing(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seed(t, db, "P4", 7, "199.00", "198.99")
	err := order.NewStore(db).Pay(context.Background(), pay("P4", 7, 19900))
	if !errors.Is(err, account.ErrInsufficientBalance) {
		t.Fatalf("Pay: %v, want ErrInsufficientBalance", err)
	}
	want := state{Status: order.Init, Balance: 19899}
	if got := read(t, db, "P4", 7); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestPayErrors(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	store := order.NewStore(db)
	seed(t, db, "E1", 1, "50.00", "100.00")
	seed(t, db, "E2", 2, "50.00", "100.00")
	db.MustExec("UPDATE t_order SET status = 'REFUNDED' WHERE order_no = 'E2'")
	db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('E3', 3, 5.00)")
	seed(t, db, "E4", 4, "50.00", "100.00")
	db.MustExec("UPDATE t_order SET status = 'SETTLED' WHERE order_no = 'E4'")

	tests := []struct {
		name string
		p    order.Payment
		want error
	}{
		{"missing order", pay("NOPE", 1, 5000), order.ErrNotFound},
		{"other user", pay("E1", 99, 5000), order.ErrMismatch},
		{"other amount", pay("E1", 1, 5001), order.ErrMismatch},
		{"refunded: paid once, then refunded", pay("E2", 2, 5000), order.ErrAlreadyPaid},
		{"no account", pay("E3", 3, 500), account.ErrNoAccount},
		{"settled", pay("E4", 4, 5000), order.ErrAlreadyPaid},
		{"settled, other amount", pay("E4", 4, 1), order.ErrMismatch},
	}
	for _, tt := range tests {
		if err := store.Pay(context.Background(), tt.p); !errors.Is(err, tt.want) {
			t.Errorf("%s: Pay = %v, want %v", tt.name, err, tt.want)
		}
	}
	var flows int
	db.Get(&flows, "SELECT COUNT(*) FROM t_account_flow")
	var inits int
	db.Get(&inits, "SELECT COUNT(*) FROM t_order WHERE order_no IN ('E1','E3') AND status = 'INIT'")
	if flows != 0 || inits != 2 {
		t.Fatalf("errors changed data: %d flows, %d INIT orders (want 0, 2)", flows, inits)
	}
}

// Amounts stay exact at the edge of DECIMAL(18,2), where double precision
// arithmetic would round.
func TestPayExactAtScale(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seed(t, db, "BIG", 9, "0.01", "9999999999999999.99")
	if err := order.NewStore(db).Pay(context.Background(), pay("BIG", 9, 1)); err != nil {
		t.Fatal(err)
	}
	if got := read(t, db, "BIG", 9).Balance; got != money.Max-1 {
		t.Fatalf("balance %s, want %s", got, money.Max-1)
	}
}

// Twenty goroutines settle the same order: exactly one wins.
func TestPayRaceOneWinner(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	store := order.NewStore(db)
	seed(t, db, "RACE", 5, "1.00", "1000.00")
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- store.Pay(context.Background(), pay("RACE", 5, 100))
		}()
	}
	wg.Wait()
	close(errs)
	wins := 0
	for err := range errs {
		switch {
		case err == nil:
			wins++
		case errors.Is(err, order.ErrAlreadyPaid), errors.Is(err, account.ErrDuplicateFlow):
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	want := state{Status: order.Paid, Balance: 99900, Flows: 1, Sum: -100}
	if got := read(t, db, "RACE", 5); wins != 1 || got != want {
		t.Fatalf("%d winners, state %+v; want 1 winner, %+v", wins, got, want)
	}
}

// A row lock held for a minute by another connection (an operator's open
// transaction) surfaces as a lock wait timeout (1205) after paysvc's own
// bound (mysql.lockWaitTimeout, here 1 s), not after InnoDB's default 50 s
// or the handling timeout; Pay does not wait it out again in place (the
// caller retries it later, counted), and nothing is left half-done.
func TestPayLockWaitTimeoutReturnsAtOnce(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	seed(t, db, "LW1", 11, "1.00", "10.00")
	short, err := sqldb.OpenWith(context.Background(), dsn, sqldb.Options{MaxOpen: 4, LockWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()

	holder := db.MustBegin()
	defer holder.Rollback()
	holder.MustExec("SELECT balance FROM t_account WHERE user_id = 11 FOR UPDATE")
	release := time.AfterFunc(60*time.Second, func() { holder.Rollback() })
	defer release.Stop()

	store := order.NewStore(short) // 3 attempts for deadlocks and lost connections
	var retries []error
	store.OnRetry = func(err error) { retries = append(retries, err) }
	start := time.Now()
	err = store.Pay(context.Background(), pay("LW1", 11, 100))
	took := time.Since(start)
	if !sqldb.IsLockWait(err) {
		t.Fatalf("Pay = %v, want a lock wait timeout", err)
	}
	if took > 5*time.Second || len(retries) != 0 {
		t.Fatalf("Pay took %s with %d in-place retries; want one wait of about 1s", took, len(retries))
	}
	if got := read(t, db, "LW1", 11); got.Status != order.Init || got.Flows != 0 {
		t.Fatalf("after a lock wait timeout: %+v, want INIT with no flow", got)
	}
	holder.Rollback()
	if err := store.Pay(context.Background(), pay("LW1", 11, 100)); err != nil {
		t.Fatalf("after the lock is released: %v", err)
	}
	if got := read(t, db, "LW1", 11); got.Status != order.Paid || got.Flows != 1 || got.Balance != 900 {
		t.Fatalf("after the retry: %+v", got)
	}
}

// A payment for an order that does not exist yet, left in an open
// transaction (a frozen instance), must not block the order's creation:
// READ COMMITTED takes no gap lock where REPEATABLE READ would.
func TestMissedOrderTakesNoGapLock(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seed(t, db, "GAP-A", 13, "1.00", "10.00")
	seed(t, db, "GAP-Z", 13, "1.00", "10.00")
	frozen := db.MustBegin() // a paysvc session: READ COMMITTED
	defer frozen.Rollback()
	res := frozen.MustExec(`UPDATE t_order SET status = 'PAID' WHERE order_no = 'GAP-M' AND status = 'INIT'
		AND user_id = 13 AND amount = CAST('1.00' AS DECIMAL(18,2))`)
	if n, _ := res.RowsAffected(); n != 0 {
		t.Fatalf("the missing order's CAS changed %d rows", n)
	}
	other := db.MustBegin()
	defer other.Rollback()
	other.MustExec("SET SESSION innodb_lock_wait_timeout = 1")
	if _, err := other.Exec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('GAP-M', 13, 1.00)"); err != nil {
		t.Fatalf("creating the order behind an open payment transaction: %v", err)
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
}

// commitCuttingDB is a pool to dsn's database through a proxy that drops
// any packet carrying COMMIT, and the connection with it: the client never
// hears back.
func commitCuttingDB(t *testing.T, dsn string) *sqlx.DB {
	t.Helper()
	cfg, _ := mysql.ParseDSN(dsn)
	upstream := cfg.Addr
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				s, err := net.Dial("tcp", upstream)
				if err != nil {
					c.Close()
					return
				}
				go func() { io.Copy(c, s); c.Close() }()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if bytes.Contains(buf[:n], []byte("\x03COMMIT")) {
							break // drop it: the client never hears back
						}
						s.Write(buf[:n])
					}
					if err != nil {
						break
					}
				}
				c.Close()
				s.Close()
			}()
		}
	}()
	cfg.Addr = ln.Addr().String()
	cut, err := sqldb.Open(context.Background(), cfg.FormatDSN(), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cut.Close() })
	return cut
}

// The connection dies as COMMIT is sent (the proxy drops it): Pay must say
// the outcome is unknown, never success; here the server never saw COMMIT,
// so nothing was applied.
func TestPayReportsCommitUnknown(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	seed(t, db, "CU1", 12, "1.00", "10.00")
	cut := commitCuttingDB(t, dsn)
	err := order.NewStore(cut).Pay(context.Background(), pay("CU1", 12, 100))
	if !errors.Is(err, sqldb.ErrCommitUnknown) {
		t.Fatalf("Pay = %v, want ErrCommitUnknown", err)
	}
	// The premise: the COMMIT never reached the server (the proxy cut it),
	// so nothing was applied.
	if got := read(t, db, "CU1", 12); got != (state{Status: order.Init, Balance: 1000}) {
		t.Fatalf("after a COMMIT the server never saw: %+v", got)
	}
}

// The connection goes dark after the payment's chain ran (its COMMIT is
// black-holed; the server's socket stays open): Pay says the outcome is
// unknown, and the server ends the idle transaction after
// mysql.idleTransactionTimeout, rolling it back and freeing the order and
// account rows, instead of holding them until wait_timeout (hours).
func TestPayOnABlackholedConnectionReleasesItsLocks(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	seed(t, db, "BH1", 14, "1.00", "10.00")
	proxy, proxied := testenv.MySQLProxy(t, dsn)
	proxy.BlackholeWhen(testenv.IsCommitOrKill) // only the server may end it
	dark, err := sqldb.OpenWith(context.Background(), proxied, sqldb.Options{MaxOpen: 2, IdleTransaction: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer dark.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := order.NewStore(dark).Pay(ctx, pay("BH1", 14, 100)); !errors.Is(err, sqldb.ErrCommitUnknown) {
		t.Fatalf("Pay = %v, want commit unknown", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		tx := db.MustBegin()
		defer tx.Rollback()
		tx.MustExec("SET SESSION innodb_lock_wait_timeout = 1")
		var st string
		return tx.Get(&st, "SELECT status FROM t_order WHERE order_no = 'BH1' FOR UPDATE") == nil && st == "INIT" &&
			tx.Get(&st, "SELECT balance FROM t_account WHERE user_id = 14 FOR UPDATE") == nil
	}, "the dark payment's transaction still holds its rows")
	if got := read(t, db, "BH1", 14); got != (state{Status: order.Init, Balance: 1000}) {
		t.Fatalf("after the server ended it: %+v, want the payment rolled back", got)
	}
	// The payment itself is not lost: run again, it applies once.
	if err := order.NewStore(db).Pay(context.Background(), pay("BH1", 14, 100)); err != nil {
		t.Fatal(err)
	}
}

// A primary failed over to read-only still answers a ping; Ping says it
// takes no writes (the consumer then holds its messages instead of
// spending their attempts on refused writes). A private server runs with
// --read-only; the shared one is never made read-only.
func TestPingRefusesAReadOnlyServer(t *testing.T) {
	t.Parallel()
	addr := testenv.MariaDB(t, "--read-only", "--skip-log-bin")
	db, err := sqlx.Open("mysql", "root@tcp("+addr+")/")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := order.NewStore(db).Ping(context.Background()); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("Ping of a read-only server: %v, want it refused as read-only", err)
	}
	_, shared := testenv.MySQL(t)
	if err := order.NewStore(shared).Ping(context.Background()); err != nil {
		t.Fatalf("Ping of the writable shared server: %v", err)
	}
}
