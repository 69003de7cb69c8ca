// Command paychaos runs the real paysvc binary (several instances, built with
// the faultinject tag) against the real servers while it injects faults, then
// checks the money invariants:
//
//   - one-flow:   at most one PAY_DEDUCT flow per order; PAID ⇔ exactly one,
//     with the order's amount and user;
//   - balances:   every balance = opening balance + its flows, never negative;
//   - accounted:  every confirmed-published payment is applied, recognised as a
//     duplicate, or parked as a dead letter with a reason; main, wait and
//     terminal queues empty with the instances stopped (nothing unacked);
//   - redis-done: a Redis "done" key implies the payment is applied;
//   - drained:    with the instances stopped, every paysvc queue holds
//     nothing at all (rabbitmqctl's total, which counts what a quorum queue
//     holds for its dead-letter worker, not only ready and unacked).
//
// Usage:
//
//	paychaos [-binary bin/paysvc-faultinject] [-only a,b] [-seed N]      the suite (make chaos)
//	paychaos -soak -seed N -duration 10m                                  a seeded random mix (make soak)
//	paychaos -mutation NAME [-only a,b]                                   the suite against a deliberately broken build (mutants.go)
//
// It prints a table and, last, "N passed, M failed"; the exit status is 1 if
// any scenario failed.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// noFault is a demonstration switch (see the flag).
var noFault bool

// spread is how long the published load of a scenario is spread over, so
// that every fault meets work in progress.
const spread = 4 * time.Second

type result struct {
	name, faults string
	injected     int
	msgs, dups   int
	outcomes     map[string]int
	parked       int
	restarts     int
	notes        []string // what the scenario measured
	settled      bool
	clean        bool
	invariants   []invariant
	err          error
}

func (r result) passed() bool {
	if r.err != nil || !r.settled || !r.clean {
		return false
	}
	for _, inv := range r.invariants {
		if !inv.ok {
			return false
		}
	}
	return true
}

func main() { os.Exit(suite()) }

