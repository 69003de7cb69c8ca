package order

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/paysvc/paysvc/internal/sqldb"
)

// A row another transaction holds locked (an admin's open transaction, a
// batch job, a fraud hold) makes every transaction that needs it wait
// mysql.lockWaitTimeout and end in a lock wait timeout (1205). In a group
// that is every payment of the group, and the next group that holds a
// payment of the same user waits again: one locked account would let one
// group through per lock wait. So the Grouper learns which rows are locked
// and keeps their payments out of its groups:
//
//   - After a lock wait timeout (a group's or a payment's run alone), a
//     short transaction reads which of the payments' account and order rows
//     are locked now: SELECT ... FOR UPDATE SKIP LOCKED, which waits for
//     nothing, then ROLLBACK. Those rows are marked. A server without SKIP
//     LOCKED (before MariaDB 10.6 and MySQL 8.0), or one that does not
//     honour it (TiDB), is not asked again: there a payment run alone
//     that waited the lock out marks its account.
//   - A payment of a marked account or order never joins a group; a group
//     in the database that holds one is cut short (its statement killed,
//     no COMMIT sent) and its payments run alone: it would wait as long,
//     holding rows the others then wait for.
//   - Of a marked user's payments one at a time is in the database, the
//     user's turn: it waits for the row alone and its answer settles the
//     mark (applied: unmarked, and the user's payments group again; a lock
//     wait timeout with the row still locked: marked again). Once a
//     payment run alone has waited the lock out, with no group of this
//     process holding a payment of the user (which might be the holder),
//     the mark is confirmed and the user's other payments are answered at
//     once with ErrAccountLocked: they spend an attempt in a wait queue as
//     a lock wait timeout would, without a worker or a connection waiting.
//     Until then the mark is only suspected (a group's diagnosis can find a
//     row that another of its groups holds) and up to a group's size of the
//     user's payments wait for the turn's answer.
//   - A payment of a marked order (the user's account free) runs alone;
//     applied, it unmarks the order.
//   - A mark ends heldFor after the lock was last seen; at most maxHeld
//     users and as many orders are marked, and the others are grouped as
//     before.
//
// The normal path pays an atomic load per payment and a map entry per
// group (to be cut short).

// ErrAccountLocked: the payment's account row was found locked by another
// transaction, and another payment of the same user waits for it. The error
// also wraps the lock wait timeout that found the row locked
// (sqldb.IsLockWait): retryable, class lock_wait_timeout.
var ErrAccountLocked = errors.New("order: account row found locked by another transaction")

// errCut: a group was cut short before its COMMIT (inflight).
var errCut = errors.New("group cut short: a row it needs was found locked")

// diagnoseWithin bounds the transaction that reads which rows are locked:
// it waits for no lock, so it takes milliseconds.
const diagnoseWithin = 2 * time.Second

// lockedRows reads which of ps' account and order rows another transaction
// holds locked now, without waiting for any: the rows that exist (a plain
// read takes no lock under READ COMMITTED) less those SKIP LOCKED returns,
// in a transaction that is rolled back.
func (s *Store) lockedRows(ctx context.Context, ps []Payment) (users []int64, orders []string, err error) {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	defer tx.Rollback()
	userArgs, orderArgs := make([]any, 0, len(ps)), make([]any, 0, len(ps))
	seen := map[int64]bool{}
	for _, p := range ps {
		if !seen[p.UserID] {
			seen[p.UserID] = true
			userArgs = append(userArgs, p.UserID)
		}
		orderArgs = append(orderArgs, p.OrderNo)
	}
	in := func(n int) string { return "(?" + strings.Repeat(", ?", n-1) + ")" }
	var exist, free []int64
	q := "SELECT user_id FROM t_account WHERE user_id IN " + in(len(userArgs))
	if err := tx.SelectContext(ctx, &exist, q, userArgs...); err != nil {
		return nil, nil, err
	}
	if err := tx.SelectContext(ctx, &free, q+" FOR UPDATE SKIP LOCKED", userArgs...); err != nil {
		return nil, nil, err
	}
	for _, id := range exist {
		if !slices.Contains(free, id) {
			users = append(users, id)
		}
	}
	var existNo, freeNo []string
	q = "SELECT order_no FROM t_order WHERE order_no IN " + in(len(orderArgs))
	if err := tx.SelectContext(ctx, &existNo, q, orderArgs...); err != nil {
		return nil, nil, err
	}
	if err := tx.SelectContext(ctx, &freeNo, q+" FOR UPDATE SKIP LOCKED", orderArgs...); err != nil {
		return nil, nil, err
	}
	for _, no := range existNo {
		if !slices.Contains(freeNo, no) {
			orders = append(orders, no)
		}
	}
	return users, orders, nil
}

