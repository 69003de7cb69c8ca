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
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/timeline"
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
		cfg, db, err := c.openForOperator(ctx, true)
		if err != nil {
			return err
		}
		defer db.Close()
		entries, err := timeline.FromDB(ctx, db, orderNo)
		if err != nil {
			return err
		}
		entries = timeline.Merge(entries, redisEntries(ctx, cfg, db, orderNo, time.Now()))
		for _, path := range logs {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			fromLog, err := timeline.FromLog(f, orderNo)
			f.Close()
			if err != nil {
				return err
			}
			entries = timeline.Merge(entries, fromLog)
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

// redisEntries reads what Redis knows of the order: its guard key and its
// retry copies. Redis trouble is one entry saying so.
func redisEntries(ctx context.Context, cfg *Config, db *sqldb.DB, orderNo string, now time.Time) []timeline.Entry {
	unread := func(err error) []timeline.Entry {
		return []timeline.Entry{{At: now, Source: "redis", What: "Redis not read: " + err.Error()}}
	}
	ropts, err := cfg.redisOptions(2)
	if err != nil {
		return unread(err)
	}
	rdb := redis.NewUniversalClient(ropts)
	defer rdb.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	guard := idem.New(rdb, idem.Config{KeyPrefix: cfg.Idempotent.KeyPrefix})
	key, err := keyEntries(rctx, guard, db, cfg.Idempotent.TTL, orderNo, now)
	if err != nil {
		return unread(err)
	}
	retries, err := retryEntries(rctx, guard, orderNo, now)
	if err != nil {
		return unread(err)
	}
	return append(key, retries...)
}

// keyEntries says what the order's guard key holds. A done key whose order
// is INIT or missing is a payment paysvc applied and the database lost.
func keyEntries(ctx context.Context, guard *idem.Guard, db *sqldb.DB, ttl time.Duration, orderNo string, now time.Time) ([]timeline.Entry, error) {
	st, left, err := guard.Peek(ctx, orderNo)
	if err != nil || st == 0 {
		return nil, err
	}
	if st != idem.Done {
		what := fmt.Sprintf("Redis key held by a claim in flight (%s of its lease left)", left.Round(time.Millisecond))
		if st == idem.Foreign {
			what = "Redis key holds a value paysvc does not write (a hand-written consumer's mark): the database decides alone"
		}
		return []timeline.Entry{{At: now, Source: "redis", What: what}}, nil
	}
	// Marked when it had ttl to live (idempotent.ttl, as this
	// configuration says: the daemon's may differ).
	at := now.Add(left - ttl)
	out := []timeline.Entry{{At: at, Source: "redis", What: fmt.Sprintf("Redis key done: paysvc committed the payment (key expires %s)",
		now.Add(left).UTC().Format(time.RFC3339))}}
	var status []string
	if err := db.SelectContext(ctx, &status, "SELECT status FROM t_order WHERE order_no = ?", orderNo); err != nil {
		return nil, err
	}
	if len(status) == 0 || status[0] == "INIT" {
		order := "missing"
		if len(status) > 0 {
			order = "INIT"
		}
		out = append(out, timeline.Entry{At: now, Source: "redis", What: "the order is " + order + " while its Redis key says done: " +
			"a payment paysvc applied that the database lost (a failover or restore); `paysvc reconcile` lists it, " +
			"`paysvc reconcile --fix` re-drives it (docs/operations.md, \"Payments lost in a database failover\")"})
	}
	return out, nil
}

// retryEntries lists the order's retry copies the retry ledger still
// watches: where each was published and when it is (or was) due back. An
// overdue one was stranded in its wait queue, or nothing brought it back.
func retryEntries(ctx context.Context, guard *idem.Guard, orderNo string, now time.Time) ([]timeline.Entry, error) {
	copies, err := guard.Retries().Of(ctx, orderNo)
	if err != nil {
		return nil, err
	}
	var out []timeline.Entry
	for _, rc := range copies {
		what := fmt.Sprintf("retry copy of attempt %d last seen published to %s; not back yet", rc.Attempt, rc.Queue)
		if now.After(rc.OverdueAt) {
			what = fmt.Sprintf("retry copy of attempt %d last seen published to %s; not back, overdue since %s: "+
				"stranded in the queue (docs/operations.md, \"Retry copies overdue\")",
				rc.Attempt, rc.Queue, rc.OverdueAt.UTC().Format(time.RFC3339))
		}
		out = append(out, timeline.Entry{At: rc.OverdueAt, Source: "retry", What: what})
	}
	return out, nil
}