// suite runs what the flags ask and returns the exit status; every server
// and process it started is stopped before it returns.
func suite() int {
	binary := flag.String("binary", "bin/paysvc-faultinject", "paysvc built with -tags faultinject")
	only := flag.String("only", "", "comma-separated scenario names (default: all)")
	seed := flag.Uint64("seed", 0, "random seed (0: from the clock)")
	soak := flag.Bool("soak", false, "run a seeded random mix of every fault instead of the suite")
	clusterMode := flag.Bool("cluster", false, "run the cluster suite: a 3-node RabbitMQ cluster, Redis with Sentinel, a MariaDB of its own and a 3-node Galera cluster behind HAProxy, on loopback ports of their own (root)")
	duration := flag.Duration("duration", 10*time.Minute, "soak duration")
	orders := flag.Int("orders", 240, "orders per scenario")
	logDir := flag.String("logs", "tmp/chaos", "where instance logs go")
	mutation := flag.String("mutation", "", "build paysvc with this deliberate defect (mutants.go) from -source and run against it instead of -binary, to see the suite fail")
	source := flag.String("source", ".", "the paysvc source tree (module root) a -mutation build patches a copy of")
	flag.BoolVar(&noFault, "no-fault", false, "inject nothing (crash points included): to see the evidence checks fail")
	flag.Parse()
	zerolog.SetGlobalLevel(zerolog.Disabled)    // toxiproxy's own logging
	mysql.SetLogger(log.New(io.Discard, "", 0)) // "closing bad idle connection" after the kills we make
	redis.SetLogger(discard{})                  // go-redis's Sentinel chatter during the failovers we make
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	srv := servers{
		mysqlDSN:  env("PAYSVC_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/"),
		amqpURL:   env("PAYSVC_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		redisAddr: env("PAYSVC_TEST_REDIS_ADDR", "127.0.0.1:6379"),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *mutation != "" {
		dir, err := os.MkdirTemp("", "paychaos-mutant-bin-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "paychaos: %v\n", err)
			return 2
		}
		defer os.RemoveAll(dir)
		*binary = filepath.Join(dir, "paysvc-"+*mutation)
		m, err := buildMutant(ctx, *source, *mutation, *binary)
		if err != nil {
			fmt.Fprintf(os.Stderr, "paychaos: %v\n", err)
			return 2
		}
		fmt.Printf("paychaos mutation=%s: %s\n", m.name, m.breaks)
	}
	if abs, err := filepath.Abs(*binary); err == nil {
		*binary = abs
	}
	if _, err := os.Stat(*binary); err != nil {
		fmt.Fprintf(os.Stderr, "paychaos: %v (build it: make chaos)\n", err)
		return 2
	}
	fmt.Printf("paychaos seed=%d\n", *seed)

	var results []result
	suite := scenarios
	worldFor := func(ctx context.Context, name string, delays []time.Duration) (*world, error) {
		return newWorld(ctx, name, delays, srv, *binary, *logDir)
	}
	if *clusterMode {
		dir, err := os.MkdirTemp("", "paychaos-cluster-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "paychaos: %v\n", err)
			return 2
		}
		started := time.Now()
		c, err := startCluster(ctx, dir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "paychaos: cluster: %v\n", err)
			return 2
		}
		defer c.close()
		fmt.Printf("cluster up in %s: RabbitMQ %v, Redis %d/%d + Sentinels %v, MariaDB %d\n",
			time.Since(started).Round(100*time.Millisecond), c.nodeNames(), c.redis[0].port, c.redis[1].port,
			c.sentinelAddrs(), c.mysqlPort)
		var gs galeraSuite // started by the first Galera scenario
		defer gs.close()
		var pairs failoverPairs // a primary and its replica per failover scenario
		defer pairs.close()
		suite = append(append(append([]scenario{}, clusterScenarios...), galeraSuiteScenarios()...), failoverScenarios...)
		worldFor = func(ctx context.Context, name string, delays []time.Duration) (*world, error) {
			if err := c.heal(ctx); err != nil {
				return nil, err
			}
			if s, ok := galeraScenarioNamed(name); ok {
				g, err := gs.get(ctx, c)
				if err != nil {
					return nil, fmt.Errorf("galera: %w", err)
				}
				return newGaleraWorld(ctx, name, c, g, s, *binary, *logDir)
			}
			if isFailoverScenario(name) {
				p, err := pairs.start(ctx, c)
				if err != nil {
					return nil, fmt.Errorf("failover: %w", err)
				}
				return newFailoverWorld(ctx, name, delays, c, p, *binary, *logDir)
			}
			return newClusterWorld(ctx, name, delays, c, *binary, *logDir)
		}
	}
	if *soak {
		results = append(results, runSoak(ctx, srv, *binary, *logDir, *seed, *duration))
	} else {
		for i, s := range suite {
			if *only != "" && !contains(strings.Split(*only, ","), s.name) || *only == "" && s.optIn {
				continue
			}
			r := runScenario(ctx, s, i, worldFor, *seed, *orders)
			fmt.Printf("%-26s %s\n", s.name, verdict(r))
			results = append(results, r)
			if ctx.Err() != nil {
				break
			}
		}
	}
	report(results)
	for _, r := range results {
		if !r.passed() {
			return 1
		}
	}
	return 0
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func verdict(r result) string {
	if r.passed() {
		return "pass"
	}
	return "FAIL"
}

func hash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func runScenario(ctx context.Context, s scenario, idx int, worldFor func(context.Context, string, []time.Duration) (*world, error), seed uint64, orders int) (r result) {
	r = result{name: s.name, faults: s.faults}
	rng := rand.New(rand.NewPCG(seed, hash(s.name)))
	w, err := worldFor(ctx, s.name, s.delays)
	if err != nil {
		r.err = err
		return r
	}
	defer w.close()
	w.maxAttempts = s.maxAttempts
	s = s.bind(w)
	copies := s.dupCopies
	if copies == 0 {
		copies = 1
	}
	share := 0.3
	if s.storm {
		share = 1
	}
	wl := newWorkload(rng, fmt.Sprintf("C%02d", idx), orders, share, copies)
	if s.shape != nil {
		s.shape(wl)
	}
	w.workload = wl
	r.msgs, r.dups = len(wl.messages), wl.dups
	if r.err = w.seed(ctx, wl); r.err != nil {
		return r
	}
	// A quarter waits in the queue at start; the rest comes while the
	// fault is injected, spread over a few seconds.
	head := len(wl.messages) / 4
	if s.storm {
		head = 0
	}
	if _, r.err = w.publish(ctx, wl.messages[:head], wl.headers, 2, 0); r.err != nil {
		return r
	}
	crash := s.crash
	if noFault {
		crash, s.inject = nil, nil
	}
	if r.err = w.startInstances(3, crash); r.err != nil {
		return r
	}
	var wg sync.WaitGroup
	var injectErr error
	rest := wl.messages[head:]
	publishers, pace := 2, 2*cmp.Or(s.spread, spread)/time.Duration(len(rest)+1)
	if s.storm {
		publishers, pace = 3, 0
	}
	wg.Go(func() { _, injectErr = w.publish(ctx, rest, wl.headers, publishers, pace) })
	// The late orders come 1.5 s into the load, or, for a scenario that
	// holds them, once its fault is over: their payments retry meanwhile.
	late := make(chan struct{})
	if !s.holdLate {
		time.AfterFunc(1500*time.Millisecond, func() { close(late) })
	}
	wg.Go(func() { lateOrders(ctx, w, wl, late) })
	if s.inject != nil {
		r.injected, r.err = s.inject(ctx, w, rng)
	} else if len(s.crash) > 0 {
		r.injected = 1
	}
	if s.holdLate {
		close(late)
	}
	wg.Wait()
	if r.err == nil {
		r.err = injectErr
	}
	r.settled = w.waitSettled(ctx, wl, s.latePark, 120*time.Second)
	r.restarts = w.restarts()
	allowed := map[string]bool{}
	if len(crash) > 0 {
		allowed[syscall.SIGKILL.String()] = true
	}
	unexpected := w.unexpectedExits(allowed)
	r.clean = w.stopAll(drainBound)
	r.outcomes = w.outcomes()
	w.db.GetContext(ctx, &r.parked, "SELECT COUNT(*) FROM t_dead_letter")
	r.invariants = w.check(ctx, wl, s.latePark)
	r.invariants = append(r.invariants, invariant{name: "exits", ok: len(unexpected) == 0,
		detail: fmt.Sprintf("unexpected exits: %v", unexpected)})
	if s.verify != nil {
		ok, detail := s.verify(ctx, w, wl)
		r.invariants = append(r.invariants, invariant{name: "evidence", ok: ok, detail: detail})
	}
	r.notes = w.notes
	if len(crash) > 0 && w.killedExits() == 0 {
		r.err = fmt.Errorf("the crash point never fired (no instance died of SIGKILL)")
	}
	return r
}

// lateOrders creates the late orders after their payments were published,
// once ready is closed, each until it is in (MySQL may be down at that
// moment).
func lateOrders(ctx context.Context, w *world, wl *workload, ready <-chan struct{}) {
	select {
	case <-ctx.Done():
		return
	case <-ready:
	}
	for _, o := range wl.late {
		for w.insertOrder(ctx, o) != nil && !isDuplicate(w, o) {
			if !at(ctx, 200*time.Millisecond) {
				return
			}
		}
	}
}

// isDuplicate reports whether o exists already (an insert whose reply was lost).
func isDuplicate(w *world, o order) bool {
	var n int
	return w.db.Get(&n, "SELECT COUNT(*) FROM t_order WHERE order_no = ?", o.no) == nil && n == 1
}

// runSoak publishes batches and injects random faults from every scenario
// for d, all drawn from seed, then drains and checks.
func runSoak(ctx context.Context, srv servers, binary, logDir string, seed uint64, d time.Duration) (r result) {
	r = result{name: "soak", faults: fmt.Sprintf("random mix, seed %d, %s", seed, d)}
	rng := rand.New(rand.NewPCG(seed, 1))
	w, err := newWorld(ctx, "soak", nil, srv, binary, logDir)
	if err != nil {
		r.err = err
		return r
	}
	defer w.close()
	if r.err = w.startInstances(3, nil); r.err != nil {
		return r
	}
	var pool []scenario
	for _, s := range scenarios {
		if s.inject != nil {
			pool = append(pool, s.bind(w))
		}
	}
	all := &workload{late: map[string]order{}, orders: map[string]order{}}
	batches := int(d / (2 * time.Second))
	plans := make([]*workload, batches)
	for i := range plans {
		plans[i] = newWorkload(rng, fmt.Sprintf("S%04d", i), 60, 0.3, 1+rng.IntN(3))
	}
	faultSeeds := make([]uint64, 10000)
	for i := range faultSeeds {
		faultSeeds[i] = rng.Uint64()
	}
	soakCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for i, wl := range plans {
			if soakCtx.Err() != nil {
				break
			}
			if err := w.seed(ctx, wl); err != nil {
				r.err = fmt.Errorf("batch %d: seed: %w", i, err)
				return
			}
			if _, err := w.publish(ctx, wl.messages, wl.headers, 2, 0); err != nil {
				r.err = fmt.Errorf("batch %d: publish: %w", i, err)
				return
			}
			all.merge(wl)
			r.msgs += len(wl.messages)
			r.dups += wl.dups
			late := make(chan struct{})
			time.AfterFunc(1500*time.Millisecond, func() { close(late) })
			go lateOrders(ctx, w, wl, late)
			at(soakCtx, 2*time.Second)
		}
	})
	wg.Go(func() {
		for i := 0; soakCtx.Err() == nil; i++ {
			frng := rand.New(rand.NewPCG(faultSeeds[i%len(faultSeeds)], 2))
			s := pool[frng.IntN(len(pool))]
			if frng.IntN(4) == 0 { // a hard crash of a random instance
				w.signal(frng.IntN(3), syscall.SIGKILL)
			} else if n, err := s.inject(soakCtx, w, frng); err == nil {
				r.injected += n
			}
			at(soakCtx, time.Duration(500+frng.IntN(1500))*time.Millisecond)
		}
	})
	wg.Wait()
	r.settled = w.waitSettled(ctx, all, false, 180*time.Second)
	r.restarts = w.restarts()
	unexpected := w.unexpectedExits(map[string]bool{syscall.SIGKILL.String(): true})
	r.clean = w.stopAll(drainBound)
	r.outcomes = w.outcomes()
	w.db.GetContext(ctx, &r.parked, "SELECT COUNT(*) FROM t_dead_letter")
	r.invariants = w.check(ctx, all, false)
	r.invariants = append(r.invariants, invariant{name: "exits", ok: len(unexpected) == 0,
		detail: fmt.Sprintf("unexpected exits: %v", unexpected)})
	return r
}

