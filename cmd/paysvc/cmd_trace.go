package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/idem"
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
		cfg, db, err := c.openTool(ctx, true)
		if err != nil {
			return err
		}
		defer db.Close()
		entries, err := trace.Timeline(ctx, db, orderNo)
		if err != nil {
			return err
		}
		entries = trace.Merge(entries, retryEntries(ctx, cfg, orderNo, time.Now()))
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

// retryEntries lists the order's retry copies the retry ledger still
// watches: where each was published and when it is (or was) due back. An
// overdue one was stranded in its wait queue, or nothing brought it back.
// Redis trouble is one entry saying so.
func retryEntries(ctx context.Context, cfg *Config, orderNo string, now time.Time) []trace.Entry {
	unread := func(err error) []trace.Entry {
		return []trace.Entry{{At: now, Source: "retry", What: "retry ledger (Redis) not read: " + err.Error()}}
	}
	ropts, err := cfg.redisOptions(2)
	if err != nil {
		return unread(err)
	}
	rdb := redis.NewUniversalClient(ropts)
	defer rdb.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	copies, err := idem.New(rdb, idem.Config{KeyPrefix: cfg.Idempotent.KeyPrefix}).Retries().Of(rctx, orderNo)
	if err != nil {
		return unread(err)
	}
	var out []trace.Entry
	for _, rc := range copies {
		what := fmt.Sprintf("retry copy of attempt %d last seen published to %s; not back yet", rc.Attempt, rc.Queue)
		if now.After(rc.OverdueAt) {
			what = fmt.Sprintf("retry copy of attempt %d last seen published to %s; not back, overdue since %s: "+
				"stranded in the queue (docs/operations.md, \"Retry copies overdue\")",
				rc.Attempt, rc.Queue, rc.OverdueAt.UTC().Format(time.RFC3339))
		}
		out = append(out, trace.Entry{At: rc.OverdueAt, Source: "retry", What: what})
	}
	return out
}