// diagnose reads which of ps' rows are locked (Store.lockedRows); ok is
// false when the server could not say, and stays false for a server that
// does not know SKIP LOCKED or does not honour it (TiDB, where it would
// find every row free: sqldb.SkipLockedLocks).
func (g *Grouper) diagnose(ctx context.Context, ps []Payment) (users []int64, orders []string, ok bool) {
	if g.noSkipLocked.Load() {
		return nil, nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, diagnoseWithin)
	defer cancel()
	if !g.skipLockedAsked.Load() {
		honoured, err := sqldb.SkipLockedLocks(ctx, g.s.db)
		if err != nil {
			return nil, nil, false
		}
		g.skipLockedAsked.Store(true)
		if !honoured {
			g.noSkipLocked.Store(true)
			return nil, nil, false
		}
	}
	users, orders, err := g.s.lockedRows(ctx, ps)
	if sqldb.IsSyntax(err) {
		g.noSkipLocked.Store(true)
	}
	return users, orders, err == nil
}

// learnGroup marks what a group's lock wait timeout found locked: the
// users only as suspected (another group of this process may be the one
// holding them).
func (g *Grouper) learnGroup(ctx context.Context, ps []Payment, lockErr error) {
	users, orders, ok := g.diagnose(ctx, ps)
	if !ok {
		return
	}
	lockErr = serverError(lockErr)
	for _, id := range users {
		g.held.markUser(id, lockErr, false)
	}
	for _, no := range orders {
		if g.held.markOrder(no) {
			g.s.locked(0, no)
		}
	}
}

// learnAlone settles what p's answer when run alone says of its rows: a
// payment applied unmarks them; a lock wait timeout marks the ones found
// locked, or its account when the server cannot say; any other answer
// says nothing. It returns the lock wait timeout to turn the user's other
// payments away with, or nil.
func (g *Grouper) learnAlone(ctx context.Context, p Payment, err error) (locked error) {
	switch {
	case err == nil:
		g.held.clearUser(p.UserID)
		g.held.clearOrder(p.OrderNo)
		return nil
	case !sqldb.IsLockWait(err):
		return nil
	}
	lockErr := serverError(err)
	users, orders, ok := g.diagnose(ctx, []Payment{p})
	switch {
	case !ok || len(users) > 0:
		if g.held.markUser(p.UserID, lockErr, true) {
			g.s.locked(p.UserID, "")
		}
		locked = lockErr
	default:
		g.held.clearUser(p.UserID)
	}
	switch {
	case len(orders) > 0:
		if g.held.markOrder(p.OrderNo) {
			g.s.locked(0, p.OrderNo)
		}
	case ok:
		g.held.clearOrder(p.OrderNo)
	}
	return locked
}

// serverError is the server's own error inside err (the lock wait timeout,
// without the operation's words of another payment), or err.
func serverError(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me
	}
	return err
}

// alone pays p without a group, minding the marks: a marked user's
// payment takes the user's turn, waits for it, or is turned away.
func (g *Grouper) alone(ctx context.Context, p Payment) error {
	counted := false
	for {
		what, t, lockErr := g.held.enter(p)
		if what != runFree && !counted {
			g.s.heldOut()
			counted = true
		}
		switch what {
		case runFree, runHeld:
			err := g.s.Pay(ctx, p)
			g.learnAlone(ctx, p, err)
			return err
		case takeTurn:
			var locked error
			defer func() { g.held.end(p.UserID, t, locked) }() // even on a panic: the waiters go on
			err := g.s.Pay(ctx, p)
			locked = g.learnAlone(ctx, p, err)
			return err
		case turnAway:
			return lockedError(p, lockErr)
		}
		select {
		case <-t.done:
			if t.locked != nil {
				return lockedError(p, t.locked)
			}
		case <-ctx.Done():
			g.held.left(p.UserID, t)
			return fmt.Errorf("order %s: pay: waiting for user %d's account row: %w", p.OrderNo, p.UserID, ctx.Err())
		}
	}
}

func lockedError(p Payment, lockErr error) error {
	return fmt.Errorf("order %s: pay: user %d: %w; another payment of the user waits for it, this one is retried later: %w",
		p.OrderNo, p.UserID, ErrAccountLocked, lockErr)
}
