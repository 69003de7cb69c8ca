package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/replay"
)

// dlqCommands inspect, replay and discard the terminal messages kept in
// t_dead_letter.
var dlqCommands = []*cmdSpec{{
	name: "dlq", sub: "list",
	synopsis: "[--order ORDER_NO] [--class C] [--since T] [--status S] [--limit N] [--output json]",
	summary:  "list dead letters, the last failed first",
	details: `--output json prints an array ([] when none) of objects:
  id, order_no (null when unknown), user_id (null when unknown),
  amount (a decimal string such as "5.00", exact; null when unknown),
  status, error_class, last_error (whole), retry_count, parked_count,
  first_failed_at, last_failed_at (RFC 3339, UTC), updated_by, reason,
  trace_id`,
	flags: dlqList,
}, {
	name: "dlq", sub: "show",
	synopsis: "ORDER_NO... | --order ORDER_NO... | --id N... [--output json]",
	summary:  "dead letters in full: body, headers, what a replay would do, history",
	details: `An all-digit ORDER_NO that is also a row id is refused: say --order or --id.

--output json prints an array of objects: the fields of dlq list, and
  replay_would, body (the message as received), headers (their JSON text),
  history: an array of {at (RFC 3339, UTC), event, operator, reason, result}`,
	takesArgs: true,
	flags:     dlqShow,
}, {
	name: "dlq", sub: "replay",
	synopsis: "(ORDER_NO... | --order ORDER_NO... | --id N... | --class C | --all) [--all-of-order]\n" +
		"[--dry-run] --reason \"...\" [--operator NAME] [--rate N]",
	summary:   "publish NEW or DISCARDED dead letters to q.pay.success again (audited)",
	details:   "Exit status 1 when a replay failed; the table says which.",
	takesArgs: true,
	flags:     dlqReplay,
}, {
	name: "dlq", sub: "discard",
	synopsis:  "(ORDER_NO | --order ORDER_NO | --id N)... [--all-of-order] --reason \"...\" [--operator NAME]",
	summary:   "mark NEW dead letters as not to be replayed (audited)",
	takesArgs: true,
	flags:     dlqDiscard,
}}

// deadLetterJSON is one row of dlq list --output json.
type deadLetterJSON struct {
	ID            int64   `json:"id"`
	OrderNo       *string `json:"order_no"`
	UserID        *int64  `json:"user_id"`
	Amount        *string `json:"amount"` // decimal text: money is never a float
	Status        string  `json:"status"`
	ErrorClass    string  `json:"error_class"`
	LastError     string  `json:"last_error"`
	RetryCount    int     `json:"retry_count"`
	ParkedCount   int     `json:"parked_count"`
	FirstFailedAt string  `json:"first_failed_at"`
	LastFailedAt  string  `json:"last_failed_at"`
	UpdatedBy     string  `json:"updated_by"`
	Reason        string  `json:"reason"`
	TraceID       string  `json:"trace_id"`
}

// deadLetterDetailJSON is one dead letter of dlq show --output json.
type deadLetterDetailJSON struct {
	deadLetterJSON
	ReplayWould string      `json:"replay_would"`
	Body        string      `json:"body"`
	Headers     string      `json:"headers"`
	History     []eventJSON `json:"history"`
}

type eventJSON struct {
	At       string `json:"at"`
	Event    string `json:"event"`
	Operator string `json:"operator"`
	Reason   string `json:"reason"`
	Result   string `json:"result"`
}

func toJSON(d deadletter.DeadLetter) deadLetterJSON {
	j := deadLetterJSON{ID: d.ID, OrderNo: d.OrderNo, UserID: d.UserID, Status: string(d.Status),
		ErrorClass: d.ErrorClass, LastError: d.LastError, RetryCount: d.RetryCount, ParkedCount: d.ParkedCount,
		FirstFailedAt: rfc3339(d.FirstFailedAt), LastFailedAt: rfc3339(d.LastFailedAt),
		UpdatedBy: d.UpdatedBy, Reason: d.Reason, TraceID: d.TraceID}
	if d.Amount != nil {
		s := d.Amount.String()
		j.Amount = &s
	}
	return j
}

