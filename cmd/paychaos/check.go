package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/reconcile"
)

// settled reports whether every expected end state is reached: payable
// orders PAID, the poor user's orders and the poison parked, queues empty.
func (w *world) settled(ctx context.Context, wl *workload) (bool, error) {
	var paid, parkedPoor, parkedPoison int
	// Payable orders end PAID, or parked with their reason (an order still
	// missing after every retry, a frozen consumer holding its locks).
	if err := w.db.GetContext(ctx, &paid, `SELECT COUNT(*) FROM t_order o WHERE o.user_id <> ? AND (o.status = 'PAID'
		OR EXISTS (SELECT 1 FROM t_dead_letter d WHERE d.order_no = o.order_no AND d.last_error <> ''))`, poorUser); err != nil {
		return false, err
	}
	if err := w.db.GetContext(ctx, &parkedPoor, "SELECT COUNT(*) FROM t_dead_letter WHERE user_id = ? AND status = 'NEW'", poorUser); err != nil {
		return false, err
	}
	if err := w.db.GetContext(ctx, &parkedPoison, "SELECT COUNT(*) FROM t_dead_letter WHERE error_class = 'bad_message'"); err != nil {
		return false, err
	}
	if paid < len(wl.payable) || parkedPoor < len(wl.terminal) || parkedPoison < len(wl.poison) {
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

func (w *world) queues() []string {
	qs := []string{listener.MainQueue, listener.TerminalQueue}
	for _, d := range w.delays {
		qs = append(qs, listener.WaitQueue(d))
	}
	return qs
}

// depths reads the ready messages of every paysvc queue.
func (w *world) depths() (map[string]int, error) {
	conn, err := amqp.Dial(w.amqpURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	out := map[string]int{}
	for _, q := range w.queues() {
		ch, err := conn.Channel()
		if err != nil {
			return nil, err
		}
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		ch.Close()
		if err != nil {
			return nil, err
		}
		out[q] = st.Messages
	}
	return out, nil
}

// invariant is one checked property.
type invariant struct {
	name   string
	ok     bool
	detail string
}

// check verifies the money invariants after the instances have stopped.
func (w *world) check(ctx context.Context, wl *workload) []invariant {
	var out []invariant
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, invariant{name: name, ok: ok, detail: fmt.Sprintf(format, args...)})
	}

	// 1 and 2: one flow per paid order with its amount and user; balances =
	// opening + flows. Reconcile checks exactly these.
	rep, err := reconcile.Run(ctx, w.db, reconcile.Options{})
	flowProblems, balanceProblems := 0, 0
	var details []string
	for _, p := range rep.Problems {
		if p.Kind == reconcile.BalanceMismatch {
			balanceProblems++
		} else {
			flowProblems++
		}
		details = append(details, p.Kind+" "+p.BizNo+": "+p.Detail)
	}
	var negative int
	w.db.GetContext(ctx, &negative, "SELECT COUNT(*) FROM t_account WHERE balance < 0")
	add("one-flow", err == nil && flowProblems == 0, "%d flow problems %v %v", flowProblems, details, err)
	add("balances", err == nil && balanceProblems == 0 && negative == 0, "%d balance problems, %d negative", balanceProblems, negative)

	// 3: every published payment applied, recognised, or parked with a reason;
	// queues empty, nothing unacked (the instances are stopped, so anything
	// unacked is back in the queues and counted).
	paidSet := map[string]bool{}
	var paid []string
	err = w.db.SelectContext(ctx, &paid, "SELECT order_no FROM t_order WHERE status = 'PAID'")
	for _, no := range paid {
		paidSet[no] = true
	}
	// A payable order that is not paid must at least be parked with its
	// reason (the invariant: applied, a duplicate, or terminal with a
	// reason); one that is neither is lost.
	var parked []string
	w.db.SelectContext(ctx, &parked, "SELECT order_no FROM t_dead_letter WHERE order_no IS NOT NULL AND last_error <> ''")
	parkedSet := map[string]bool{}
	for _, no := range parked {
		parkedSet[no] = true
	}
	var unpaid, parkedPayable []string
	for _, no := range wl.payable {
		switch {
		case paidSet[no]:
		case parkedSet[no]:
			parkedPayable = append(parkedPayable, no)
		default:
			unpaid = append(unpaid, no)
		}
	}
	var poorParked, poison, noReason int
	w.db.GetContext(ctx, &poorParked, "SELECT COUNT(DISTINCT order_no) FROM t_dead_letter WHERE user_id = ? AND error_class = 'balance_not_enough'", poorUser)
	w.db.GetContext(ctx, &poison, "SELECT COUNT(*) FROM t_dead_letter WHERE error_class = 'bad_message'")
	w.db.GetContext(ctx, &noReason, "SELECT COUNT(*) FROM t_dead_letter WHERE last_error = '' OR error_class = ''")
	depths, derr := w.depths()
	left := 0
	for _, d := range depths {
		left += d
	}
	add("accounted", err == nil && derr == nil && len(unpaid) == 0 && poorParked == len(wl.terminal) &&
		poison == len(wl.poison) && noReason == 0 && left == 0,
		"lost (neither paid nor parked) %v, payable but parked %v, poor parked %d/%d, poison parked %d/%d, no reason %d, queues %v %v",
		first(unpaid, 5), first(parkedPayable, 5), poorParked, len(wl.terminal), poison, len(wl.poison), noReason, depths, derr)

	// 4: a Redis "done" key implies the payment is applied.
	var doneUnpaid []string
	iter := w.rdb.Scan(ctx, 0, w.prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		if v, _ := w.rdb.Get(ctx, key).Result(); v != "done" {
			continue
		}
		var st string
		w.db.GetContext(ctx, &st, "SELECT status FROM t_order WHERE order_no = ?", strings.TrimPrefix(key, w.prefix))
		if st != "PAID" && st != "SETTLED" {
			doneUnpaid = append(doneUnpaid, key)
		}
	}
	add("redis-done", iter.Err() == nil && len(doneUnpaid) == 0, "done keys on unpaid orders: %v %v", first(doneUnpaid, 5), iter.Err())
	return out
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("... %d more", len(s)-n))
	}
	return s
}

// waitSettled polls until settled or the deadline.
func (w *world) waitSettled(ctx context.Context, wl *workload, within time.Duration) bool {
	deadline := time.Now().Add(within)
	streak := 0
	for time.Now().Before(deadline) {
		ok, _ := w.settled(ctx, wl)
		if ok {
			streak++
			if streak >= 3 {
				return true
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
