package order

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/paysvc/paysvc/internal/batch"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// A Grouper commits payments that arrive together in one transaction: one
// fsync and two round trips for up to size payments instead of one fsync
// per payment, which is what lets paysvc go faster than the per-payment
// transaction the database can run.
//
// Grouping never decides a payment's fate on its own. A group commits only
// as a set whose four statements each changed exactly the rows its payments
// must (write.go): the whole group, or the payments a read finds payable,
// once. Every other payment, and every payment of a group that failed before COMMIT, is
// run alone through Store.Pay, the path paysvc takes without grouping, which
// reads the order and says why. So Grouper.Pay returns what Store.Pay would:
// nil (applied by this call), an error wrapping sqldb.ErrCommitUnknown (the
// group's COMMIT failed: don't ack, re-read), or Store.Pay's own answer.
//
// Waiting payments are taken as they are; no payment waits for a group to
// fill. Under a light load every group has one payment. A payment whose
// account or order row was found locked by another transaction never joins
// a group (locked.go).
type Grouper struct {
	s            *Store
	groups       *batch.Collector[*request] // nil: one transaction per payment
	observe      func(n int)
	held         *held
	noSkipLocked atomic.Bool // the server does not know SKIP LOCKED, or does not honour it
	// skipLockedAsked: the server was asked whether it honours SKIP LOCKED.
	skipLockedAsked atomic.Bool
}

type request struct {
	ctx  context.Context
	p    Payment
	done chan error // buffered: the committer never blocks on an answer
}

// errAlone is a committer's answer for a payment its group did not apply.
var errAlone = errors.New("not applied in a group: run alone")

// StartGrouper starts conns committers, each putting up to size waiting
// payments into one transaction (batch.Start's shape, as the Redis
// pipelines and the trace events have). observe, if not nil, is told each
// group's size. Stop ends them. With size 1 no committer starts and each
// payment runs alone through Store.Pay, minding the rows found locked.
func (s *Store) StartGrouper(conns, size int, observe func(n int)) *Grouper {
	g := &Grouper{s: s, observe: observe, held: newHeld(max(size, 1))}
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
// when there are any; it returns what Store.Pay returns, or, for a payment
// of an account found locked while another payment of the same user waits
// for it, an error wrapping ErrAccountLocked and the lock wait timeout.
func (g *Grouper) Pay(ctx context.Context, p Payment) error {
	if g.held.has(p) {
		return g.alone(ctx, p)
	}
	r := &request{ctx: ctx, p: p, done: make(chan error, 1)}
	taken, err := g.groups.Send(ctx, r)
	switch {
	case err != nil:
		return fmt.Errorf("order %s: pay: %w", p.OrderNo, err)
	case !taken:
		return g.alone(ctx, p)
	}
	// A committer that took r always answers, within the group's deadline
	// (the earliest of its payments' deadlines).
	err = <-r.done
	if errors.Is(err, errAlone) {
		return g.alone(ctx, p)
	}
	return err
}

// commit runs one group of waiting payments; one alone is simply paid. The
// payments of rows found locked since they were sent run alone instead.
func (g *Grouper) commit(reqs []*request) {
	reqs = slices.DeleteFunc(reqs, func(r *request) bool {
		if g.held.has(r.p) {
			r.done <- errAlone
			return true
		}
		return false
	})
	if len(reqs) == 0 {
		return
	}
	if g.observe != nil {
		g.observe(len(reqs))
	}
	if len(reqs) == 1 {
		r := reqs[0]
		err := g.s.Pay(r.ctx, r.p)
		g.learnAlone(r.ctx, r.p, err)
		r.done <- err
		return
	}
	g.run(reqs)
}

// run commits one group and answers each of its payments. A deadlock or a
// lost connection retries the group once; after that, and after any other
// error before COMMIT, each payment runs alone. After a lock wait timeout
// the rows found locked are marked first, so that their payments wait
// alone, one per user, and no later group waits for them (locked.go).
func (g *Grouper) run(reqs []*request) {
	// The group's deadline is the earliest of its payments': a payment close
	// to its own deadline cuts the group short, and every payment then runs
	// alone or, if COMMIT was cut, is requeued.
	ctx, cancel := batch.Context(reqs, func(r *request) context.Context { return r.ctx })
	defer cancel()
	ps := make([]Payment, len(reqs))
	for i, r := range reqs {
		ps[i] = r.p
	}
	for attempt := 1; ; attempt++ {
		// Another finding of a locked row that this group needs cuts it
		// short (locked.go): ctx ends, which kills its statement, and it
		// never sends COMMIT.
		gctx, cut := context.WithCancel(ctx)
		f := g.held.enterGroup(ps, cut)
		applied, err := g.s.payGroup(gctx, ps, f.mayCommit)
		g.held.leaveGroup(f)
		cut()
		if f.state.Load() == groupCut {
			break // nothing committed: each runs alone, minding the marks
		}
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
		if sqldb.IsLockWait(err) {
			g.learnGroup(ctx, ps, err)
		}
		break
	}
	for _, r := range reqs {
		r.done <- errAlone
	}
}

// payGroup applies what it can prove of ps as sets (write.go): first the
// whole group, taken in lock order with each order number once; if that set
// is not whole, the payments a plain read finds payable, once. applied[i]
// says whether ps[i] was in the committed set; the others are for the
// single path. On an error wrapping sqldb.ErrCommitUnknown the applied ones
// may or may not be committed; on any other error nothing is. commitOK is
// paySet's.
func (s *Store) payGroup(ctx context.Context, ps []Payment, commitOK func() bool) (applied []bool, err error) {
	applied = make([]bool, len(ps))
	order := make([]int, 0, len(ps)) // indexes into ps, in lock order, each order number once
	for i := range ps {
		order = append(order, i)
	}
	slices.SortStableFunc(order, func(a, b int) int { return lockOrder(ps[a], ps[b]) })
	order = slices.CompactFunc(order, func(a, b int) bool { return ps[a].OrderNo == ps[b].OrderNo })
	set := make([]Payment, len(order))
	for k, i := range order {
		set[k] = ps[i]
	}
	if !sumsFit(set) {
		return applied, nil // each runs alone
	}
	mark := func(set []Payment) {
		k := 0
		for _, i := range order {
			if k < len(set) && ps[i] == set[k] {
				applied[i] = true
				k++
			}
		}
	}
	for try := 1; ; try++ {
		committed, err := s.paySet(ctx, set, commitOK)
		switch {
		case committed:
			mark(set)
			return applied, err // nil, or the COMMIT's unknown outcome
		case err != nil && !sqldb.IsDuplicateKey(err):
			return applied, err
		case try == 2:
			return applied, nil
		}
		// A statement changed other rows than it must, or a flow was booked
		// already: read which payments are payable and try those once.
		can, rerr := s.payable(ctx, set)
		switch {
		case rerr != nil:
			return applied, rerr
		case len(can) == 0:
			return applied, nil
		case len(can) == len(set):
			return applied, err // nothing to take out: each runs alone
		}
		set = can
	}
}
