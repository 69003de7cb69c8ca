package reconcile

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/outbox"
)

// LostPayment is a payment paysvc applied (its Redis guard key says done,
// or its payment-success notice went out) whose order the database has
// INIT or not at all: a commit the database lost, in a failover to a
// replica that had not received it, or a restore from a backup. Every
// money row of such a payment is gone with it (flow, balance, notice), so
// the other checks see nothing.
const LostPayment = "lost_payment"

// Evidence that paysvc applied a payment.
const (
	EvidenceRedis  = "redis"  // the order's guard key says done
	EvidenceNotice = "notice" // its payment-success notice was published
)

// Lost is a payment paysvc applied that the database does not have.
type Lost struct {
	OrderNo string
	// UserID and Amount are the order row's (the message that paid it
	// carried them: the payment matches only its own user and amount), or
	// the notice's when the order is missing.
	UserID int64
	Amount money.Cents
	// Status is the order's now: INIT, or "" when there is no order row.
	Status string
	// Differs: the notice names another user or amount than the order row.
	Differs  string
	Evidence []string
}

// Redrivable reports whether a message rebuilt from the order row pays it
// again: the order is there, INIT, and nothing contradicts its user and
// amount.
func (l Lost) Redrivable() bool { return l.Status == "INIT" && l.Differs == "" }

func (l Lost) problem() Problem {
	var why string
	switch {
	case l.Status == "":
		why = "the order is missing: nothing to re-drive from the database (fix by hand: recreate the order, or ask the producer to send the payment again)"
	case l.Differs != "":
		why = "the order is INIT; " + l.Differs + ": fix by hand"
	default:
		why = "the order is INIT, without flow or notice: a commit the database lost; --fix re-drives it"
	}
	payment := fmt.Sprintf("user %d, amount %s", l.UserID, l.Amount)
	if l.UserID == 0 {
		payment = "user and amount unknown" // a done key, and no order row to read them from
	}
	return Problem{Kind: LostPayment, BizNo: l.OrderNo, UserID: l.UserID, Amount: l.Amount,
		Detail: fmt.Sprintf("applied by paysvc (%s), %s; %s", evidenceText(l.Evidence), payment, why)}
}

func evidenceText(ev []string) string {
	var out []string
	for _, e := range ev {
		switch e {
		case EvidenceRedis:
			out = append(out, "Redis key done")
		case EvidenceNotice:
			out = append(out, "notice published")
		}
	}
	return strings.Join(out, ", ")
}

// DoneKeys lists the orders whose Redis guard key says done (the payments
// paysvc committed within idempotent.ttl), a batch at a time; *idem.Guard
// is one. rate bounds the keys read per second (0: none).
type DoneKeys interface {
	ScanDone(ctx context.Context, rate int, fn func(orderNos []string) error) error
}

// recheckAfter: a candidate is read again this long after it was found and
// is lost only if still unpaid. A read may reach a node that has not
// applied a commit yet (Galera with wsrep_sync_wait 0, a replica a proxy
// sent it to) and see its order INIT for a moment; a commit lost in a
// failover stays lost.
const recheckAfter = 2 * time.Second

// FindLost walks the done keys at rate keys a second and calls found once
// for each order whose key says done while the order is INIT or missing,
// read twice recheckAfter apart. It keeps only those orders in memory, so
// it scales with the lost payments, not with the keys. A key that appears
// twice in the walk is reported once.
func FindLost(ctx context.Context, db *sqlx.DB, keys DoneKeys, rate int, found func(Lost) error) error {
	f := finder{db: db, found: found, seen: map[string]bool{}}
	if err := keys.ScanDone(ctx, rate, func(orderNos []string) error {
		lost, err := unpaid(ctx, db, orderNos)
		if err != nil {
			return err
		}
		now := time.Now()
		for _, l := range lost {
			if !f.seen[l.OrderNo] {
				f.seen[l.OrderNo] = true
				l.Evidence = []string{EvidenceRedis}
				f.pending = append(f.pending, candidate{Lost: l, at: now})
			}
		}
		return f.recheck(ctx, false)
	}); err != nil {
		return err
	}
	return f.recheck(ctx, true)
}

type candidate struct {
	Lost
	at time.Time // when it was found unpaid
}

type finder struct {
	db      *sqlx.DB
	found   func(Lost) error
	seen    map[string]bool
	pending []candidate
}

// recheck reads again the candidates found recheckAfter ago or more (all:
// every one, waiting for the last) and reports those still unpaid.
func (f *finder) recheck(ctx context.Context, all bool) error {
	due := 0
	for due < len(f.pending) && time.Since(f.pending[due].at) >= recheckAfter {
		due++
	}
	if all && len(f.pending) > 0 {
		due = len(f.pending)
		if wait := recheckAfter - time.Since(f.pending[due-1].at); wait > 0 {
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
		}
	}
	if due == 0 {
		return nil
	}
	batch := f.pending[:due]
	f.pending = f.pending[due:]
	nos := make([]string, len(batch))
	for i, c := range batch {
		nos[i] = c.OrderNo
	}
	still, err := unpaid(ctx, f.db, nos)
	if err != nil {
		return err
	}
	now := map[string]Lost{}
	for _, l := range still {
		now[l.OrderNo] = l
	}
	for _, c := range batch {
		if l, ok := now[c.OrderNo]; ok {
			l.Evidence = c.Evidence
			if err := f.found(l); err != nil {
				return err
			}
		}
	}
	return nil
}

// orderRow is what the checks read of an order.
type orderRow struct {
	OrderNo string      `db:"order_no"`
	UserID  int64       `db:"user_id"`
	Amount  money.Cents `db:"amount"`
	Status  string      `db:"status"`
}

