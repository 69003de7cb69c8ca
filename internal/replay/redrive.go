package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/order"
)

// ClassLostCommit is the class of the dead letter that records a lost
// payment: one paysvc applied and acked, whose commit the database lost
// (a failover to a replica that had not received it, a restore).
const ClassLostCommit = "lost_commit"

// RedriveGrace: a lost payment re-driven this recently (its dead letter
// REPLAYED) is not re-driven again, its copy may still wait in the main
// queue; past it, a payment still unpaid is re-driven again.
const RedriveGrace = 10 * time.Minute

// lostText is the reason a lost payment's dead letter gives.
const lostText = "paysvc applied this payment and the database does not have it (its order is INIT, without flow or " +
	"notice): a commit lost in a database failover or restore, found by paysvc reconcile"

// Redrive sends lost payments through the main queue again with a replay's
// audit trail, each no sooner than Every after the last: it parks each as
// a dead letter of class lost_commit (the body rebuilt from the order row:
// the payment matched only its own order number, user and amount), then
// replays it as `paysvc dlq replay` does (marked REPLAYED with operator and
// reason, then published with confirms to q.pay.success, where every guard
// applies again: a payment paid meanwhile is a duplicate). Its history and
// the order's trace say so.
//
// A payment that has a dead letter already is left to it when that row
// says more than the re-drive would: a NEW row of another class (the
// payment failed since, for that reason), a DISCARDED one (someone decided
// it is not to be paid: replay it by --id if it is), or one re-driven
// within RedriveGrace. A NEW lost_commit row (a re-drive cut short after
// its parking) is replayed.
func (r *Replayer) Redrive(ctx context.Context, lost []order.Payment, operator, reason string) ([]Result, error) {
	if err := deadletter.CheckAudit(operator, reason); err != nil {
		return nil, fmt.Errorf("redrive: %w", err)
	}
	out := make([]Result, len(lost))
	var rows []deadletter.DeadLetter
	var at []int // rows[i] is lost[at[i]]
	for i, p := range lost {
		out[i] = Result{OrderNo: p.OrderNo}
		d, skip, err := r.lostRow(ctx, p)
		switch {
		case err != nil:
			out[i].Outcome, out[i].Err = "failed: "+err.Error(), err
		case skip != "":
			out[i].ID, out[i].Outcome = d.ID, "skipped: "+skip
		default:
			rows, at = append(rows, d), append(at, i)
		}
	}
	results, err := r.Replay(ctx, rows, operator, reason, false)
	for j, res := range results {
		out[at[j]] = res
	}
	for j := len(results); j < len(rows); j++ { // not reached: the context ended
		out[at[j]].ID, out[at[j]].Outcome = rows[j].ID, "not re-driven: "+fmt.Sprint(err)
	}
	return out, err
}

// lostRow returns the dead letter to replay for p, parking it first when
// none stands for it, or why p is skipped.
func (r *Replayer) lostRow(ctx context.Context, p order.Payment) (d deadletter.DeadLetter, skip string, err error) {
	rows, err := r.Store.ByOrder(ctx, p.OrderNo)
	if err != nil && !errors.Is(err, deadletter.ErrNotFound) {
		return d, "", err
	}
	for _, row := range rows {
		if row.UserID == nil || row.Amount == nil || *row.UserID != p.UserID || *row.Amount != p.Amount {
			continue // another message for the order: its own row
		}
		switch d = row; {
		case d.Status == deadletter.New && d.ErrorClass == ClassLostCommit:
			return d, "", nil
		case d.Status == deadletter.New:
			return d, fmt.Sprintf("dead letter %d of the payment is NEW (%s): see `paysvc dlq show --id %d`", d.ID, d.ErrorClass, d.ID), nil
		case d.Status == deadletter.Discarded:
			return d, fmt.Sprintf("dead letter %d of the payment was DISCARDED by %s (%s): replay it with `paysvc dlq replay --id %d` if it is due",
				d.ID, d.UpdatedBy, d.Reason, d.ID), nil
		}
		_, events, err := r.Store.Get(ctx, d.ID)
		if err != nil {
			return d, "", err
		}
		for _, e := range events {
			if e.Event == deadletter.EventReplayed && time.Since(e.At) < RedriveGrace {
				return d, fmt.Sprintf("dead letter %d of the payment was replayed by %s at %s: its copy may still be in the queue (again after %s)",
					d.ID, e.Operator, e.At.UTC().Format(time.RFC3339), RedriveGrace), nil
			}
		}
	}
	body, _ := json.Marshal(struct { // strings and an int: cannot fail
		OrderNo string `json:"orderNo"`
		UserID  int64  `json:"userId"`
		Amount  string `json:"amount"`
	}{p.OrderNo, p.UserID, p.Amount.String()})
	now := time.Now()
	id, _, err := r.Store.Park(ctx, deadletter.Parked{OrderNo: p.OrderNo, UserID: &p.UserID, Amount: &p.Amount, Body: body,
		Headers: "{}", ErrorClass: ClassLostCommit, LastError: lostText, FirstFailedAt: now, LastFailedAt: now})
	if err != nil {
		return d, "", err
	}
	d, _, err = r.Store.Get(ctx, id)
	return d, "", err
}
