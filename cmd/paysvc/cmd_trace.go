package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/paysvc/paysvc/internal/trace"
)

// traceCommands tell what happened to one order.
var traceCommands = []*cmdSpec{{
	name:      "trace",
	synopsis:  "ORDER_NO [--log FILE]",
	summary:   "what happened to one order (with --log, from the daemon's log too)",
	takesArgs: true,
	flags:     traceCmd,
}}

func traceCmd(fs *flag.FlagSet) runFunc {
	var logs multiFlag
	fs.Var(&logs, "log", "a paysvc JSON log `FILE` to read too (repeatable)")
	return func(ctx context.Context, c *cmdLine) error {
		if len(c.args) != 1 {
			return c.usageError("trace: want one ORDER_NO")
		}
		orderNo := c.args[0]
		_, db, err := c.openTool(ctx, true)
		if err != nil {
			return err
		}
		defer db.Close()
		entries, err := trace.Timeline(ctx, db, orderNo)
		if err != nil {
			return err
		}
		for _, path := range logs {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			fromLog, err := trace.FromLog(f, orderNo)
			f.Close()
			if err != nil {
				return err
			}
			entries = trace.Merge(entries, fromLog)
		}
		if len(entries) == 0 {
			return fmt.Errorf("trace: nothing known about order %s", orderNo)
		}
		tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "WHEN\tSOURCE\tWHAT")
		for _, e := range entries {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", e.At.UTC().Format("2006-01-02T15:04:05.000Z"), e.Source, e.What)
		}
		return tw.Flush()
	}
}
