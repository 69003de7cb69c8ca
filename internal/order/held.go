package order

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The rows found locked and the groups in the database (locked.go says
// what they are for).

const (
	heldFor = 5 * time.Minute // a wait queue's longest default delay: the retries still find the mark
	maxHeld = 1000            // marked users, and as many marked orders, at most
)

// held is the rows found locked.
type held struct {
	n      atomic.Int32 // marks; 0 on the normal path, which then takes no lock
	mu     sync.Mutex
	users  map[int64]*userHold
	orders map[string]time.Time // until
	// maxWaiting bounds the payments of one user whose mark is only
	// suspected that wait for its turn: no more workers than a group holds.
	maxWaiting int
	groups     map[*inflight]bool // the groups in the database now
}

type userHold struct {
	until time.Time
	// lockErr is the lock wait timeout that found the row locked. confirmed:
	// a payment of the user run alone waited it out (not only a group).
	lockErr   error
	confirmed bool
	turn      *turn // the user's payment in the database; nil: none
	waiting   int   // payments waiting for turn's answer
}

// turn is one payment of a marked user in the database. locked, set before
// done is closed, is the lock wait timeout it ended in when its account row
// is still locked.
type turn struct {
	done   chan struct{}
	locked error
}

func newHeld(maxWaiting int) *held {
	return &held{users: map[int64]*userHold{}, orders: map[string]time.Time{}, maxWaiting: maxWaiting,
		groups: map[*inflight]bool{}}
}

// inflight is a group in the database. A row found locked that it needs
// cuts it short: it would wait for the row as long, holding the rows it
// has taken, which other payments then find locked.
type inflight struct {
	ps    []Payment
	state atomic.Int32 // groupRunning, groupCommitting, groupCut
	cut   context.CancelFunc
}

const (
	groupRunning = iota
	groupCommitting
	groupCut // its statement killed (cut ends its context), no COMMIT sent
)

// mayCommit is asked just before the group's COMMIT: once committing, the
// group is not cut; once cut, it does not commit.
func (f *inflight) mayCommit() bool { return f.state.CompareAndSwap(groupRunning, groupCommitting) }

// enterGroup notes that ps is in the database as a group, to be cut short
// with cut, until leaveGroup.
func (h *held) enterGroup(ps []Payment, cut context.CancelFunc) *inflight {
	f := &inflight{ps: ps, cut: cut}
	h.mu.Lock()
	h.groups[f] = true
	h.mu.Unlock()
	return f
}

func (h *held) leaveGroup(f *inflight) {
	h.mu.Lock()
	delete(h.groups, f)
	h.mu.Unlock()
}

// inGroup reports whether a group in the database holds a payment that
// matches. h.mu is held.
func (h *held) inGroup(match func(Payment) bool) bool {
	for f := range h.groups {
		if slices.ContainsFunc(f.ps, match) {
			return true
		}
	}
	return false
}

// cutGroups cuts short the groups in the database that hold a payment
// that matches and have not begun to commit. h.mu is held.
func (h *held) cutGroups(match func(Payment) bool) {
	for f := range h.groups {
		if slices.ContainsFunc(f.ps, match) && f.state.CompareAndSwap(groupRunning, groupCut) {
			f.cut()
		}
	}
}

// has reports whether p's account or order row is marked.
func (h *held) has(p Payment) bool {
	if h.n.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.user(p.UserID) != nil || h.order(p.OrderNo)
}

// user returns the user's live mark, dropping an expired one. h.mu is held.
func (h *held) user(id int64) *userHold {
	u := h.users[id]
	if u != nil && u.turn == nil && time.Now().After(u.until) {
		delete(h.users, id)
		h.n.Add(-1)
		return nil
	}
	return u
}

// order says whether the order is marked, dropping an expired mark. h.mu
// is held.
func (h *held) order(no string) bool {
	until, ok := h.orders[no]
	if ok && time.Now().After(until) {
		delete(h.orders, no)
		h.n.Add(-1)
		return false
	}
	return ok
}

// room says whether one more mark fits in a map of n, after dropping the
// expired ones when it is full. h.mu is held.
func (h *held) room(n func() int) bool {
	if n() < maxHeld {
		return true
	}
	for id := range h.users {
		h.user(id)
	}
	for no := range h.orders {
		h.order(no)
	}
	return n() < maxHeld
}

// markUser marks the user's account row found locked by lockErr. alone
// says a payment run alone waited it out: that confirms the mark, unless a
// group of this process that holds a payment of the user is in the
// database (it may be the one holding the row). It reports whether the
// row is newly confirmed.
func (h *held) markUser(id int64, lockErr error, alone bool) (newly bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ofUser := func(p Payment) bool { return p.UserID == id }
	confirmed := alone && !h.inGroup(ofUser)
	h.cutGroups(ofUser)
	u := h.user(id)
	if u == nil {
		if !h.room(func() int { return len(h.users) }) {
			return false
		}
		u = &userHold{}
		h.users[id] = u
		h.n.Add(1)
	}
	newly = confirmed && !u.confirmed
	u.until, u.lockErr, u.confirmed = time.Now().Add(heldFor), lockErr, u.confirmed || confirmed
	return newly
}

// markOrder marks the order's row found locked; it reports whether the row
// was not marked before.
func (h *held) markOrder(no string) (newly bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cutGroups(func(p Payment) bool { return p.OrderNo == no })
	if !h.order(no) {
		if !h.room(func() int { return len(h.orders) }) {
			return false
		}
		h.n.Add(1)
		newly = true
	}
	h.orders[no] = time.Now().Add(heldFor)
	return newly
}

// clearUser and clearOrder unmark a row found not locked.
func (h *held) clearUser(id int64) {
	if h.n.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if u, ok := h.users[id]; ok {
		if u.turn != nil {
			// The turn's end drops it: its waiters are told then.
			u.until = time.Time{}
			return
		}
		delete(h.users, id)
		h.n.Add(-1)
	}
}

func (h *held) clearOrder(no string) {
	if h.n.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.orders[no]; ok {
		delete(h.orders, no)
		h.n.Add(-1)
	}
}

// What a payment run alone does now (enter).
const (
	runFree  = iota // nothing marked: run alone
	runHeld         // its order marked, its user not: run alone
	takeTurn        // run alone as the user's turn, then end it
	waitTurn        // wait for the turn's answer
	turnAway        // answer ErrAccountLocked at once
)

// enter says what p does now, with the user's turn to take or wait for,
// or the lock wait timeout to answer with.
func (h *held) enter(p Payment) (what int, t *turn, lockErr error) {
	if h.n.Load() == 0 {
		return runFree, nil, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	u := h.user(p.UserID)
	switch {
	case u == nil && h.order(p.OrderNo):
		return runHeld, nil, nil
	case u == nil:
		return runFree, nil, nil
	case u.turn == nil:
		u.turn = &turn{done: make(chan struct{})}
		return takeTurn, u.turn, nil
	case u.confirmed || u.waiting >= h.maxWaiting:
		return turnAway, nil, u.lockErr
	}
	u.waiting++
	return waitTurn, u.turn, nil
}

// left says a payment that waited for t's answer no longer waits.
func (h *held) left(id int64, t *turn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if u := h.users[id]; u != nil && u.turn == t {
		u.waiting--
	}
}

// end ends the user's turn t: locked is the lock wait timeout it ended in
// while the row is still locked, or nil. Its waiters are then turned away
// (locked) or go on.
func (h *held) end(id int64, t *turn, locked error) {
	h.mu.Lock()
	if u := h.users[id]; u != nil && u.turn == t {
		u.turn, u.waiting = nil, 0
		h.user(id) // drop it if cleared meanwhile
	}
	h.mu.Unlock()
	t.locked = locked
	close(t.done)
}
