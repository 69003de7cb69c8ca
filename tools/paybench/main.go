// Command paybench measures paysvc against the real servers on loopback, and
// in the same run the ceilings it sits on, since a shared machine is noisy:
//
//   - the payment transaction itself from plain Go, at 16, 32 and 64
//     connections (the best is the MySQL ceiling);
//   - RabbitMQ delivering and acking the same persistent messages, no work;
//   - Redis SET NX round trips at 64 connections;
//   - paysvc's consumer with the default settings draining preloaded
//     messages (with duplicates): messages/s, CPU seconds per 1,000 messages,
//     peak heap, and handling latency p50/p99/p99.9;
//   - the article's configuration (1 worker, prefetch 10);
//   - hot accounts: every payment on 10 users;
//   - open loop at half the measured peak: latency from publish to payment.
//
// -only trace (never part of a default run; make bench BENCH_TRACE=...)
// drains payments with the daemon with tracing off and at each sample
// ratio of -trace, spans to a local receiver that discards them, and
// reports the daemon's CPU per 1,000 payments.
//
// -only pairs (never part of a default run) compares a setting's latency
// at half the peak in paired open loops, the only comparison this machine's
// weather allows.
//
// Usage: paybench [-n 20000] [-dup 0.1] [-users 1000] (make bench)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"io"
	"log"
)

