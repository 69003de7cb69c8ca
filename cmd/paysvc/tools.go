package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/reconcile"
	"github.com/paysvc/paysvc/internal/replay"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/trace"
	"github.com/paysvc/paysvc/migrations"
)

// cliOptions are the flags of the operator commands.
type cliOptions struct {
	class, since, status, reason, operator, from, to string
	logs, ids, orders                                multiFlag
	all, allOfOrder, dryRun, fix                     bool
	rate                                             float64
	limit                                            int
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func (o *cliOptions) define(name, sub string, fs *flag.FlagSet) {
	switch {
	case name == "dlq" && sub == "list":
		fs.Var(&o.orders, "order", "dead letters of this order number")
		fs.StringVar(&o.class, "class", "", "error class")
		fs.StringVar(&o.since, "since", "", "last failed at or after: RFC 3339 time, date, or duration back (24h)")
		fs.StringVar(&o.status, "status", "", "NEW, REPLAYED or DISCARDED")
		fs.IntVar(&o.limit, "limit", 100, "rows at most")
	case name == "dlq" && sub == "show":
		fs.Var(&o.ids, "id", "a dead letter id (repeatable)")
		fs.Var(&o.orders, "order", "an order number, even an all-digit one (repeatable)")
	case name == "dlq" && sub == "replay":
		fs.StringVar(&o.class, "class", "", "replay every NEW dead letter of this class")
		fs.BoolVar(&o.all, "all", false, "replay every NEW dead letter")
		fs.BoolVar(&o.dryRun, "dry-run", false, "say what would happen, change nothing")
		fs.Float64Var(&o.rate, "rate", 20, "replays per second at most")
		fallthrough
	case name == "dlq" && sub == "discard":
		fs.Var(&o.ids, "id", "a dead letter id (repeatable)")
		fs.Var(&o.orders, "order", "an order number, even an all-digit one (repeatable)")
		fs.BoolVar(&o.allOfOrder, "all-of-order", false, "an order with several dead letters: take every one")
		fs.StringVar(&o.reason, "reason", "", "why (required; kept in the audit trail)")
		fs.StringVar(&o.operator, "operator", "", "who (default: $USER)")
	case name == "reconcile":
		fs.StringVar(&o.from, "from", "", "from this time (RFC 3339 or date)")
		fs.StringVar(&o.to, "to", "", "up to this time, excluded")
		fs.BoolVar(&o.fix, "fix", false, "book reversals for duplicate flows")
	case name == "trace":
		fs.Var(&o.logs, "log", "a paysvc JSON log file to read too (repeatable)")
	}
}

// runTool runs dlq, reconcile or trace against the configured servers.
func runTool(ctx context.Context, cmd *command, o *cliOptions, cfg *Config, env map[string]string, out io.Writer) error {
	dsn, err := cfg.mysqlDSN()
	if err != nil {
		return err
	}
	db, err := sqldb.Open(ctx, dsn, 4)
	if err != nil {
		return err
	}
	defer db.Close()
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		return err
	}
	// reconcile must run on legacy data before the unique index can be added;
	// the other tools need the finished schema.
	if cmd.name != "reconcile" {
		if err := sqldb.CheckSchema(ctx, db, ms); err != nil {
			return err
		}
	}
	store := deadletter.NewStore(db)
	if o.operator == "" {
		o.operator = env["USER"]
	}
	if o.operator == "" {
		o.operator = "cli"
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	defer tw.Flush()

	switch cmd.name + " " + cmd.sub {
	case "dlq list":
		f := deadletter.Filter{Class: o.class, Status: deadletter.Status(strings.ToUpper(o.status)), Limit: o.limit}
		if len(o.orders) > 1 {
			return errors.New("dlq list: one --order at most")
		}
		if len(o.orders) == 1 {
			f.OrderNo = o.orders[0]
		}
		if o.since != "" {
			if f.Since, err = admin.ParseSince(o.since, time.Now()); err != nil {
				return err
			}
		}
		rows, err := store.List(ctx, f)
		if err != nil {
			return err
		}
		fmt.Fprintln(tw, "ID\tORDER_NO\tAMOUNT\tCLASS\tRETRIES\tPARKED\tSTATUS\tLAST_FAILED\tLAST_ERROR")
		for _, d := range rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.ID, dash(d.Order()), amount(d), d.ErrorClass, d.RetryCount,
				d.ParkedCount, d.Status, d.LastFailedAt.UTC().Format(time.RFC3339), clip(d.LastError, 70))
		}
		return nil
	case "dlq show":
		rows, err := pick(ctx, store, cmd, o, false)
		if err != nil {
			return err
		}
		r := &replay.Replayer{Store: store, Orders: order.NewStore(db), DB: db}
		for i, d := range rows {
			if i > 0 {
				fmt.Fprintln(tw)
			}
			_, events, err := store.Get(ctx, d.ID)
			if err != nil {
				return err
			}
			for _, kv := range [][2]string{
				{"id", fmt.Sprint(d.ID)}, {"order_no", dash(d.Order())}, {"amount", amount(d)}, {"status", string(d.Status)},
				{"error_class", d.ErrorClass}, {"last_error", d.LastError}, {"retry_count", fmt.Sprint(d.RetryCount)},
				{"parked_count", fmt.Sprint(d.ParkedCount)},
				{"first_failed_at", d.FirstFailedAt.UTC().Format(time.RFC3339)},
				{"last_failed_at", d.LastFailedAt.UTC().Format(time.RFC3339)},
				{"updated_by", d.UpdatedBy}, {"reason", dash(d.Reason)}, {"trace_id", dash(d.TraceID)},
				{"replay_would", r.Predict(ctx, d)}, {"body", string(d.Body)}, {"headers", d.Headers},
			} {
				fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
			}
			fmt.Fprintln(tw, "\nHISTORY\nWHEN\tEVENT\tBY\tREASON\tRESULT")
			for _, e := range events {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), e.Event, e.Operator, dash(e.Reason), clip(e.Result, 80))
			}
		}
		return nil
	case "dlq replay":
		if strings.TrimSpace(o.reason) == "" {
			return errors.New("dlq replay: --reason is required")
		}
		if o.rate <= 0 {
			return errors.New("dlq replay: --rate must be positive")
		}
		amqpTLS, err := cfg.amqpTLS()
		if err != nil {
			return err
		}
		pub := &broker.DialingPublisher{URL: cfg.AMQP.URL, Name: "paysvc dlq replay", Timeout: 10 * time.Second, TLS: amqpTLS}
		defer pub.Close()
		r := &replay.Replayer{Store: store, Orders: order.NewStore(db), DB: db, Publish: pub,
			Every: time.Duration(float64(time.Second) / o.rate)}
		var rows []deadletter.DeadLetter
		if len(cmd.args) > 0 || len(o.ids) > 0 || len(o.orders) > 0 {
			rows, err = pick(ctx, store, cmd, o, true, deadletter.New, deadletter.Discarded)
		} else {
			rows, err = r.Select(ctx, replay.Selection{Class: o.class, All: o.all})
		}
		if err != nil {
			return err
		}
		results, err := r.Replay(ctx, rows, o.operator, o.reason, o.dryRun)
		fmt.Fprintln(tw, "ID\tORDER_NO\tOUTCOME")
		failed := 0
		for _, res := range results {
			fmt.Fprintf(tw, "%d\t%s\t%s\n", res.ID, dash(res.OrderNo), res.Outcome)
			if res.Err != nil {
				failed++
			}
		}
		if err != nil {
			return err
		}
		if failed > 0 {
			tw.Flush()
			return fmt.Errorf("dlq replay: %d of %d failed", failed, len(results))
		}
		return nil
	case "dlq discard":
		if strings.TrimSpace(o.reason) == "" {
			return errors.New(`dlq discard: want ORDER_NO, --order ORDER_NO or --id N, and --reason "..."`)
		}
		rows, err := pick(ctx, store, cmd, o, true, deadletter.New)
		if err != nil {
			return err
		}
		for _, d := range rows {
			if err := store.MarkDiscarded(ctx, d.ID, o.operator, o.reason); err != nil {
				return err
			}
			fmt.Fprintf(tw, "dead letter %d (%s) discarded by %s\n", d.ID, dash(d.Order()), o.operator)
		}
		return nil
	case "reconcile ":
		var opts reconcile.Options
		opts.Fix = o.fix
		for _, p := range []struct {
			s string
			t *time.Time
		}{{o.from, &opts.From}, {o.to, &opts.To}} {
			if p.s != "" {
				if *p.t, err = admin.ParseSince(p.s, time.Now()); err != nil {
					return err
				}
			}
		}
		rep, err := reconcile.Run(ctx, db, opts)
		if err != nil {
			return err
		}
		fmt.Fprintln(tw, "KIND\tBIZ_NO\tUSER\tDETAIL\tFIXED")
		for _, p := range rep.Problems {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%v\n", p.Kind, dash(p.BizNo), p.UserID, p.Detail, p.Fixed)
		}
		fmt.Fprintf(tw, "\n%d problems, %d duplicate groups already reversed\n", len(rep.Problems), rep.Reconciled)
		if len(rep.Problems) > 0 {
			tw.Flush()
			return &exitError{code: 2, err: fmt.Errorf("reconcile: %d problems found", len(rep.Problems))}
		}
		return nil
	case "trace ":
		if len(cmd.args) != 1 {
			return errors.New("trace: want one ORDER_NO")
		}
		entries, err := trace.Timeline(ctx, db, cmd.args[0])
		if err != nil {
			return err
		}
		for _, path := range o.logs {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			fromLog, err := trace.FromLog(f, cmd.args[0])
			f.Close()
			if err != nil {
				return err
			}
			entries = trace.Merge(entries, fromLog)
		}
		if len(entries) == 0 {
			return fmt.Errorf("trace: nothing known about order %s", cmd.args[0])
		}
		fmt.Fprintln(tw, "WHEN\tSOURCE\tWHAT")
		for _, e := range entries {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", e.At.UTC().Format("2006-01-02T15:04:05.000Z"), e.Source, e.What)
		}
		return nil
	}
	return fmt.Errorf("unknown command %q", cmd.name)
}

// pick resolves the dead letters a dlq command names: --id N, --order
// ORDER_NO, or ORDER_NO as an argument (an all-digit one that could be an id
// is refused, never guessed). For an operation (act), an order with several
// dead letters in statuses is refused, listing them, unless --all-of-order.
func pick(ctx context.Context, store *deadletter.Store, cmd *command, o *cliOptions, act bool, statuses ...deadletter.Status) ([]deadletter.DeadLetter, error) {
	name := "dlq " + cmd.sub
	if len(cmd.args)+len(o.ids)+len(o.orders) == 0 {
		return nil, fmt.Errorf("%s: want ORDER_NO, --order ORDER_NO or --id N", name)
	}
	var out []deadletter.DeadLetter
	for _, ref := range o.ids {
		id, err := strconv.ParseInt(ref, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: --id %q: want a number", name, ref)
		}
		d, _, err := store.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	for i, ref := range append(append([]string{}, cmd.args...), o.orders...) {
		rows, err := store.FindOrder(ctx, ref, i >= len(cmd.args))
		if err == nil && act {
			rows, err = deadletter.Choose(ref, rows, o.allOfOrder, "--all-of-order", statuses...)
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

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