func dlqList(fs *flag.FlagSet) runFunc {
	var orders multiFlag
	fs.Var(&orders, "order", "dead letters of this `ORDER_NO`")
	class := fs.String("class", "", "error `CLASS`")
	since := fs.String("since", "", "last failed at or after `T`: RFC 3339 time, date, or duration back (24h)")
	status := fs.String("status", "", "`S`: NEW, REPLAYED or DISCARDED")
	limit := fs.Int("limit", 100, "`N` rows at most")
	output := outputFlag(fs)
	return func(ctx context.Context, c *cmdLine) error {
		f := deadletter.Filter{Class: *class, Status: deadletter.Status(strings.ToUpper(*status)), Limit: *limit}
		if len(orders) > 1 {
			return c.usageError("dlq list: one --order at most")
		}
		switch f.Status {
		case "", deadletter.New, deadletter.Replayed, deadletter.Discarded:
		default:
			return c.usageError("dlq list: --status %q: want NEW, REPLAYED or DISCARDED", *status)
		}
		if *limit < 1 {
			return c.usageError("dlq list: --limit %d: want 1 or more", *limit)
		}
		if len(orders) == 1 {
			f.OrderNo = orders[0]
		}
		if *since != "" {
			var err error
			if f.Since, err = admin.ParseSince(*since, time.Now()); err != nil {
				return c.usageError("dlq list: --%v", err)
			}
		}
		_, db, err := c.openForOperator(ctx, true)
		if err != nil {
			return err
		}
		defer db.Close()
		rows, err := deadletter.NewStore(db).List(ctx, f)
		if err != nil {
			return err
		}
		if *output == "json" {
			list := make([]deadLetterJSON, 0, len(rows))
			for _, d := range rows {
				list = append(list, toJSON(d))
			}
			return writeJSON(c.out, list)
		}
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tORDER_NO\tAMOUNT\tCLASS\tRETRIES\tPARKED\tSTATUS\tLAST_FAILED\tLAST_ERROR")
		for _, d := range rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.ID, dash(d.Order()), amount(d), d.ErrorClass, d.RetryCount,
				d.ParkedCount, d.Status, rfc3339(d.LastFailedAt), clip(d.LastError, 70))
		}
		return tw.Flush()
	}
}

func dlqShow(fs *flag.FlagSet) runFunc {
	sel := selectionFlags(fs)
	output := outputFlag(fs)
	return func(ctx context.Context, c *cmdLine) error {
		sel.args = c.args
		if sel.empty() {
			return c.usageError("dlq show: want ORDER_NO, --order ORDER_NO or --id N")
		}
		_, db, err := c.openForOperator(ctx, true)
		if err != nil {
			return err
		}
		defer db.Close()
		store := deadletter.NewStore(db)
		rows, err := sel.pick(ctx, store, "dlq show", false, false)
		if err != nil {
			return err
		}
		r := &replay.Replayer{Store: store, Orders: order.NewStore(db), DB: db}
		shown := make([]deadLetterDetailJSON, 0, len(rows))
		for _, d := range rows {
			_, events, err := store.Get(ctx, d.ID)
			if err != nil {
				return err
			}
			j := deadLetterDetailJSON{deadLetterJSON: toJSON(d), ReplayWould: r.Predict(ctx, d), Body: string(d.Body),
				Headers: d.Headers, History: make([]eventJSON, 0, len(events))}
			for _, e := range events {
				j.History = append(j.History, eventJSON{At: rfc3339(e.At), Event: e.Event, Operator: e.Operator,
					Reason: e.Reason, Result: e.Result})
			}
			shown = append(shown, j)
		}
		if *output == "json" {
			return writeJSON(c.out, shown)
		}
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		for i, j := range shown {
			d := rows[i]
			if i > 0 {
				fmt.Fprintln(tw)
			}
			for _, kv := range [][2]string{
				{"id", fmt.Sprint(d.ID)}, {"order_no", dash(d.Order())}, {"amount", amount(d)}, {"status", string(d.Status)},
				{"error_class", d.ErrorClass}, {"last_error", d.LastError}, {"retry_count", fmt.Sprint(d.RetryCount)},
				{"parked_count", fmt.Sprint(d.ParkedCount)},
				{"first_failed_at", j.FirstFailedAt}, {"last_failed_at", j.LastFailedAt},
				{"updated_by", d.UpdatedBy}, {"reason", dash(d.Reason)}, {"trace_id", dash(d.TraceID)},
				{"replay_would", j.ReplayWould}, {"body", j.Body}, {"headers", d.Headers},
			} {
				fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
			}
			fmt.Fprintln(tw, "\nHISTORY\nWHEN\tEVENT\tBY\tREASON\tRESULT")
			for _, e := range j.History {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.At, e.Event, e.Operator, dash(e.Reason), clip(e.Result, 80))
			}
		}
		return tw.Flush()
	}
}