type options struct {
	mysqlDSN, amqpURL, redisAddr string
	n, users, hotUsers           int
	dup                          float64
	defaults                     consumerConfig
	cpuProfile                   string
	heapTrace                    bool
	noPipeline                   bool
	paysvcBinary                 string
	paysvcEnv                    []string // the compare phase's daemon: settings other than the defaults
	openDump                     string   // keep each open loop's timings and daemon log in this directory
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func main() {
	o := &options{
		mysqlDSN:  env("PAYSVC_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/"),
		amqpURL:   env("PAYSVC_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		redisAddr: env("PAYSVC_TEST_REDIS_ADDR", "127.0.0.1:6379"),
		defaults:  consumerConfig{workers: 64, prefetch: 128, maxOpen: 20, groupSize: 16, groupConns: 2}, // config.yaml's defaults
	}
	flag.IntVar(&o.n, "n", 20000, "payments per paysvc run")
	flag.IntVar(&o.users, "users", 1000, "accounts")
	flag.IntVar(&o.hotUsers, "hot-users", 10, "accounts in the hot-account run")
	flag.Float64Var(&o.dup, "dup", 0.1, "share of payments published twice")
	only := flag.String("only", "", "comma-separated phases: compare,ceilings,grouped,default,article,hot,open; "+
		"and, only when named, large (production-size tables against small ones: make bench-large), pairs (paired open loops, -paysvc-env's settings against -pair-env's), "+
		"daemon (one drain of -n payments by the paysvc daemon; with -heap-trace its heap, RSS and goroutines every 10%) and "+
		"trace (the daemon's CPU per 1,000 payments for each of -trace's modes)")
	traceFlag := flag.String("trace", "off,0.01,1", "-only trace: off and sample ratios (trace.sampleRatio) to measure, spans to a local receiver that discards them")
	flag.StringVar(&o.paysvcBinary, "paysvc", "bin/paysvc", "the paysvc binary the compare phase runs")
	flag.Func("paysvc-env", "KEY=VALUE for the compare phase's daemon, e.g. PAYSVC_MYSQL_GROUPSIZE=32 (repeatable; the targets are on the defaults)",
		func(s string) error {
			if !strings.HasPrefix(s, "PAYSVC_") || !strings.Contains(s, "=") {
				return fmt.Errorf("want PAYSVC_KEY=VALUE, got %q", s)
			}
			o.paysvcEnv = append(o.paysvcEnv, s)
			return nil
		})
	var pairEnv []string
	pairBinary := flag.String("pair-paysvc", "", "the paysvc binary of side B of -only pairs (default: -paysvc's)")
	flag.Func("pair-env", "KEY=VALUE added for side B of -only pairs (repeatable): PAYSVC_* settings, or GOMAXPROCS, GOGC, GOMEMLIMIT, GODEBUG",
		func(s string) error {
			k, _, ok := strings.Cut(s, "=")
			if !ok || !strings.HasPrefix(k, "PAYSVC_") && !slices.Contains([]string{"GOMAXPROCS", "GOGC", "GOMEMLIMIT", "GODEBUG"}, k) {
				return fmt.Errorf("want PAYSVC_KEY=VALUE or a Go runtime variable, got %q", s)
			}
			pairEnv = append(pairEnv, s)
			return nil
		})
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the default run here")
	flag.BoolVar(&o.heapTrace, "heap-trace", false, "print the heap every 10% of a run (memory flatness over long runs)")
	flag.IntVar(&o.defaults.workers, "workers", o.defaults.workers, "amqp.workers of the default run")
	flag.IntVar(&o.defaults.prefetch, "prefetch", o.defaults.prefetch, "amqp.prefetch of the default run")
	flag.IntVar(&o.defaults.maxOpen, "conns", o.defaults.maxOpen, "mysql.maxOpenConns of the default run")
	flag.IntVar(&o.defaults.groupSize, "group", o.defaults.groupSize, "mysql.groupSize of the default run")
	flag.IntVar(&o.defaults.groupConns, "group-conns", o.defaults.groupConns, "mysql.groupConns of the default run")
	flag.BoolVar(&o.noPipeline, "no-redis-pipeline", false, "one Redis round trip per claim and done mark (comparison)")
	openRate := flag.Float64("open-rate", 0, "the open loop's rate (0: half the default run's peak, or 500)")
	flag.StringVar(&o.openDump, "open-dump", "", "keep each open loop's per-payment timings (TSV) and the daemon's log in this directory")
	openDaemon := flag.Bool("open-daemon", false, "run the open phase into the paysvc daemon (as the compare rounds do), not the in-process consumer")
	rounds := flag.Int("rounds", 1, "repeat the best ceiling, default and article runs this many times, interleaved, and report medians")
	lo := largeOptions{
		small: shape{DB: "paysvc_bench_small", Accounts: 10000, Orders: 200000, InitEvery: 1},
		large: shape{DB: "paysvc_bench_large", Accounts: 1000000, Orders: 11000000, InitEvery: 11},
	}
	flag.StringVar(&lo.large.DB, "large-db", lo.large.DB, "-only large: the production-size database (seeded once, kept between runs)")
	flag.Int64Var(&lo.large.Accounts, "large-accounts", lo.large.Accounts, "-only large: accounts of the production-size database")
	flag.Int64Var(&lo.large.Orders, "large-orders", lo.large.Orders, "-only large: orders of the production-size database")
	flag.Int64Var(&lo.large.InitEvery, "large-init-every", lo.large.InitEvery, "-only large: every this many orders one is INIT, the others PAID with a flow and a sent notice each")
	flag.StringVar(&lo.small.DB, "small-db", lo.small.DB, "-only large: the small database (10k accounts, 200k INIT orders; kept between runs)")
	flag.IntVar(&lo.n, "large-n", 40000, "-only large: payments per drain")
	flag.Float64Var(&lo.hotShare, "hot-share", 0.8, "-only large: share of the hot mix's payments on a fifth of the users")
	flag.IntVar(&lo.rounds, "large-rounds", 1, "-only large: interleaved rounds of the twelve drains (0: seed, or find the seed, and exit)")
	flag.IntVar(&lo.openSeconds, "large-open", 10, "-only large: seconds of each open loop (paysvc at half its drain rate; 0: none)")
	flag.StringVar(&lo.kinds, "large-kinds", "", "-only large: only these consumers (comma-separated: paysvc, ref, batched; default all)")
	flag.StringVar(&lo.mixes, "large-mixes", "", "-only large: only these mixes (uniform, hot; default both)")
	flag.StringVar(&lo.dbs, "large-dbs", "", "-only large: only these databases (small, large; default both)")
	flag.StringVar(&lo.trace, "large-trace", "0.01", "-only large: paysvc's trace.sampleRatio in the drains, its spans exported to a local receiver that discards them (off: no export)")
	largeDrop := flag.Bool("large-drop", false, "drop the databases -only large seeded, and exit")
	flag.Parse()
	mysql.SetLogger(log.New(io.Discard, "", 0))
	ctx := context.Background()
	want := func(p string) bool { return *only == "" || strings.Contains(","+*only+",", ","+p+",") }

	fmt.Printf("paybench: %d CPUs, %s, %s\n", runtime.NumCPU(), runtime.Version(), serverVersions())
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	row := func(name string, rate float64, rest string) {
		fmt.Fprintf(tw, "%s\t%.0f msg/s\t%s\n", name, rate, rest)
		tw.Flush()
	}
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "paybench: %v\n", err)
		os.Exit(1)
	}

	if *largeDrop {
		if err := dropSeeded(ctx, o.mysqlDSN, lo.small.DB, lo.large.DB); err != nil {
			fail(err)
		}
		return
	}
	if strings.Contains(","+*only+",", ",large,") {
		if err := large(ctx, o, lo); err != nil {
			fail(err)
		}
		return
	}
	if strings.Contains(","+*only+",", ",pairs,") {
		if err := pairs(ctx, o, *rounds, pairEnv, *pairBinary); err != nil {
			fail(err)
		}
	}
	if strings.Contains(","+*only+",", ",trace,") {
		modes, err := traceModes(*traceFlag)
		if err != nil {
			fail(err)
		}
		if err := traceCost(ctx, o, modes, *rounds, row); err != nil {
			fail(err)
		}
	}
	if strings.Contains(","+*only+",", ",daemon,") {
		m, err := measureDaemon(ctx, o, o.n, 0)
		if err != nil {
			fail(err)
		}
		row(fmt.Sprintf("paysvc daemon (defaults), %d msgs, %.0f%% dup", m.msgs, o.dup*100), m.rate,
			m.cost.String())
	}
	if want("compare") {
		if err := compare(ctx, o, *rounds, row); err != nil {
			fail(err)
		}
	}
	var ceiling, txBest float64
	if want("ceilings") {
		for _, conc := range []int{16, 32, 64} {
			rate, err := mysqlCeiling(ctx, o, conc, o.n, false)
			if err != nil {
				fail(err)
			}
			row(fmt.Sprintf("ceiling: payment tx, plain Go, %d conns", conc), rate, "one statement per round trip")
			txBest = max(txBest, rate)
		}
		chainedRate, err := mysqlCeiling(ctx, o, 16, o.n, true)
		if err != nil {
			fail(err)
		}
		row("payment tx chained (paysvc's), plain Go, 16 conns", chainedRate, "2 round trips")
		if want("grouped") {
			for _, g := range []int{10} {
				rate, err := groupedCeiling(ctx, o, 16, g, o.n)
				if err != nil {
					fail(err)
				}
				row(fmt.Sprintf("payments %d per transaction, plain Go, 16 conns", g), rate,
					fmt.Sprintf("%.2fx the best one-per-transaction ceiling", rate/txBest))
			}
		}
		amqpRate, err := rabbitCeiling(ctx, o, o.n, 64)
		if err != nil {
			fail(err)
		}
		row("ceiling: RabbitMQ deliver+ack, no work", amqpRate, "")
		redisRate, err := redisCeiling(ctx, o, 64, o.n*2)
		if err != nil {
			fail(err)
		}
		row("ceiling: Redis SET NX, 64 conns", redisRate, "")
		ceiling = min(txBest, amqpRate, redisRate)
	}
	var peak, articleRate float64
	if want("default") {
		r, err := drain(ctx, o, "default", o.defaults, o.n, o.dup, 0)
		if err != nil {
			fail(err)
		}
		peak = r.rate
		row(fmt.Sprintf("paysvc default (%d workers, prefetch %d, %d conns, groups of %d on %d), %d msgs, %.0f%% dup",
			o.defaults.workers, o.defaults.prefetch, o.defaults.maxOpen, o.defaults.groupSize, o.defaults.groupConns, r.msgs, o.dup*100), r.rate,
			describe(r)+fraction(r.rate, ceiling))
	}
	if want("article") {
		r, err := drain(ctx, o, "article", consumerConfig{workers: 1, prefetch: 10, maxOpen: 4, groupSize: o.defaults.groupSize, groupConns: 1}, o.n/4, o.dup, 0)
		if err != nil {
			fail(err)
		}
		extra := ""
		if peak > 0 {
			extra = fmt.Sprintf("; default is %.1fx this", peak/r.rate)
		}
		row("article config (1 worker, prefetch 10)", r.rate, describe(r)+extra)
		articleRate = r.rate
	}
	if *rounds > 1 && txBest > 0 && peak > 0 && articleRate > 0 {
		if err := repeat(ctx, o, *rounds, round{txBest, peak, articleRate}, row); err != nil {
			fail(err)
		}
	}
	if want("hot") {
		r, err := drain(ctx, o, "hot", o.defaults, o.n/2, o.dup, 1.0)
		if err != nil {
			fail(err)
		}
		row(fmt.Sprintf("hot accounts: all payments on %d users", o.hotUsers), r.rate, describe(r))
	}
	if want("open") {
		rate := peak / 2
		switch {
		case *openRate > 0:
			rate = *openRate
		case rate == 0:
			rate = 500
		}
		lat, err := openLoop(ctx, o, rate, 10*time.Second, *openDaemon)
		if err != nil {
			fail(err)
		}
		row(fmt.Sprintf("open loop at %.0f msg/s (half the peak), publish→payment", rate), rate,
			fmt.Sprintf("p50 %s  p99 %s  p99.9 %s; handling (delivery to ack) p99 %s; %s", ms(lat.p50), ms(lat.p99), ms(lat.p999), ms(lat.handlingP99), lat.worst+"; "+lat.redo))
	}
}

