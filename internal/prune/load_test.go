package prune_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/prune"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// loadRows is how many old notices the load test prunes:
// PAYSVC_TEST_PRUNE_ROWS (1000000 for the figures in docs/operations.md),
// else 100,000, which make test runs in seconds.
func loadRows(t *testing.T) int {
	if s := os.Getenv("PAYSVC_TEST_PRUNE_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1000 {
			t.Fatalf("PAYSVC_TEST_PRUNE_ROWS=%q: want a number, 1000 or more", s)
		}
		return n
	}
	return 100_000
}

// seedOldNotices writes n notices sent 100 days ago, in chunks of 100,000
// rows, each one INSERT ... SELECT over a derived table of numbers.
func seedOldNotices(t *testing.T, db *sqlx.DB, n int) {
	t.Helper()
	numbers := digits("a") + " CROSS JOIN " + digits("b") + " CROSS JOIN " + digits("c") + " CROSS JOIN " +
		digits("d") + " CROSS JOIN " + digits("e")
	seq := "(a.d * 10000 + b.d * 1000 + c.d * 100 + d.d * 10 + e.d)"
	for base := 0; base < n; base += 100_000 {
		size := min(100_000, n-base)
		q := fmt.Sprintf(`INSERT INTO t_outbox (event_type, biz_no, payload, status, attempts, next_attempt_at, create_time, sent_time)
			SELECT 'PAYMENT_SUCCEEDED', CONCAT('OLD', s.seq),
			  CONCAT('{"eventId":"', s.seq, '","orderNo":"OLD', s.seq, '","userId":10087,"amount":"199.00","paidAt":"2026-08-28T09:39:55.260Z"}'),
			  'SENT', 1, s.t0, s.t0, s.t0 + INTERVAL 20000 MICROSECOND
			FROM (SELECT %[1]d + %[2]s AS seq, UTC_TIMESTAMP(3) - INTERVAL 100 DAY + INTERVAL (%[1]d + %[2]s) * 1000 MICROSECOND AS t0
			      FROM %[3]s) s
			WHERE s.seq < %[4]d`, base, seq, numbers, base+size)
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("seed notices from %d: %v", base, err)
		}
	}
}

// Payments go on while a run prunes: with n old notices to delete (the
// table every payment inserts into), payments applied through the real
// payment transaction at the same time by four workers keep a p99 latency
// under 1 s and never meet a lock wait timeout, and every old notice goes
// while the payments' own notices stay. The figures are logged (go test
// -v): the run's rows a second, and the payments' latency before and
// during the run.
func TestPaymentsFlowWhilePruning(t *testing.T) {
	t.Parallel()
	dsn, root := testenv.MySQL(t)
	n := loadRows(t)
	start := time.Now()
	seedOldNotices(t, root, n)
	var seeded int
	root.Get(&seeded, "SELECT COUNT(*) FROM t_outbox")
	if seeded != n {
		t.Fatalf("seeded %d notices, want %d", seeded, n)
	}
	t.Logf("seeded %d old notices in %s", n, time.Since(start).Round(time.Millisecond))
	const users = 200
	root.MustExec(`INSERT INTO t_account (user_id, balance)
		SELECT 1 + a.d * 100 + b.d * 10 + c.d, 1000000.00 FROM ` + digits("a") + " CROSS JOIN " + digits("b") + " CROSS JOIN " + digits("c") +
		" WHERE a.d * 100 + b.d * 10 + c.d < " + strconv.Itoa(users))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	payDB, err := sqldb.Open(ctx, dsn, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer payDB.Close()
	pruneDB, err := sqldb.Open(ctx, dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pruneDB.Close()

	// The workers: an order, then its payment (timed), until stopped.
	var pruning atomic.Bool
	var mu sync.Mutex
	var before, during []time.Duration
	var payErrs []error
	var seq atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	store := order.NewStore(payDB)
	amount, _ := money.Parse("1.25")
	for w := 0; w < 4; w++ {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				no := fmt.Sprintf("LOAD%07d", seq.Add(1))
				user := int64(1 + rand.IntN(users))
				if _, err := payDB.ExecContext(ctx, "INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, 1.25)", no, user); err != nil {
					mu.Lock()
					payErrs = append(payErrs, err)
					mu.Unlock()
					return
				}
				during0 := pruning.Load()
				t0 := time.Now()
				err := store.Pay(ctx, order.Payment{OrderNo: no, UserID: user, Amount: amount})
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					payErrs = append(payErrs, err)
				} else if during0 && pruning.Load() {
					during = append(during, d)
				} else if !during0 {
					before = append(before, d)
				}
				mu.Unlock()
			}
		})
	}
	stopWorkers := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopWorkers()
	// A baseline first: 2,000 payments with no run.
	testenv.Eventually(t, 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(before) >= 2000 || len(payErrs) > 0
	}, "the workers did not pay 2,000 orders")

	pruning.Store(true)
	runStart := time.Now()
	// No pause between batches unless PAYSVC_TEST_PRUNE_PAUSE says one:
	// the run at its fastest, the payments' worst case.
	var pause time.Duration
	if s := os.Getenv("PAYSVC_TEST_PRUNE_PAUSE"); s != "" {
		if pause, err = time.ParseDuration(s); err != nil {
			t.Fatalf("PAYSVC_TEST_PRUNE_PAUSE: %v", err)
		}
	}
	res, err := prune.Run(ctx, pruneDB, prune.Options{OutboxAfter: 90 * 24 * time.Hour, Batch: prune.DefaultBatch, Pause: pause})
	elapsed := time.Since(runStart)
	pruning.Store(false)
	stopWorkers()
	if err != nil {
		t.Fatal(err)
	}
	if len(payErrs) > 0 {
		t.Fatalf("%d payments failed while pruning, the first: %v", len(payErrs), payErrs[0])
	}
	var deleted int64
	for _, r := range res {
		deleted += r.Rows
	}
	if deleted != int64(n) {
		t.Errorf("the run deleted %d rows, want the %d old notices", deleted, n)
	}
	var old, fresh, paid int
	root.Get(&old, "SELECT COUNT(*) FROM t_outbox WHERE biz_no LIKE 'OLD%'")
	root.Get(&fresh, "SELECT COUNT(*) FROM t_outbox WHERE biz_no LIKE 'LOAD%'")
	root.Get(&paid, "SELECT COUNT(*) FROM t_order WHERE status = 'PAID'")
	if old != 0 || fresh != paid || paid == 0 {
		t.Errorf("after the run: %d old notices left, %d payments' notices for %d paid orders", old, fresh, paid)
	}
	pb, pd := stats(before), stats(during)
	t.Logf("pruned %d rows (pause %s) in %s: %.0f rows/s; payments before: %s; during: %s", deleted, pause, elapsed.Round(time.Millisecond),
		float64(deleted)/elapsed.Seconds(), pb, pd)
	if p99 := percentile(during, 0.99); p99 > time.Second {
		t.Errorf("payment p99 during the run %s, want under 1s", p99)
	}
	if len(during) < 100 {
		t.Errorf("only %d payments completed during the run (%s): the run held them up, or ran too short to judge", len(during), elapsed)
	}
}

func stats(ds []time.Duration) string {
	return fmt.Sprintf("%d payments, p50 %s, p99 %s, max %s", len(ds), percentile(ds, 0.5).Round(10*time.Microsecond),
		percentile(ds, 0.99).Round(10*time.Microsecond), percentile(ds, 1).Round(10*time.Microsecond))
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}
