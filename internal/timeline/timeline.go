package timeline

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/money"
)

// Entry is one line of an order's timeline.
type Entry struct {
	At     time.Time
	Source string // order, flow, outbox, event, dead_letter, log
	What   string
}

// FromDB gathers what the database knows about an order: the order row,
// its flows and reversals, its notice, recorded outcomes, and its dead letter
// with history; sorted by time (entries at the same time in that order).
func FromDB(ctx context.Context, db *sqlx.DB, orderNo string) ([]Entry, error) {
	var out []Entry
	for _, part := range []func(context.Context, *sqlx.DB, string) ([]Entry, error){
		orderEntries, flowEntries, noticeEntries, eventEntries, deadLetterEntries,
	} {
		es, err := part(ctx, db, orderNo)
		if err != nil {
			return nil, err
		}
		out = append(out, es...)
	}
	sortEntries(out)
	return out, nil
}

// entries collects one source's part of a timeline.
type entries []Entry

func (es *entries) add(at time.Time, src, format string, args ...any) {
	*es = append(*es, Entry{At: at, Source: src, What: fmt.Sprintf(format, args...)})
}

// orderEntries: the order's creation, its payment, and a status other than
// INIT or PAID.
func orderEntries(ctx context.Context, db *sqlx.DB, orderNo string) ([]Entry, error) {
	var orders []struct {
		UserID  int64       `db:"user_id"`
		Amount  money.Cents `db:"amount"`
		Status  string      `db:"status"`
		PayTime *time.Time  `db:"pay_time"`
		Created time.Time   `db:"create_time"`
		Updated time.Time   `db:"update_time"`
	}
	if err := db.SelectContext(ctx, &orders, `SELECT user_id, amount, status, pay_time, create_time, update_time
		FROM t_order WHERE order_no = ?`, orderNo); err != nil {
		return nil, err
	}
	var out entries
	for _, o := range orders {
		out.add(o.Created, "order", "created: user %d, amount %s", o.UserID, o.Amount)
		if o.PayTime != nil {
			out.add(*o.PayTime, "order", "INIT → PAID")
		}
		if o.Status != "PAID" && o.Status != "INIT" {
			out.add(o.Updated, "order", "status now %s", o.Status)
		}
	}
	return out, nil
}

// flowEntries: the account flows of the payment and of its reversal.
func flowEntries(ctx context.Context, db *sqlx.DB, orderNo string) ([]Entry, error) {
	var flows []struct {
		ID      int64       `db:"id"`
		UserID  int64       `db:"user_id"`
		Amount  money.Cents `db:"amount"`
		BizNo   string      `db:"biz_no"`
		Type    string      `db:"type"`
		Created time.Time   `db:"create_time"`
	}
	if err := db.SelectContext(ctx, &flows, `SELECT id, user_id, amount, biz_no, type, create_time FROM t_account_flow
		WHERE biz_no IN (?, ?) ORDER BY id`, orderNo, orderNo+"-REVERSE"); err != nil {
		return nil, err
	}
	var out entries
	for _, f := range flows {
		out.add(f.Created, "flow", "%s %s user %d (flow %d, biz_no %s)", f.Type, f.Amount, f.UserID, f.ID, f.BizNo)
	}
	return out, nil
}

// noticeEntries: the payment notice, queued and then published or still
// pending. A notice not sent yet holds a placeholder sent_time, read only
// for a SENT one.
func noticeEntries(ctx context.Context, db *sqlx.DB, orderNo string) ([]Entry, error) {
	var notices []struct {
		Status   string     `db:"status"`
		Attempts int        `db:"attempts"`
		LastErr  string     `db:"last_error"`
		Created  time.Time  `db:"create_time"`
		Sent     *time.Time `db:"sent_time"`
	}
	if err := db.SelectContext(ctx, &notices, `SELECT status, attempts, last_error, create_time,
		CASE WHEN status = 'SENT' THEN sent_time END AS sent_time
		FROM t_outbox WHERE biz_no = ?`, orderNo); err != nil {
		return nil, err
	}
	var out entries
	for _, n := range notices {
		out.add(n.Created, "outbox", "payment notice queued")
		if n.Sent != nil {
			out.add(*n.Sent, "outbox", "payment notice published (attempt %d)", n.Attempts)
		} else if n.LastErr != "" {
			out.add(n.Created, "outbox", "payment notice pending after %d attempts: %s", n.Attempts, n.LastErr)
		}
	}
	return out, nil
}

