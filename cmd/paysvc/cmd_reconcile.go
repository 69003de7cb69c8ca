package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/reconcile"
	"github.com/paysvc/paysvc/internal/replay"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// reconcileCommands check the money rows.
var reconcileCommands = []*cmdSpec{{
	name: "reconcile",
	synopsis: "[--from T] [--to T] [--notices FILE] [--skip-redis] [--fix [--reason \"...\"] [--operator NAME]]\n" +
		"[--output json]",
	summary: "check money rows, find payments a failover lost; --fix reverses duplicates, re-drives the lost; exit status 2 on problems",
	details: `Runs on legacy data too (before the unique index on flows exists).
Exit status 2 when it finds problems, whatever the output format. Every
finding is listed; the table's last line counts the orders and accounts
they are about, an order once however many checks it fails.

lost_payment: a payment paysvc applied (its Redis guard key says done,
or its notice is in --notices) whose order is INIT or missing: a commit
the database lost in a failover or restore. Every done key is read (SCAN,
--scan-rate keys a second) and every notice, whatever --from and --to.
--fix re-drives each whose order is INIT: parked as a lost_commit dead
letter (the message rebuilt from the order row) and replayed to
q.pay.success like dlq replay, with --operator and --reason in its
history, at --rate a second; paysvc applies it once.

--output json prints an object:
  problems: an array ([] when none) of {kind, order_no (null for a
    balance), user_id, amount (a decimal string, lost_payment only, else
    null), detail, fixed (a reversal was booked, or the payment re-driven,
    by this run)}, every finding: one order may have several
  reconciled: duplicate groups already reversed by an earlier run`,
	flags: reconcileCmd,
}}

type reconcileJSON struct {
	Problems   []problemJSON `json:"problems"`
	Reconciled int           `json:"reconciled"`
}

type problemJSON struct {
	Kind    string  `json:"kind"`
	OrderNo *string `json:"order_no"`
	UserID  int64   `json:"user_id"`
	Amount  *string `json:"amount"` // decimal text: money is never a float
	Detail  string  `json:"detail"`
	Fixed   bool    `json:"fixed"`
}

// redriveReason is the reason a re-drive records when --reason is not given.
const redriveReason = "lost payment re-driven by paysvc reconcile --fix"

