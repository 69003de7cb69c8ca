package sqldb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// openPool opens a pool of its own on dsn, as another paysvc would.
func openPool(t *testing.T, dsn string) *sqlx.DB {
	t.Helper()
	db, err := sqldb.Open(context.Background(), dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Two processes take one lease: the second is refused while the first
// holds it, waits for its release, and then holds it.
func TestLeaseHasOneHolder(t *testing.T) {
	t.Parallel()
	dsn, _ := testenv.MySQL(t)
	a, b := openPool(t, dsn), openPool(t, dsn)
	ctx := context.Background()
	held, release, err := sqldb.Lease(ctx, a, "paysvc.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := sqldb.Lease(ctx, b, "paysvc.test", 0); !errors.Is(err, sqldb.ErrLocked) {
		t.Fatalf("second taker: %v, want ErrLocked", err)
	}
	if _, _, err := sqldb.Lease(ctx, a, "paysvc.test", 0); !errors.Is(err, sqldb.ErrLocked) {
		t.Fatalf("second taker in the holder's process: %v, want ErrLocked", err)
	}
	if _, release, err := sqldb.Lease(ctx, b, "paysvc.other", 0); err != nil {
		t.Fatalf("another name: %v", err)
	} else {
		release()
	}
	go func() { time.Sleep(300 * time.Millisecond); release() }()
	start := time.Now()
	_, release2, err := sqldb.Lease(ctx, b, "paysvc.test", 10*time.Second)
	if err != nil {
		t.Fatalf("taker waiting for the release: %v", err)
	}
	defer release2()
	if waited := time.Since(start); waited > 3*time.Second {
		t.Errorf("taken %s after the release was asked, want within a few polls", waited)
	}
	if held.Err() == nil {
		t.Error("the released holder's context is still live")
	}
}

// A holder renews its lease past its term; one whose renewals no longer
// reach the server stops (its context ends with ErrLeaseLost) before the
// lease runs out and another takes it.
func TestLeaseIsRenewedAndRunsOut(t *testing.T) {
	t.Parallel()
	dsn, _ := testenv.MySQL(t)
	proxy, proxied := testenv.MySQLProxy(t, dsn)
	holderDB, other := openPool(t, proxied), openPool(t, dsn)
	ctx := context.Background()
	const term = 1500 * time.Millisecond
	held, release, err := sqldb.LeaseFor(ctx, holderDB, "paysvc.test", 0, term)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	for end := time.Now().Add(2 * term); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, _, err := sqldb.LeaseFor(ctx, other, "paysvc.test", 0, term); !errors.Is(err, sqldb.ErrLocked) {
			t.Fatalf("taken by another %s into a renewed lease: %v", time.Since(end.Add(-2*term)), err)
		}
		if held.Err() != nil {
			t.Fatalf("holder's context ended while it renews: %v", context.Cause(held))
		}
	}
	proxy.BlackholeWhen(func([]byte) bool { return true })
	cut := time.Now()
	var lostAt, takenAt time.Time
	testenv.Eventually(t, 10*time.Second, func() bool {
		if lostAt.IsZero() && held.Err() != nil {
			lostAt = time.Now()
		}
		if takenAt.IsZero() {
			if _, r, err := sqldb.LeaseFor(ctx, other, "paysvc.test", 0, term); err == nil {
				takenAt = time.Now()
				r()
			}
		}
		return !lostAt.IsZero() && !takenAt.IsZero()
	}, "holder never lost the lease, or no one else took it")
	if !errors.Is(context.Cause(held), sqldb.ErrLeaseLost) {
		t.Errorf("holder's context ended with %v, want ErrLeaseLost", context.Cause(held))
	}
	if !lostAt.Before(takenAt) {
		t.Errorf("holder stopped %s after the cut, another took the lease %s after it: want the holder first",
			lostAt.Sub(cut).Round(time.Millisecond), takenAt.Sub(cut).Round(time.Millisecond))
	}
}