func (a *workload) merge(b *workload) {
	a.payable = append(a.payable, b.payable...)
	a.terminal = append(a.terminal, b.terminal...)
	a.poison = append(a.poison, b.poison...)
	for k, v := range b.orders {
		a.orders[k] = v
	}
	for k, v := range b.late {
		a.late[k] = v
	}
}

func report(results []result) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nSCENARIO\tFAULTS INJECTED\tMSGS\tDUP COPIES\tFIRST\tDUPLICATE\tPARKED\tRESTARTS\tone-flow\tbalances\taccounted\tredis-done\tdrained\texits\tevidence\tRESULT")
	passed, failed := 0, 0
	var problems []string
	for _, r := range results {
		cells := []string{}
		for _, inv := range r.invariants {
			cells = append(cells, map[bool]string{true: "ok", false: "VIOLATED"}[inv.ok])
			if !inv.ok {
				problems = append(problems, fmt.Sprintf("%s %s: %s", r.name, inv.name, inv.detail))
			}
		}
		for len(cells) < 7 {
			cells = append(cells, "-")
		}
		if r.err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", r.name, r.err))
		}
		if !r.settled {
			problems = append(problems, r.name+": did not settle (queues or expected end states) before the deadline")
		}
		if !r.clean {
			problems = append(problems, r.name+": an instance did not exit 0 on SIGTERM")
		}
		res := "pass"
		if r.passed() {
			passed++
		} else {
			failed++
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%d× %s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", r.name, r.injected, r.faults, r.msgs, r.dups,
			r.outcomes["FIRST"], r.outcomes["DUPLICATE"], r.parked, r.restarts, strings.Join(cells, "\t"), res)
	}
	tw.Flush()
	for _, r := range results {
		for _, inv := range r.invariants {
			if inv.name == "evidence" && inv.ok {
				r.notes = append(r.notes, inv.detail)
			}
		}
		if len(r.notes) > 0 {
			fmt.Printf("  %s: %s\n", r.name, strings.Join(r.notes, "; "))
		}
	}
	for _, p := range problems {
		fmt.Println("  " + p)
	}
	fmt.Printf("%d passed, %d failed\n", passed, failed)
}

// discard is a go-redis logger that says nothing.
type discard struct{}

func (discard) Printf(context.Context, string, ...any) {}
