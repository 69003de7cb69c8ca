package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/scratch"
)

// settled reports whether every expected end state is reached: payable
// orders PAID (or, for a scenario that allows it, a late order parked as
// order_not_found), the poor user's orders and the poison parked, queues
// empty.
func (w *world) settled(ctx context.Context, wl *workload, latePark bool) (bool, error) {
	st, err := w.state(ctx)
	if err != nil {
		return false, err
	}
	unpaid, _ := st.unpaid(wl, latePark)
	if len(unpaid) > 0 || st.poorParked(wl) < len(wl.terminal) || st.poison < len(wl.poison) {
		return false, nil
	}
	depths, err := w.depths()
	if err != nil {
		return false, nil // the broker may be restarting
	}
	for _, d := range depths {
		if d != 0 {
			return false, nil
		}
	}
	return true, nil
}

// endState is what the database says, read with the suite's own queries
// (never with paysvc's reconcile code, whose bug would hide itself).
type endState struct {
	status   map[string]string          // order → status
	flows    map[string][]flow          // order → its PAY_DEDUCT flows
	balance  map[int64]money.Cents      // user → balance
	opening  map[int64]money.Cents      // user → opening balance
	flowSum  map[int64]money.Cents      // user → every flow's amount summed
	parked   map[string]map[string]bool // order → its dead letters' classes
	poison   int                        // bad_message dead letters
	noReason int                        // dead letters without class or text
}

type flow struct {
	User   int64       `db:"user_id"`
	Amount money.Cents `db:"amount"`
	BizNo  string      `db:"biz_no"`
}

func (w *world) state(ctx context.Context) (*endState, error) {
	st := &endState{status: map[string]string{}, flows: map[string][]flow{}, balance: map[int64]money.Cents{},
		opening: map[int64]money.Cents{}, flowSum: map[int64]money.Cents{}, parked: map[string]map[string]bool{}}
	var orders []struct {
		No     string `db:"order_no"`
		Status string `db:"status"`
	}
	if err := w.db.SelectContext(ctx, &orders, "SELECT order_no, status FROM t_order"); err != nil {
		return nil, fmt.Errorf("orders: %w", err)
	}
	for _, o := range orders {
		st.status[o.No] = o.Status
	}
	var flows []flow
	if err := w.db.SelectContext(ctx, &flows, "SELECT user_id, amount, biz_no FROM t_account_flow WHERE type = 'PAY_DEDUCT'"); err != nil {
		return nil, fmt.Errorf("flows: %w", err)
	}
	for _, f := range flows {
		st.flows[f.BizNo] = append(st.flows[f.BizNo], f)
	}
	var sums []struct {
		User int64       `db:"user_id"`
		Sum  money.Cents `db:"total"`
	}
	if err := w.db.SelectContext(ctx, &sums, "SELECT user_id, SUM(amount) AS total FROM t_account_flow GROUP BY user_id"); err != nil {
		return nil, fmt.Errorf("flow sums: %w", err)
	}
	for _, x := range sums {
		st.flowSum[x.User] = x.Sum
	}
	var accounts []struct {
		User    int64       `db:"user_id"`
		Balance money.Cents `db:"balance"`
	}
	if err := w.db.SelectContext(ctx, &accounts, "SELECT user_id, balance FROM t_account"); err != nil {
		return nil, fmt.Errorf("accounts: %w", err)
	}
	for _, a := range accounts {
		st.balance[a.User] = a.Balance
	}
	if err := w.db.SelectContext(ctx, &accounts, "SELECT user_id, balance FROM t_account_opening"); err != nil {
		return nil, fmt.Errorf("openings: %w", err)
	}
	for _, a := range accounts {
		st.opening[a.User] = a.Balance
	}
	var dls []struct {
		OrderNo *string `db:"order_no"`
		Class   string  `db:"error_class"`
		Text    string  `db:"last_error"`
	}
	if err := w.db.SelectContext(ctx, &dls, "SELECT order_no, error_class, last_error FROM t_dead_letter"); err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	for _, d := range dls {
		if d.Class == "" || d.Text == "" {
			st.noReason++
		}
		if d.Class == "bad_message" {
			st.poison++
		}
		if d.OrderNo != nil {
			if st.parked[*d.OrderNo] == nil {
				st.parked[*d.OrderNo] = map[string]bool{}
			}
			st.parked[*d.OrderNo][d.Class] = true
		}
	}
	return st, nil
}

// unpaid lists the payable orders that are not PAID; with latePark, a late
// order parked as order_not_found is accepted and listed apart.
func (st *endState) unpaid(wl *workload, latePark bool) (unpaid, lateParked []string) {
	for _, no := range wl.payable {
		switch _, late := wl.late[no]; {
		case st.status[no] == "PAID":
		case latePark && late && st.parked[no]["order_not_found"]:
			lateParked = append(lateParked, no)
		default:
			unpaid = append(unpaid, no)
		}
	}
	return unpaid, lateParked
}

// poorParked counts the poor user's orders parked for their balance.
func (st *endState) poorParked(wl *workload) int {
	n := 0
	for _, no := range wl.terminal {
		if st.parked[no]["balance_not_enough"] {
			n++
		}
	}
	return n
}