func dlqReplay(fs *flag.FlagSet) runFunc {
	sel := selectionFlags(fs)
	act := actionFlags(fs)
	class := fs.String("class", "", "replay every NEW dead letter of this `CLASS`")
	all := fs.Bool("all", false, "replay every NEW dead letter")
	dryRun := fs.Bool("dry-run", false, "say what would happen, change nothing")
	rate := fs.Float64("rate", float64(time.Second/replay.DefaultEvery), "`N` replays per second at most")
	return func(ctx context.Context, c *cmdLine) error {
		sel.args = c.args
		switch {
		case strings.TrimSpace(act.reason) == "":
			return c.usageError("dlq replay: --reason is required")
		case *rate <= 0:
			return c.usageError("dlq replay: --rate must be positive")
		case sel.empty() && *class == "" && !*all:
			return c.usageError("dlq %v", replay.ErrNoSelection)
		case !sel.empty() && (*class != "" || *all):
			// One would be ignored without a word.
			return c.usageError("dlq replay: name rows (ORDER_NO, --order, --id) or select them (--class, --all), not both")
		}
		cfg, db, err := c.openForOperator(ctx, true)
		if err != nil {
			return err
		}
		defer db.Close()
		amqpTLS, err := cfg.amqpTLS()
		if err != nil {
			return err
		}
		store := deadletter.NewStore(db)
		pub := &broker.DialingPublisher{URL: cfg.AMQP.URL, Name: "paysvc dlq replay", Timeout: 10 * time.Second, TLS: amqpTLS}
		defer pub.Close()
		r := &replay.Replayer{Store: store, Orders: order.NewStore(db), DB: db, Publish: pub,
			Every: time.Duration(float64(time.Second) / *rate)}
		var rows []deadletter.DeadLetter
		if !sel.empty() {
			rows, err = sel.pick(ctx, store, "dlq replay", true, act.allOfOrder, deadletter.New)
			// A DISCARDED row is replayed only by its id: someone decided
			// it should not be paid, and an order number names the order's
			// rows as they are now, not as the operator last saw them.
			for _, d := range rows {
				if d.Status == deadletter.Discarded && !slices.Contains(sel.ids, d.ID) {
					return fmt.Errorf("dlq replay: dead letter %d of order %s is DISCARDED (by %s: %s): to replay it anyway, name it: --id %d",
						d.ID, dash(d.Order()), dash(d.UpdatedBy), dash(d.Reason), d.ID)
				}
			}
		} else {
			rows, err = r.Select(ctx, replay.Selection{Class: *class, All: *all})
		}
		if err != nil {
			return err
		}
		results, err := r.Replay(ctx, rows, c.operator(act.operator), act.reason, *dryRun)
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tORDER_NO\tOUTCOME")
		failed := 0
		for _, res := range results {
			fmt.Fprintf(tw, "%d\t%s\t%s\n", res.ID, dash(res.OrderNo), res.Outcome)
			if res.Err != nil {
				failed++
			}
		}
		tw.Flush()
		if err != nil {
			return err
		}
		if failed > 0 {
			return fmt.Errorf("dlq replay: %d of %d failed", failed, len(results))
		}
		return nil
	}
}