func reconcileCmd(fs *flag.FlagSet) runFunc {
	from := fs.String("from", "", "from this time `T` (RFC 3339, date, or duration back)")
	to := fs.String("to", "", "up to this time `T`, excluded")
	fix := fs.Bool("fix", false, "book reversals for duplicate flows, re-drive lost payments")
	notices := fs.String("notices", "", "payment-success notices to check, one JSON body a line, from `FILE`")
	skipRedis := fs.Bool("skip-redis", false, "do not read the Redis guard's done keys")
	scanRate := fs.Int("scan-rate", 20000, "done keys read a second at most, `N`")
	reason := fs.String("reason", redriveReason, "why lost payments are re-driven, `TEXT` (kept in their history)")
	operator := fs.String("operator", "", "who re-drives lost payments, `NAME` (default: $USER)")
	rate := fs.Float64("rate", float64(time.Second/replay.DefaultEvery), "`N` re-drives a second at most")
	output := outputFlag(fs)
	return func(ctx context.Context, c *cmdLine) error {
		opts := reconcile.Options{Fix: *fix, ScanRate: *scanRate}
		for _, p := range []struct {
			name, s string
			t       *time.Time
		}{{"from", *from, &opts.From}, {"to", *to, &opts.To}} {
			if p.s != "" {
				var err error
				if *p.t, err = admin.ParseSince(p.s, time.Now()); err != nil {
					return c.usageError("reconcile: --%s: %v", p.name, err)
				}
			}
		}
		switch {
		case *scanRate < 0:
			return c.usageError("reconcile: --scan-rate must be 0 (no bound) or more")
		case *rate <= 0:
			return c.usageError("reconcile: --rate must be positive")
		case strings.TrimSpace(*reason) == "":
			return c.usageError("reconcile: --reason must say why")
		}
		who := c.operator(*operator)
		if err := deadletter.CheckAudit(who, *reason); err != nil {
			return c.usageError("reconcile: %v", err)
		}
		cfg, db, err := c.openForOperator(ctx, false)
		if err != nil {
			return err
		}
		defer db.Close()
		if *notices != "" {
			f, err := os.Open(*notices)
			if err != nil {
				return fmt.Errorf("reconcile: --notices: %w", err)
			}
			defer f.Close()
			opts.Notices = f
		}
		if !*skipRedis {
			ropts, err := cfg.redisOptions(2)
			if err != nil {
				return err
			}
			rdb := redis.NewUniversalClient(ropts)
			defer rdb.Close()
			opts.Done = idem.New(rdb, idem.Config{KeyPrefix: cfg.Idempotent.KeyPrefix})
		}
		rep, err := reconcile.Run(ctx, db, opts)
		if err != nil {
			if !*skipRedis {
				err = fmt.Errorf("%w (--skip-redis leaves the done keys out)", err)
			}
			return err
		}
		failed := 0
		if *fix {
			if failed, err = redrive(ctx, cfg, db, &rep, who, *reason, *rate); err != nil {
				return err
			}
		}
		if *output == "json" {
			j := reconcileJSON{Problems: make([]problemJSON, 0, len(rep.Problems)), Reconciled: rep.Reconciled}
			for _, p := range rep.Problems {
				pj := problemJSON{Kind: p.Kind, OrderNo: orNull(p.BizNo), UserID: p.UserID, Detail: p.Detail, Fixed: p.Fixed}
				if p.Kind == reconcile.LostPayment && p.UserID != 0 {
					pj.Amount = orNull(p.Amount.String())
				}
				j.Problems = append(j.Problems, pj)
			}
			if err := writeJSON(c.out, j); err != nil {
				return err
			}
		} else {
			tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tBIZ_NO\tUSER\tDETAIL\tFIXED")
			for _, p := range rep.Problems {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%v\n", p.Kind, dash(p.BizNo), p.UserID, p.Detail, p.Fixed)
			}
			fmt.Fprintf(tw, "\n%d findings about %d orders and %d accounts, %d duplicate groups already reversed\n",
				len(rep.Problems), rep.Orders(), rep.Accounts(), rep.Reconciled)
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		if failed > 0 {
			return fmt.Errorf("reconcile: %d re-drives failed; the table says why", failed)
		}
		if len(rep.Problems) > 0 {
			return &exitError{code: exitProblems, err: fmt.Errorf("reconcile: problems found with %d orders and %d accounts",
				rep.Orders(), rep.Accounts())}
		}
		return nil
	}
}

// redrive re-drives the lost payments of rep whose order is INIT (see
// replay.Replayer.Redrive) and writes the outcome into their findings:
// Fixed when the copy was published. It returns how many failed.
func redrive(ctx context.Context, cfg *Config, db *sqldb.DB, rep *reconcile.Report, operator, reason string, rate float64) (int, error) {
	var lost []order.Payment
	for _, l := range rep.Lost {
		if l.Redrivable() {
			lost = append(lost, order.Payment{OrderNo: l.OrderNo, UserID: l.UserID, Amount: l.Amount})
		}
	}
	if len(lost) == 0 {
		return 0, nil
	}
	amqpTLS, err := cfg.amqpTLS()
	if err != nil {
		return 0, err
	}
	pub := &broker.DialingPublisher{URL: cfg.AMQP.URL, Name: "paysvc reconcile", Timeout: 10 * time.Second, TLS: amqpTLS}
	defer pub.Close()
	r := &replay.Replayer{Store: deadletter.NewStore(db), Orders: order.NewStore(db), DB: db, Publish: pub,
		Every: time.Duration(float64(time.Second) / rate)}
	results, err := r.Redrive(ctx, lost, operator, reason)
	outcome := map[string]replay.Result{}
	failed := 0
	for _, res := range results {
		outcome[res.OrderNo] = res
		if res.Err != nil {
			failed++
		}
	}
	for i, p := range rep.Problems {
		if res, ok := outcome[p.BizNo]; ok && p.Kind == reconcile.LostPayment {
			rep.Problems[i].Detail += "; re-drive: " + res.Outcome
			if res.ID != 0 {
				rep.Problems[i].Detail += fmt.Sprintf(" (dead letter %d)", res.ID)
			}
			rep.Problems[i].Fixed = res.Err == nil && !strings.HasPrefix(res.Outcome, "skipped")
		}
	}
	return failed, err
}