// queues names every queue paysvc consumes or dead-letters through.
func (w *world) queues() []string {
	qs := []string{listener.MainQueue}
	for _, d := range w.delays {
		qs = append(qs, listener.WaitQueue(d))
	}
	return append(qs, listener.TerminalQueue, listener.OverflowQueue)
}

// depths reads every paysvc queue's total as rabbitmqctl list_queues
// counts it (totals): ready, unacked (a copy paysvc's mover holds until
// due, a message in a worker's hands) and any a quorum queue keeps for its
// dead-letter worker. queue.declare counts the ready ones alone, and a
// scenario whose copies wait in the movers' hands would look settled.
func (w *world) depths() (map[string]int, error) {
	counts, err := w.totals()
	if err != nil {
		return nil, err
	}
	depths := map[string]int{}
	for q, n := range counts {
		depths[q] = n.total
	}
	return depths, nil
}

// queueCount is one queue's messages as rabbitmqctl counts them. The total
// counts what a quorum queue holds besides its ready and unacked messages:
// expired or rejected messages waiting for its at-least-once dead-letter
// worker, which queue.declare (ready only) never shows.
type queueCount struct{ total, ready, unacked int }

func (q queueCount) String() string {
	return fmt.Sprintf("%d (ready %d, unacked %d)", q.total, q.ready, q.unacked)
}

// totals reads every paysvc queue's counts with rabbitmqctl list_queues, on
// the first cluster node that answers or on the shared broker. A queue that
// is not listed with numbers (no leader) is an error.
func (w *world) totals() (map[string]queueCount, error) {
	args := []string{"list_queues", "-p", w.vhost, "--no-table-headers",
		"name", "messages", "messages_ready", "messages_unacknowledged"}
	var out string
	var err error
	if c := w.cluster; c != nil {
		err = errors.New("no node runs")
		for _, n := range c.alive() {
			if out, err = c.ctlOutput(n, args...); err == nil {
				break
			}
		}
	} else {
		out, err = scratch.RabbitmqCtlOutput(args...)
	}
	if err != nil {
		return nil, err
	}
	return parseCounts(out, w.queues())
}

// parseCounts reads list_queues' "name messages messages_ready
// messages_unacknowledged" lines for the queues named.
func parseCounts(out string, queues []string) (map[string]queueCount, error) {
	listed := map[string]queueCount{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			continue
		}
		var n [3]int
		ok := true
		for i := range n {
			var err error
			n[i], err = strconv.Atoi(f[i+1])
			ok = ok && err == nil
		}
		if ok {
			listed[f[0]] = queueCount{total: n[0], ready: n[1], unacked: n[2]}
		}
	}
	counts := map[string]queueCount{}
	for _, q := range queues {
		n, ok := listed[q]
		if !ok {
			return nil, fmt.Errorf("%s is not listed with its counts", q)
		}
		counts[q] = n
	}
	return counts, nil
}

// drained reports whether every queue holds nothing at all, and otherwise
// what each holds.
func drained(counts map[string]queueCount) (bool, []string) {
	var left []string
	for q, n := range counts {
		if n != (queueCount{}) {
			left = append(left, q+" "+n.String())
		}
	}
	slices.Sort(left)
	return len(left) == 0, left
}

// waitDrained reads the totals until every queue holds nothing or within
// passes (a quorum queue's counts trail by a few seconds), and returns the
// last reading.
func (w *world) waitDrained(ctx context.Context, within time.Duration) (map[string]queueCount, error) {
	deadline := time.Now().Add(within)
	for {
		counts, err := w.totals()
		if ok, _ := drained(counts); err == nil && ok || time.Now().After(deadline) || !at(ctx, time.Second) {
			return counts, err
		}
	}
}

// invariant is one checked property.
type invariant struct {
	name   string
	ok     bool
	detail string
}

