package sqldb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
)

// ErrLeaseLost ends a lease holder's context: a renewal found the lease
// taken by another (it ran out first), or none succeeded for half the
// lease's term, so that the holder stops before another may take it.
var ErrLeaseLost = errors.New("the lease was lost")

// LeaseTerm is how long a lease lasts without renewal. The holder renews
// it every LeaseTerm/3, so a holder that dies (SIGKILL, a lost network)
// keeps others out for at most LeaseTerm.
const LeaseTerm = 30 * time.Second

// leasePoll is how often a taker that waits tries again.
const leasePoll = 250 * time.Millisecond

// takeLease inserts the lease's row, or takes it over when it has run out
// or is the caller's own, setting a new deadline; an unexpired lease of
// another holder is left as it is (0 rows changed). The assignments run in
// order: the deadline changes only when the holder is now the caller. One
// autocommit write: Galera certifies it on every node, so two takers on
// two nodes cannot both change the row.
const takeLease = `INSERT INTO t_lease (name, holder, expires_at) VALUES (?, ?, NOW(3) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
  holder     = IF(expires_at <= NOW(3) OR holder = VALUES(holder), VALUES(holder), holder),
  expires_at = IF(holder = VALUES(holder), VALUES(expires_at), expires_at)`

// Lease takes the lease name (a row of t_lease) for this process, waiting
// up to wait for another holder to let go or run out (ErrLocked after it),
// and returns a context to do the leased work under and the lease's
// release. The context ends with ErrLeaseLost (context.Cause) when the
// lease can no longer be renewed: work that stops with it stops before
// another holder may start.
//
// Unlike GET_LOCK (Lock), which the one server that grants it knows of,
// the lease is a row every node of a Galera or Percona XtraDB Cluster
// certifies: two processes on two nodes never both hold it. Deadlines are
// the servers' clocks, which must agree to well within LeaseTerm/2.
func Lease(ctx context.Context, db *sqlx.DB, name string, wait time.Duration) (context.Context, func(), error) {
	return lease(ctx, db, name, wait, LeaseTerm)
}

func lease(ctx context.Context, db *sqlx.DB, name string, wait, term time.Duration) (context.Context, func(), error) {
	holder := leaseHolder()
	deadline := time.Now().Add(wait)
	var taken time.Time
	for {
		taken = time.Now()
		ok, err := takeLeaseOnce(ctx, db, name, holder, term)
		if err != nil {
			return nil, nil, fmt.Errorf("lease %s: %w", name, err)
		}
		if ok {
			break
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil, ErrLocked
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(min(leasePoll, left)):
		}
	}
	held, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		renew(held, cancel, db, name, holder, term, taken)
	}()
	var once sync.Once
	return held, func() {
		once.Do(func() {
			cancel(context.Canceled)
			<-done
			// Bounded, like Lock's release; a release that does not get
			// through leaves the lease to run out.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), lockReleaseTimeout)
			defer rcancel()
			db.ExecContext(rctx, "UPDATE t_lease SET expires_at = NOW(3) WHERE name = ? AND holder = ?", name, holder)
		})
	}, nil
}

// renew keeps the lease until held ends. A renewal that finds the lease
// another's, or none that succeeds for term/2 since the last one began,
// ends held with ErrLeaseLost.
func renew(held context.Context, cancel context.CancelCauseFunc, db *sqlx.DB, name, holder string, term time.Duration, last time.Time) {
	every := term / 3
	for {
		select {
		case <-held.Done():
			return
		case <-time.After(every):
		}
		start := time.Now()
		rctx, rcancel := context.WithTimeout(held, term/10)
		ok, err := takeLeaseOnce(rctx, db, name, holder, term)
		rcancel()
		switch {
		case err == nil && ok:
			last, every = start, term/3
		case err == nil:
			cancel(fmt.Errorf("%w: %s is another holder's", ErrLeaseLost, name))
			return
		case time.Since(last) >= term/2:
			cancel(fmt.Errorf("%w: %s not renewed for %s: %w", ErrLeaseLost, name, time.Since(last).Round(time.Millisecond), err))
			return
		default:
			every = term / 10 // try again soon
		}
	}
}

// takeLeaseOnce runs takeLease once: true when the caller holds the lease
// now. A deadlock (on Galera, a concurrent taker on another node won the
// certification) is another holder's lease.
func takeLeaseOnce(ctx context.Context, db *sqlx.DB, name, holder string, term time.Duration) (bool, error) {
	res, err := db.ExecContext(ctx, takeLease, name, holder, term.Microseconds())
	if IsDeadlock(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// leaseHolder names this taker for the row: host, process and a random
// token (one process may take a lease twice, in two jobs).
func leaseHolder() string {
	host, _ := os.Hostname()
	b := make([]byte, 6)
	rand.Read(b)
	h := fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
	if len(h) > 128 {
		h = h[len(h)-128:]
	}
	return h
}
