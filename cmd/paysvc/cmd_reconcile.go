package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/reconcile"
)

// reconcileCommands check the money rows.
var reconcileCommands = []*cmdSpec{{
	name:     "reconcile",
	synopsis: "[--from T] [--to T] [--fix] [--output json]",
	summary:  "check money rows, reverse duplicate charges; exit status 2 when it finds problems",
	details: `Runs on legacy data too (before the unique index on flows exists).
Exit status 2 when it finds problems, whatever the output format. Every
finding is listed; the table's last line counts the orders and accounts
they are about, an order once however many checks it fails.

--output json prints an object:
  problems: an array ([] when none) of {kind, order_no (null for a
    balance), user_id, detail, fixed (a reversal was booked by this run)},
    every finding: one order may have several
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
	Detail  string  `json:"detail"`
	Fixed   bool    `json:"fixed"`
}

func reconcileCmd(fs *flag.FlagSet) runFunc {
	from := fs.String("from", "", "from this time `T` (RFC 3339, date, or duration back)")
	to := fs.String("to", "", "up to this time `T`, excluded")
	fix := fs.Bool("fix", false, "book reversals for duplicate flows")
	output := outputFlag(fs)
	return func(ctx context.Context, c *cmdLine) error {
		opts := reconcile.Options{Fix: *fix}
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
		_, db, err := c.openTool(ctx, false)
		if err != nil {
			return err
		}
		defer db.Close()
		rep, err := reconcile.Run(ctx, db, opts)
		if err != nil {
			return err
		}
		if *output == "json" {
			j := reconcileJSON{Problems: make([]problemJSON, 0, len(rep.Problems)), Reconciled: rep.Reconciled}
			for _, p := range rep.Problems {
				j.Problems = append(j.Problems, problemJSON{Kind: p.Kind, OrderNo: orNull(p.BizNo), UserID: p.UserID,
					Detail: p.Detail, Fixed: p.Fixed})
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
		if len(rep.Problems) > 0 {
			return &exitError{code: exitProblems, err: fmt.Errorf("reconcile: problems found with %d orders and %d accounts",
				rep.Orders(), rep.Accounts())}
		}
		return nil
	}
}
