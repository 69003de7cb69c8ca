package order

import (
	"cmp"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/paysvc/paysvc/internal/batch"
	"github.com/paysvc/paysvc/internal/fault"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// A Grouper commits payments that arrive together in one transaction: one
// fsync and two round trips for up to size payments instead of one fsync
// per payment, which is what lets paysvc go faster than the per-payment
// transaction the database can run.
//
// Grouping never decides a payment's fate on its own. A group commits only
// the payments whose four statements each changed exactly one row; every
// other payment, and every payment of a group that failed before COMMIT, is
// run alone through Store.Pay, the path paysvc takes without grouping, which
// reads the order and says why. So Grouper.Pay returns what Store.Pay would:
// nil (applied by this call), an error wrapping sqldb.ErrCommitUnknown (the
// group's COMMIT failed: don't ack, re-read), or Store.Pay's own answer.
//
// Waiting payments are taken as they are; no payment waits for a group to
// fill. Under a light load every group has one payment.
type Grouper struct {
	s       *Store
	groups  *batch.Collector[*request] // nil: one transaction per payment
	observe func(n int)
}

type request struct {
	ctx  context.Context
	p    Payment
	done chan error // buffered: the committer never blocks on an answer
}

// errAlone is a committer's answer for a payment its group did not apply.
var errAlone = errors.New("not applied in a group: run alone")

// NewGrouper starts conns committers, each putting up to size waiting
// payments into one transaction. observe, if not nil, is told each group's
// size. Stop ends them. With size 1 no committer starts and Pay is Store.Pay.
func (s *Store) NewGrouper(size, conns int, observe func(n int)) *Grouper {
	g := &Grouper{s: s, observe: observe}
	if size > 1 {
		g.groups = batch.Start(max(conns, 1), size, g.commit)
	}
	return g
}

// Stop lets each committer finish its group and waits for them. A Pay after
// Stop runs alone.
func (g *Grouper) Stop() {
	if g.groups != nil {
		g.groups.Stop()
	}
}

// Pay applies p, in a group with other payments waiting at the same moment
// when there are any; it returns what Store.Pay returns.
func (g *Grouper) Pay(ctx context.Context, p Payment) error {
	r := &request{ctx: ctx, p: p, done: make(chan error, 1)}
	taken, err := g.groups.Send(ctx, r)
	switch {
	case err != nil:
		return fmt.Errorf("order %s: pay: %w", p.OrderNo, err)
	case !taken:
		return g.s.Pay(ctx, p)
	}
	// A committer that took r always answers, within the group's deadline
	// (the earliest of its payments' deadlines).
	err = <-r.done
	if errors.Is(err, errAlone) {
		return g.s.Pay(ctx, p)
	}
	return err
}

// commit runs one group of waiting payments; one alone is simply paid.
func (g *Grouper) commit(reqs []*request) {
	if g.observe != nil {
		g.observe(len(reqs))
	}
	if len(reqs) == 1 {
		r := reqs[0]
		r.done <- g.s.Pay(r.ctx, r.p)
		return
	}
	g.run(reqs)
}

// run commits one group and answers each of its payments. A deadlock or a
// lost connection retries the group once; after that, and after any other
// error before COMMIT (a lock wait timeout among them: one locked row must
// not hold the others twice), each payment runs alone.
func (g *Grouper) run(reqs []*request) {
	// Every group takes its rows in the same order, by user then order
	// number (each chain locks its order row, then the user's account), so
	// two groups cannot wait on each other in a cycle. The group's deadline
	// is the earliest of its payments': a payment close to its own deadline
	// cuts the group short, and every payment then runs alone or, if COMMIT
	// was cut, is requeued.
	slices.SortFunc(reqs, func(a, b *request) int {
		return cmp.Or(cmp.Compare(a.p.UserID, b.p.UserID), strings.Compare(a.p.OrderNo, b.p.OrderNo))
	})
	ctx, cancel := batch.Context(reqs, func(r *request) context.Context { return r.ctx })
	defer cancel()
	ps := make([]Payment, len(reqs))
	for i, r := range reqs {
		ps[i] = r.p
	}
	for attempt := 1; ; attempt++ {
		applied, err := g.s.payGroup(ctx, ps)
		if err == nil || errors.Is(err, sqldb.ErrCommitUnknown) {
			for i, r := range reqs {
				switch {
				case !applied[i]:
					r.done <- errAlone
				case err != nil:
					r.done <- fmt.Errorf("order %s: pay: %w", r.p.OrderNo, err)
				default:
					r.done <- nil
				}
			}
			return
		}
		if attempt < 2 && sqldb.Transient(err) {
			g.s.retried(err)
			select {
			case <-ctx.Done():
			case <-time.After(20*time.Millisecond + rand.N(30*time.Millisecond)):
				continue
			}
		}
		for _, r := range reqs {
			r.done <- errAlone
		}
		return
	}
}

// payGroup runs ps's chains in one transaction on one connection and
// commits the payments whose statements each changed one row. A payment
// whose CAS changed nothing left nothing changed and stays out; if one
// changed some rows but not all, the transaction is rolled back and run
// again without it. applied[i] says whether ps[i] was in the committed
// transaction. On an error wrapping sqldb.ErrCommitUnknown, the applied
// ones may or may not be committed; on any other error nothing is.
func (s *Store) payGroup(ctx context.Context, ps []Payment) (applied []bool, err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connection: %w", err)
	}
	defer conn.Close()
	now := time.Now()
	in := make([]int, len(ps)) // the payments in the next try
	for i := range in {
		in[i] = i
	}
	applied = make([]bool, len(ps))
	var opErr error
	rawErr := conn.Raw(func(dc any) error {
		ex := dc.(driver.ExecerContext)
		rollback := func() error { return rollbackOn(ctx, ex) }
		for len(in) > 0 {
			var q strings.Builder
			q.WriteString("START TRANSACTION")
			args := make([]driver.NamedValue, 0, 13*len(in))
			for _, i := range in {
				q.WriteString(";\n")
				q.WriteString(chainBody)
				args = chainArgs(args, ps[i], now)
			}
			res, err := ex.ExecContext(ctx, q.String(), args)
			if err != nil {
				opErr = err
				return rollback()
			}
			counts := res.(mysql.Result).AllRowsAffected() // START TRANSACTION, then 4 per payment
			if len(counts) != 1+4*len(in) {
				opErr = fmt.Errorf("payment group: %d results, want %d", len(counts), 1+4*len(in))
				return rollback()
			}
			var whole []int
			partial := false
			for k, i := range in {
				c := counts[1+4*k : 5+4*k]
				switch {
				case c[0] == 1 && c[1] == 1 && c[2] == 1 && c[3] == 1:
					whole = append(whole, i)
				case c[0] != 0 || c[1] != 0 || c[2] != 0 || c[3] != 0:
					partial = true
				}
			}
			if partial {
				// Undo all and try again with the whole ones only.
				if err := rollback(); err != nil {
					opErr = errors.New("payment group: rollback failed")
					return err
				}
				in = whole
				continue
			}
			if len(whole) == 0 {
				return rollback()
			}
			fault.Point("mid_transaction")
			for _, i := range whole {
				applied[i] = true
			}
			if _, err := ex.ExecContext(ctx, "COMMIT", nil); err != nil {
				opErr = fmt.Errorf("%w: %w", sqldb.ErrCommitUnknown, err)
				return driver.ErrBadConn
			}
			return nil
		}
		return nil
	})
	switch {
	case opErr != nil && errors.Is(opErr, sqldb.ErrCommitUnknown):
		return applied, opErr
	case opErr != nil:
		return make([]bool, len(ps)), opErr
	case rawErr != nil:
		return make([]bool, len(ps)), rawErr
	}
	return applied, nil
}