// lookupChunk bounds the order numbers of one IN list.
const lookupChunk = 1000

// orders reads the rows of orderNos, by their order number as given: the
// column's collation may match another case (utf8mb4's default is
// case-insensitive, and so is the payment's own UPDATE), so a row is found
// by an exact match first, then by one that ignores case.
func orders(ctx context.Context, db *sqlx.DB, orderNos []string) (map[string]orderRow, error) {
	out := map[string]orderRow{}
	for chunk := range slices.Chunk(orderNos, lookupChunk) {
		q, args, err := sqlx.In("SELECT order_no, user_id, amount, status FROM t_order WHERE order_no IN (?)", chunk)
		if err != nil {
			return nil, err
		}
		var rows []orderRow
		if err := db.SelectContext(ctx, &rows, q, args...); err != nil {
			return nil, fmt.Errorf("reconcile: read orders: %w", err)
		}
		exact, folded := map[string]orderRow{}, map[string]orderRow{}
		for _, r := range rows {
			exact[r.OrderNo], folded[strings.ToLower(r.OrderNo)] = r, r
		}
		for _, no := range chunk {
			if r, ok := exact[no]; ok {
				out[no] = r
			} else if r, ok := folded[strings.ToLower(no)]; ok {
				out[no] = r
			}
		}
	}
	return out, nil
}

// unpaid returns the orders of orderNos that are INIT or missing.
func unpaid(ctx context.Context, db *sqlx.DB, orderNos []string) ([]Lost, error) {
	rows, err := orders(ctx, db, orderNos)
	if err != nil {
		return nil, err
	}
	var out []Lost
	for _, no := range orderNos {
		r, ok := rows[no]
		switch {
		case !ok:
			out = append(out, Lost{OrderNo: no})
		case r.Status == "INIT":
			out = append(out, Lost{OrderNo: no, UserID: r.UserID, Amount: r.Amount, Status: r.Status})
		}
	}
	return out, nil
}

// ErrBadNotice: a line of the notices that is not a payment-success notice.
var ErrBadNotice = errors.New("reconcile: not a payment-success notice")

// LostFromNotices reads payment-success notices, one JSON body a line (as
// paysvc publishes them to ex.pay.notify; blank lines are skipped), and
// calls found once for each order whose notice went out while the order is
// INIT or missing. A notice that names another user or amount than its
// INIT order is reported with Differs set. A line that is not a notice
// stops the read with ErrBadNotice, naming the line.
func LostFromNotices(ctx context.Context, db *sqlx.DB, r io.Reader, found func(Lost) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	seen := map[string]bool{}
	var batch []outbox.Notice
	flush := func() error {
		nos := make([]string, len(batch))
		for i, n := range batch {
			nos[i] = n.OrderNo
		}
		rows, err := orders(ctx, db, nos)
		if err != nil {
			return err
		}
		for _, n := range batch {
			amount, _ := money.Parse(n.Amount) // checked as it was read
			l := Lost{OrderNo: n.OrderNo, UserID: n.UserID, Amount: amount, Evidence: []string{EvidenceNotice}}
			row, ok := rows[n.OrderNo]
			switch {
			case ok && row.Status != "INIT":
				continue // applied: PAID, SETTLED or REFUNDED
			case ok:
				l.UserID, l.Amount, l.Status = row.UserID, row.Amount, row.Status
				if row.UserID != n.UserID || row.Amount != amount {
					l.Differs = fmt.Sprintf("the notice names user %d amount %s", n.UserID, amount)
				}
			}
			if err := found(l); err != nil {
				return err
			}
		}
		batch = batch[:0]
		return nil
	}
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var n outbox.Notice
		if err := json.Unmarshal([]byte(text), &n); err != nil {
			return fmt.Errorf("%w: line %d: %v", ErrBadNotice, line, err)
		}
		if a, err := money.Parse(n.Amount); err != nil || a <= 0 || n.Event != outbox.EventPaymentSucceeded || n.OrderNo == "" || n.UserID <= 0 {
			return fmt.Errorf("%w: line %d: %.80s", ErrBadNotice, line, text)
		}
		if seen[n.OrderNo] {
			continue // a notice is at least once
		}
		seen[n.OrderNo] = true
		if batch = append(batch, n); len(batch) == lookupChunk {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reconcile: read notices: %w", err)
	}
	if len(batch) > 0 {
		return flush()
	}
	return nil
}

// lost runs the lost-payment check over the sources o names and merges
// what they find by order.
func lost(ctx context.Context, db *sqlx.DB, o Options, r *Report) error {
	byOrder := map[string]int{} // index in r.Lost
	add := func(l Lost) error {
		if i, ok := byOrder[l.OrderNo]; ok {
			prev := &r.Lost[i]
			prev.Evidence = append(prev.Evidence, l.Evidence...)
			if prev.Differs == "" {
				prev.Differs = l.Differs
			}
			return nil
		}
		byOrder[l.OrderNo] = len(r.Lost)
		r.Lost = append(r.Lost, l)
		return nil
	}
	if o.Done != nil {
		if err := FindLost(ctx, db, o.Done, o.ScanRate, add); err != nil {
			return fmt.Errorf("reconcile: lost payments (Redis): %w", err)
		}
	}
	if o.Notices != nil {
		if err := LostFromNotices(ctx, db, o.Notices, add); err != nil {
			return fmt.Errorf("reconcile: lost payments (notices): %w", err)
		}
	}
	slices.SortFunc(r.Lost, func(a, b Lost) int { return strings.Compare(a.OrderNo, b.OrderNo) })
	for _, l := range r.Lost {
		r.Problems = append(r.Problems, l.problem())
	}
	return nil
}