func dlqDiscard(fs *flag.FlagSet) runFunc {
	sel := selectionFlags(fs)
	act := actionFlags(fs)
	return func(ctx context.Context, c *cmdLine) error {
		sel.args = c.args
		if strings.TrimSpace(act.reason) == "" {
			return c.usageError(`dlq discard: want ORDER_NO, --order ORDER_NO or --id N, and --reason "..."`)
		}
		if sel.empty() {
			return c.usageError("dlq discard: want ORDER_NO, --order ORDER_NO or --id N")
		}
		_, db, err := c.openForOperator(ctx, true)
		if err != nil {
			return err
		}
		defer db.Close()
		store := deadletter.NewStore(db)
		rows, err := sel.pick(ctx, store, "dlq discard", true, act.allOfOrder, deadletter.New)
		if err != nil {
			return err
		}
		operator := c.operator(act.operator)
		for _, d := range rows {
			if err := store.MarkDiscarded(ctx, d, operator, act.reason); err != nil {
				return err
			}
			fmt.Fprintf(c.out, "dead letter %d (%s) discarded by %s\n", d.ID, dash(d.Order()), operator)
		}
		return nil
	}
}

// selection is the dead letters a dlq command names: ORDER_NO arguments,
// --order ORDER_NO, --id N.
type selection struct {
	args   []string
	orders multiFlag
	ids    idsFlag
}

func selectionFlags(fs *flag.FlagSet) *selection {
	s := &selection{}
	fs.Var(&s.ids, "id", "a dead letter `ID` (repeatable)")
	fs.Var(&s.orders, "order", "an `ORDER_NO`, even an all-digit one (repeatable)")
	return s
}

func (s *selection) empty() bool { return len(s.args)+len(s.ids)+len(s.orders) == 0 }

// action is the flags of a dlq command that changes something.
type action struct {
	allOfOrder       bool
	reason, operator string
}

func actionFlags(fs *flag.FlagSet) *action {
	a := &action{}
	fs.BoolVar(&a.allOfOrder, "all-of-order", false, "an order with several dead letters: take every one")
	fs.StringVar(&a.reason, "reason", "", "why, `TEXT` (required; kept in the audit trail)")
	fs.StringVar(&a.operator, "operator", "", "who, `NAME` (default: $USER)")
	return a
}

// pick resolves the selection to dead letters: an ORDER_NO argument that is
// all digits and could be an id is refused, never guessed. For an operation
// (act), an order with several dead letters in statuses is refused, listing
// them, unless allOfOrder.
func (s *selection) pick(ctx context.Context, store *deadletter.Store, name string, act bool, allOfOrder bool, statuses ...deadletter.Status) ([]deadletter.DeadLetter, error) {
	var out []deadletter.DeadLetter
	for _, id := range s.ids {
		d, _, err := store.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	for i, ref := range append(append([]string{}, s.args...), s.orders...) {
		rows, err := store.FindOrder(ctx, ref, i >= len(s.args))
		if err == nil && act {
			rows, err = deadletter.Choose(ref, rows, allOfOrder, "--all-of-order", statuses...)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, rows...)
	}
	return out, nil
}

func amount(d deadletter.DeadLetter) string {
	if d.Amount == nil {
		return "-"
	}
	return d.Amount.String()
}