// check verifies the money invariants after the instances have stopped,
// from the suite's own reading of the database and its own knowledge of
// what was published.
func (w *world) check(ctx context.Context, wl *workload, latePark bool) []invariant {
	var out []invariant
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, invariant{name: name, ok: ok, detail: fmt.Sprintf(format, args...)})
	}
	st, err := w.state(ctx)
	if err != nil {
		for _, name := range []string{"one-flow", "balances", "accounted"} {
			add(name, false, "reading the end state: %v", err)
		}
	} else {
		// 1: PAID ⇔ exactly one PAY_DEDUCT flow, with the order's user and
		// amount as published; no flow for an order that is not PAID.
		var bad []string
		for no, o := range wl.orders {
			fs := st.flows[no]
			switch paid := st.status[no] == "PAID"; {
			case paid && len(fs) != 1:
				bad = append(bad, fmt.Sprintf("%s PAID with %d flows", no, len(fs)))
			case !paid && len(fs) != 0:
				bad = append(bad, fmt.Sprintf("%s %s with %d flows", no, cmp.Or(st.status[no], "missing"), len(fs)))
			case paid && (fs[0].User != o.user || fs[0].Amount != -o.amount):
				bad = append(bad, fmt.Sprintf("%s flow user %d amount %s, order user %d amount %s", no, fs[0].User, fs[0].Amount, o.user, o.amount))
			}
		}
		for no := range st.flows {
			if _, ok := wl.orders[no]; !ok {
				bad = append(bad, "flow for an order never published: "+no)
			}
		}
		add("one-flow", len(bad) == 0, "%d problems %v", len(bad), first(bad, 5))

		// 2: every balance = opening − the amounts of its paid orders (the
		// suite's own sum), = opening + its flows (the database's), ≥ 0.
		paidSum := map[int64]money.Cents{}
		for no, o := range wl.orders {
			if st.status[no] == "PAID" {
				paidSum[o.user] += o.amount
			}
		}
		var wrong []string
		for user, open := range st.opening {
			bal := st.balance[user]
			if bal != open-paidSum[user] || bal != open+st.flowSum[user] || bal < 0 {
				wrong = append(wrong, fmt.Sprintf("user %d: balance %s, opening %s, paid %s, flows %s",
					user, bal, open, paidSum[user], st.flowSum[user]))
			}
		}
		add("balances", len(wrong) == 0, "%d wrong %v", len(wrong), first(wrong, 5))

		// 3: every payable payment PAID (a late order parked as
		// order_not_found only where the scenario allows it), the poor
		// user's parked for their balance and never paid, every poison
		// message parked, every dead letter with a reason; queues empty
		// with the instances stopped (so nothing was left unacked).
		unpaid, lateParked := st.unpaid(wl, latePark)
		var poorPaid []string
		for _, no := range wl.terminal {
			if st.status[no] == "PAID" {
				poorPaid = append(poorPaid, no)
			}
		}
		depths, derr := w.depths()
		left := 0
		for _, d := range depths {
			left += d
		}
		add("accounted", derr == nil && len(unpaid) == 0 && len(poorPaid) == 0 && st.poorParked(wl) == len(wl.terminal) &&
			st.poison == len(wl.poison) && st.noReason == 0 && left == 0,
			"payable not PAID %v (parked as %v), late parked as allowed %v, poor paid %v, poor parked %d/%d, poison parked %d/%d, no reason %d, queues %v %v",
			first(unpaid, 5), st.classesOf(first(unpaid, 5)), first(lateParked, 5), poorPaid, st.poorParked(wl), len(wl.terminal),
			st.poison, len(wl.poison), st.noReason, depths, derr)
	}

	// 4: a Redis "done" key implies the payment is applied.
	var doneUnpaid []string
	var scanErr error
	iter := w.rdb.Scan(ctx, 0, w.prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		if strings.HasSuffix(key, "~retries") {
			continue // the retry ledger, a sorted set beside the keys
		}
		v, err := w.rdb.Get(ctx, key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			scanErr = err
			break
		}
		if v != "done" {
			continue
		}
		var status string
		if err := w.db.GetContext(ctx, &status, "SELECT status FROM t_order WHERE order_no = ?", strings.TrimPrefix(key, w.prefix)); err != nil && !errors.Is(err, sql.ErrNoRows) {
			scanErr = err
			break
		}
		if status != "PAID" && status != "SETTLED" {
			doneUnpaid = append(doneUnpaid, key)
		}
	}
	scanErr = cmp.Or(scanErr, iter.Err())
	add("redis-done", scanErr == nil && len(doneUnpaid) == 0, "done keys on unpaid orders: %v %v", first(doneUnpaid, 5), scanErr)

	// 5: with the instances stopped, every queue holds nothing at all: its
	// total, not only what queue.declare reports, so that a message a
	// quorum queue holds for its dead-letter worker shows.
	counts, err := w.waitDrained(ctx, 10*time.Second)
	ok, left := drained(counts)
	add("drained", err == nil && ok, "left in the queues (total, of it ready and unacked): %v %v", left, err)
	return out
}

// classesOf lists the dead-letter classes of each order, for a report.
func (st *endState) classesOf(orders []string) []string {
	var out []string
	for _, no := range orders {
		var cs []string
		for c := range st.parked[no] {
			cs = append(cs, c)
		}
		out = append(out, no+":"+strings.Join(cs, "+"))
	}
	return out
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("... %d more", len(s)-n))
	}
	return s
}

// waitSettled polls until settled, and then every queue's total is 0
// (rabbitmqctl, read only then: it costs a second of CPU), or the deadline.
func (w *world) waitSettled(ctx context.Context, wl *workload, latePark bool, within time.Duration) bool {
	deadline := time.Now().Add(within)
	streak := 0
	for time.Now().Before(deadline) {
		ok, _ := w.settled(ctx, wl, latePark)
		if ok {
			streak++
			if streak >= 3 {
				counts, err := w.totals()
				if ok, _ := drained(counts); err == nil && ok {
					return true
				}
				streak = 0
				if !at(ctx, 2*time.Second) {
					return false
				}
			}
		} else {
			streak = 0
		}
		if !at(ctx, 300*time.Millisecond) {
			return false
		}
	}
	return false
}