func describe(r run) string {
	return fmt.Sprintf("handling p50 %s  p99 %s  p99.9 %s; %.2f CPU s/1k msgs; peak heap %.0f MiB; %.0f tx retries",
		ms(r.p50), ms(r.p99), ms(r.p999), r.cpuPer1k, r.peakHeapMiB, r.txRetries)
}

func fraction(rate, ceiling float64) string {
	if ceiling == 0 {
		return ""
	}
	return fmt.Sprintf("; %.2fx the lowest ceiling", rate/ceiling)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

func serverVersions() string {
	var parts []string
	if out, err := exec.Command("mariadbd", "--version").Output(); err == nil {
		parts = append(parts, strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		f := strings.Fields(string(out))
		if len(f) > 2 {
			parts = append(parts, "Redis "+strings.TrimPrefix(f[2], "v="))
		}
	}
	return strings.Join(parts, "; ")
}

// round is one interleaved measurement of the figures the targets compare.
type round struct{ ceiling, paysvc, article float64 }

// repeat measures n-1 more rounds after first, each the per-payment ceiling
// (best of 16 and 32 connections), paysvc's defaults, the article's
// configuration and an open loop at half that round's peak back to back,
// and prints the medians: on a shared machine a
// single pass can land its phases in different weather.
func repeat(ctx context.Context, o *options, n int, first round, row func(string, float64, string)) error {
	rs := []round{first}
	var openP99 []time.Duration
	for i := 2; i <= n; i++ {
		var r round
		for _, conc := range []int{16, 32} {
			rate, err := mysqlCeiling(ctx, o, conc, o.n/2, false)
			if err != nil {
				return err
			}
			r.ceiling = max(r.ceiling, rate)
		}
		d, err := drain(ctx, o, "default", o.defaults, o.n/2, o.dup, 0)
		if err != nil {
			return err
		}
		a, err := drain(ctx, o, "article", consumerConfig{workers: 1, prefetch: 10, maxOpen: 4, groupSize: o.defaults.groupSize, groupConns: 1}, o.n/8, o.dup, 0)
		if err != nil {
			return err
		}
		r.paysvc, r.article = d.rate, a.rate
		// Half of this round's peak, right after it was measured.
		lat, err := openLoop(ctx, o, r.paysvc/2, 10*time.Second, false)
		if err != nil {
			return err
		}
		p99 := lat.p99
		openP99 = append(openP99, p99)
		row(fmt.Sprintf("round %d: ceiling %.0f, article %.0f; paysvc", i, r.ceiling, r.article), r.paysvc,
			fmt.Sprintf("%.2fx the ceiling, %.1fx the article config; open loop at %.0f msg/s: publish→payment p99 %s",
				r.paysvc/r.ceiling, r.paysvc/r.article, r.paysvc/2, ms(p99)))
		rs = append(rs, r)
	}
	slices.Sort(openP99)
	med := func(f func(round) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	row(fmt.Sprintf("median of %d rounds: ceiling %.0f, article %.0f; paysvc", len(rs), med(func(r round) float64 { return r.ceiling }),
		med(func(r round) float64 { return r.article })), med(func(r round) float64 { return r.paysvc }),
		fmt.Sprintf("%.2fx the ceiling, %.1fx the article config (medians of the per-round ratios)",
			med(func(r round) float64 { return r.paysvc / r.ceiling }), med(func(r round) float64 { return r.paysvc / r.article })))
	row(fmt.Sprintf("open loop at half of each round's peak (rounds 2-%d, median rate)", n), med(func(r round) float64 { return r.paysvc / 2 }),
		fmt.Sprintf("publish→payment p99: median %s, best %s, worst %s", ms(openP99[len(openP99)/2]), ms(openP99[0]), ms(openP99[len(openP99)-1])))
	return nil
}