// eventEntries: the outcomes recorded for the order (Record).
func eventEntries(ctx context.Context, db *sqlx.DB, orderNo string) ([]Entry, error) {
	var events []struct {
		Event    string    `db:"event"`
		Class    string    `db:"error_class"`
		Attempt  int       `db:"attempt"`
		Detail   string    `db:"detail"`
		Instance string    `db:"instance"`
		Created  time.Time `db:"create_time"`
	}
	if err := db.SelectContext(ctx, &events, `SELECT event, error_class, attempt, detail, instance, create_time
		FROM t_payment_event WHERE order_no = ? ORDER BY id`, orderNo); err != nil {
		return nil, err
	}
	var out entries
	for _, e := range events {
		what := fmt.Sprintf("%s attempt %d", e.Event, e.Attempt)
		if e.Class != "" {
			what += " (" + e.Class + ")"
		}
		if e.Detail != "" {
			what += ": " + e.Detail
		}
		out.add(e.Created, "event", "%s [%s]", what, e.Instance)
	}
	return out, nil
}

// deadLetterEntries: the history of each dead letter of the order.
func deadLetterEntries(ctx context.Context, db *sqlx.DB, orderNo string) ([]Entry, error) {
	var dls []struct {
		ID     int64  `db:"id"`
		Status string `db:"status"`
	}
	if err := db.SelectContext(ctx, &dls, "SELECT id, status FROM t_dead_letter WHERE order_no = ?", orderNo); err != nil {
		return nil, err
	}
	var out entries
	for _, d := range dls {
		var hist []struct {
			Event    string    `db:"event"`
			Operator string    `db:"operator"`
			Reason   string    `db:"reason"`
			Result   string    `db:"result"`
			Class    string    `db:"error_class"`
			Created  time.Time `db:"create_time"`
		}
		if err := db.SelectContext(ctx, &hist, `SELECT event, operator, reason, result, error_class, create_time
			FROM t_dead_letter_event WHERE dead_letter_id = ? ORDER BY id`, d.ID); err != nil {
			return nil, err
		}
		for _, h := range hist {
			what := fmt.Sprintf("dead letter %d %s by %s", d.ID, h.Event, h.Operator)
			if h.Class != "" {
				what += " (" + h.Class + ")"
			}
			if h.Reason != "" {
				what += ", reason: " + h.Reason
			}
			if h.Result != "" {
				what += ": " + h.Result
			}
			out.add(h.Created, "dead_letter", "%s", what)
		}
	}
	return out, nil
}

// FromLog reads paysvc's JSON log lines for the order: claims, outcomes, key
// releases and degrade decisions.
func FromLog(r io.Reader, orderNo string) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	needle := `"order_no":"` + orderNo + `"`
	for sc.Scan() {
		if !strings.Contains(sc.Text(), needle) {
			continue
		}
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		at, _ := time.Parse("2006-01-02T15:04:05.000Z0700", fmt.Sprint(line["ts"]))
		what := fmt.Sprint(line["msg"])
		for _, k := range []string{"result", "attempt", "error_class", "idem_key", "redelivered", "degraded", "deleted", "error"} {
			if v, ok := line[k]; ok && v != "" {
				what += fmt.Sprintf(" %s=%v", k, v)
			}
		}
		out = append(out, Entry{At: at, Source: "log", What: what})
	}
	return out, sc.Err()
}

func sortEntries(es []Entry) {
	sort.SliceStable(es, func(i, j int) bool { return es[i].At.Before(es[j].At) })
}

// Merge combines timelines in time order.
func Merge(parts ...[]Entry) []Entry {
	var all []Entry
	for _, p := range parts {
		all = append(all, p...)
	}
	sortEntries(all)
	return all
}
