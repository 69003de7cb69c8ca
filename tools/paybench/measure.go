package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/scratch"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/timeline"
)

// mysqlCeiling runs the payment transaction from plain Go at concurrency conc
// over n fresh orders: one statement per round trip as a plain program writes
// it (plainPay in a transaction), or, chained, paysvc's own order.Store.Pay.
func mysqlCeiling(ctx context.Context, o *options, conc, n int, chained bool) (float64, error) {
	return parallelPayments(ctx, o, fmt.Sprintf("tx%d", conc), conc, n, 1, func(db *sqlx.DB, batch []payment) error {
		pay := batch[0].payment()
		if chained {
			return order.NewStore(db).Pay(ctx, pay)
		}
		return sqldb.InTx(ctx, db, func(tx *sqldb.Tx) error { return plainPay(ctx, tx, pay) })
	})
}

// groupedCeiling runs the same payments `group` per transaction (plain Go,
// conc connections): what grouping would buy. Each group takes its locks in
// (user, order) order so that groups do not deadlock each other; the rare
// deadlock retries the group whole.
func groupedCeiling(ctx context.Context, o *options, conc, group, n int) (float64, error) {
	var retried atomic.Int64
	rate, err := parallelPayments(ctx, o, fmt.Sprintf("group%d", group), conc, n, group, func(db *sqlx.DB, batch []payment) error {
		sort.Slice(batch, func(i, j int) bool {
			return batch[i].user < batch[j].user || batch[i].user == batch[j].user && batch[i].orderNo < batch[j].orderNo
		})
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			err = sqldb.InTx(ctx, db, func(tx *sqldb.Tx) error {
				for _, p := range batch {
					if err := plainPay(ctx, tx, p.payment()); err != nil {
						return err
					}
				}
				return nil
			})
			if err == nil || !sqldb.Transient(err) {
				return err
			}
			retried.Add(1)
		}
		return err
	})
	fmt.Printf("  (%d groups of %d retried after a deadlock or lock wait)\n", retried.Load(), group)
	return rate, err
}

// parallelPayments seeds n orders in a bed of their own and runs do over
// them in batches of `group` from conc goroutines with a pool of conc
// connections; it returns payments per second.
func parallelPayments(ctx context.Context, o *options, name string, conc, n, group int,
	do func(db *sqlx.DB, batch []payment) error) (float64, error) {
	b, err := newBed(ctx, o, name)
	if err != nil {
		return 0, err
	}
	defer b.close()
	pays, err := b.seed(ctx, n, o.users, 0, 0)
	if err != nil {
		return 0, err
	}
	db, err := sqldb.Open(ctx, b.DSN, conc)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var next, failed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				lo := int(next.Add(int64(group))) - group
				if lo >= n {
					return
				}
				if err := do(db, append([]payment(nil), pays[lo:min(lo+group, n)]...)); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("%s: %d batches failed", name, f)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// rabbitCeiling delivers and acks n persistent messages with no work.
func rabbitCeiling(ctx context.Context, o *options, n, prefetch int) (float64, error) {
	b, err := newBed(ctx, o, "amqp")
	if err != nil {
		return 0, err
	}
	defer b.close()
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = payment{orderNo: fmt.Sprintf("R%08d", i), user: 1, amount: 100}.body()
	}
	if err := b.preload(bodies); err != nil {
		return 0, err
	}
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	ch.Qos(prefetch, 0, false)
	ds, err := ch.Consume(listener.MainQueue, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		d := <-ds
		if err := d.Ack(false); err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// redisCeiling runs n SET NX PX round trips at concurrency conc.
func redisCeiling(ctx context.Context, o *options, conc, n int) (float64, error) {
	rdb := redis.NewClient(&redis.Options{Addr: o.redisAddr, PoolSize: conc})
	defer rdb.Close()
	prefix := fmt.Sprintf("bench_redis_%x:", rand.Uint32())
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				rdb.SetNX(ctx, fmt.Sprintf("%s%d", prefix, i), "1", time.Minute)
			}
		})
	}
	wg.Wait()
	rate := float64(n) / time.Since(start).Seconds()
	scratch.DeleteKeys(ctx, rdb, prefix)
	return rate, nil
}

// run is one measured paysvc drain.
type run struct {
	msgs        int
	rate        float64
	cpuPer1k    float64 // CPU seconds per 1,000 messages (this process: consumer and bench)
	peakHeapMiB float64
	p50, p99    time.Duration
	p999        time.Duration
	txRetries   float64 // paysvc_tx_retries_total: deadlocks, lock wait timeouts
}

// recorder captures the "duration" of every "message handled" log entry.
type recorder struct {
	zapcore.LevelEnabler
	mu   sync.Mutex
	durs []time.Duration
}

func (r *recorder) With([]zapcore.Field) zapcore.Core { return r }
func (r *recorder) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "message handled" || e.Message == "outcome not acknowledged" {
		return ce.AddCore(e, r)
	}
	return ce
}
func (r *recorder) Write(e zapcore.Entry, fields []zapcore.Field) error {
	for _, f := range fields {
		if f.Key == "duration" {
			r.mu.Lock()
			r.durs = append(r.durs, time.Duration(f.Integer))
			r.mu.Unlock()
		}
	}
	return nil
}
func (r *recorder) Sync() error { return nil }
func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.durs)
}

type consumerConfig struct {
	workers, prefetch, maxOpen int
	groupSize, groupConns      int // mysql.groupSize, mysql.groupConns
}

// startConsumer runs paysvc's consumer in this process with the daemon's
// wiring; stop drains it.
func startConsumer(ctx context.Context, b *bed, o *options, cc consumerConfig, rec *recorder, m *metrics.Metrics) (stop func(), err error) {
	db, err := sqldb.Open(ctx, b.DSN, cc.maxOpen)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{o.redisAddr},
		DialTimeout: 2 * time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: cc.workers + 4})
	guard := idem.New(rdb, idem.Config{KeyPrefix: b.prefix, TTL: 24 * time.Hour, Lease: 60 * time.Second})
	stopPipe := func() {}
	if !o.noPipeline {
		stopPipe = guard.StartPipeline(2, 64) // as the daemon does
	}
	log := zap.New(rec)
	orders := order.NewStore(db)
	orders.OnRetry = func(error) { m.TxRetries.Inc() }
	events := &timeline.Recorder{DB: db, Instance: "paybench"}
	stopEvents := events.Start(2, 64) // as the daemon does
	grouper := orders.StartGrouper(cc.groupConns, cc.groupSize, func(n int) { m.GroupSize.Observe(float64(n)) })
	c := listener.New(listener.Config{
		URL: b.amqpURL, ConnectionName: "paybench", Prefetch: cc.prefetch, Workers: cc.workers,
		Retry:         listener.RetryPolicy{Delays: delays, MaxAttempts: 5},
		RedisFallback: listener.FallbackClosed, HandleTimeout: 30 * time.Second, DrainTimeout: 30 * time.Second,
		PublishTimeout: 10 * time.Second, MaxBackoff: 15 * time.Second, Metrics: m,
		Events: events,
	}, orders, grouper, guard, log)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	return func() {
		cancel()
		<-done
		grouper.Stop()
		stopPipe()
		stopEvents()
		rdb.Close()
		db.Close()
	}, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// drain preloads n orders (plus duplicates) and measures paysvc draining them.
func drain(ctx context.Context, o *options, name string, cc consumerConfig, n int, dup, hot float64) (run, error) {
	var r run
	b, err := newBed(ctx, o, name)
	if err != nil {
		return r, err
	}
	defer b.close()
	pays, err := b.seed(ctx, n, o.users, hot, o.hotUsers)
	if err != nil {
		return r, err
	}
	var bodies [][]byte
	for _, p := range pays {
		bodies = append(bodies, p.body())
		if rand.Float64() < dup {
			bodies = append(bodies, p.body())
		}
	}
	rand.Shuffle(len(bodies), func(i, j int) { bodies[i], bodies[j] = bodies[j], bodies[i] })
	if err := b.preload(bodies); err != nil {
		return r, err
	}
	// Latencies go into a slice allocated up front, so that the heap the run
	// reports is paysvc's, not a growing slice of the bench's.
	rec := &recorder{LevelEnabler: zapcore.InfoLevel, durs: make([]time.Duration, 0, len(bodies)+len(bodies)/10)}
	runtime.GC()
	if o.cpuProfile != "" && name == "default" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return r, err
		}
		pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	cpu0, start := cpuTime(), time.Now()
	m := metrics.New()
	stop, err := startConsumer(ctx, b, o, cc, rec, m)
	if err != nil {
		return r, err
	}
	var peak uint64
	deadline := time.Now().Add(time.Duration(len(bodies)/50+60) * time.Second)
	nextReport := len(bodies) / 10
	for rec.count() < len(bodies) {
		if o.heapTrace && rec.count() >= nextReport {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fmt.Printf("  %s: %d of %d handled, heap in use %.1f MiB, %d goroutines\n", name, rec.count(), len(bodies),
				float64(ms.HeapInuse)/(1<<20), runtime.NumGoroutine())
			nextReport += len(bodies) / 10
		}
		if time.Now().After(deadline) {
			stop()
			return r, fmt.Errorf("%s: %d of %d handled before the deadline", name, rec.count(), len(bodies))
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
		time.Sleep(50 * time.Millisecond)
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	stop()
	r.msgs = len(bodies)
	r.rate = float64(len(bodies)) / elapsed.Seconds()
	r.cpuPer1k = cpu.Seconds() / float64(len(bodies)) * 1000
	r.peakHeapMiB = float64(peak) / (1 << 20)
	r.p50, r.p99, r.p999 = percentiles(rec.durs)
	r.txRetries = testutil.ToFloat64(m.TxRetries)
	var paid int
	b.DB.GetContext(ctx, &paid, "SELECT COUNT(*) FROM t_order WHERE status = 'PAID'")
	if paid != n {
		return r, fmt.Errorf("%s: %d of %d orders paid", name, paid, n)
	}
	return r, nil
}

func percentiles(ds []time.Duration) (p50, p99, p999 time.Duration) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	at := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	return at(.50), at(.99), at(.999)
}

// latencies are an open loop's publish→payment percentiles, and the
// handling (delivery to ack) p99 when the consumer ran in process.
type latencies struct {
	p50, p99, p999, handlingP99 time.Duration
	// worst is the second of the run (by publish time) whose payments
	// waited longest: where a stall was, for whoever reads a bad p99.
	worst string
	// redo is InnoDB's checkpoint age when the loop started (redoState).
	redo string
}

// redoState says how much redo InnoDB had still to checkpoint when the
// loop started, of its maximum. Whatever ran before (the seeding, earlier
// rounds) leaves redo to checkpoint, and near InnoDB's flush points every
// writer waits on page flushes: with this machine's 96 MiB redo log and
// io_capacity 200 that is a stall of a second or more, which lands in the
// loop at a second that depends on what ran before it (read it next to the
// worst second).
func redoState(ctx context.Context, db *sqlx.DB) string {
	var age, maxAge int64
	var name string
	if db.QueryRowxContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_checkpoint_age'").Scan(&name, &age) != nil ||
		db.QueryRowxContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_checkpoint_max_age'").Scan(&name, &maxAge) != nil {
		return "InnoDB checkpoint age unknown"
	}
	return fmt.Sprintf("InnoDB checkpoint age at the start %d of %d MiB", age>>20, maxAge>>20)
}

// worstSecond names the second after start whose messages waited longest
// (by their publish time), with how many of them waited over 50 ms.
func worstSecond(start time.Time, sent []time.Time, lat []time.Duration) string {
	type bucket struct {
		max  time.Duration
		slow int
	}
	buckets := map[int]*bucket{}
	worst := -1
	for i, at := range sent {
		sec := int(at.Sub(start) / time.Second)
		b := buckets[sec]
		if b == nil {
			b = &bucket{}
			buckets[sec] = b
		}
		b.max = max(b.max, lat[i])
		if lat[i] > 50*time.Millisecond {
			b.slow++
		}
		if worst < 0 || b.max > buckets[worst].max {
			worst = sec
		}
	}
	if worst < 0 {
		return ""
	}
	slow := make([]string, 0, len(buckets))
	for sec := 0; sec < len(buckets); sec++ {
		if b := buckets[sec]; b != nil {
			slow = append(slow, strconv.Itoa(b.slow))
		}
	}
	return fmt.Sprintf("worst second +%ds (%s UTC): max %s, %d payments over 50ms; over 50ms per second: %s", worst,
		start.Add(time.Duration(worst)*time.Second).UTC().Format("15:04:05"), ms(buckets[worst].max), buckets[worst].slow,
		strings.Join(slow, " "))
}

// openLoop publishes payments at a fixed rate for d into a consumer started
// for it (the real daemon, or paysvc's consumer in this process, wired as
// the daemon is) and times each from its publish to its payment's UPDATE
// (pay_time).
func openLoop(ctx context.Context, o *options, rate float64, d time.Duration, useDaemon bool) (lat latencies, err error) {
	var start time.Time
	b, err := newBed(ctx, o, "open")
	if err != nil {
		return
	}
	defer b.close()
	n := int(rate * d.Seconds())
	pays, err := b.seed(ctx, n, o.users, 0, 0)
	if err != nil {
		return
	}
	rec := &recorder{LevelEnabler: zapcore.InfoLevel}
	if useDaemon {
		var dm *daemon
		if dm, err = startDaemon(o, b, o.paysvcEnv); err != nil {
			return
		}
		defer func() {
			keep := err != nil || o.openDump != ""
			dm.stop(keep)
			if o.openDump != "" {
				os.Rename(dm.logPath, filepath.Join(o.openDump, fmt.Sprintf("open-%s.log", start.UTC().Format("150405"))))
			}
		}()
		// Timed from the moment it consumes (/readyz 200), not from its
		// start-up: messages published before would wait for the daemon
		// to start, not for paysvc to pay them.
		deadline := time.Now().Add(30 * time.Second)
		for !dm.ready() {
			if time.Now().After(deadline) {
				return lat, fmt.Errorf("open loop: the daemon never became ready (log %s)", dm.logPath)
			}
			time.Sleep(50 * time.Millisecond)
		}
	} else {
		var stop func()
		if stop, err = startConsumer(ctx, b, o, o.defaults, rec, metrics.New()); err != nil {
			return
		}
		defer stop()
	}
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	if err = ch.Confirm(false); err != nil {
		return
	}
	lat.redo = redoState(ctx, b.DB)
	sent := make([]time.Time, n)
	interval := time.Duration(float64(time.Second) / rate)
	start = time.Now()
	var stopSampling func() []hostSample
	if o.openDump != "" {
		stopSampling = sampleHost(filepath.Join(o.openDump, fmt.Sprintf("open-%s.host.tsv", start.UTC().Format("150405"))), start)
		defer func() {
			if stopSampling != nil {
				stopSampling()
			}
		}()
	}
	for i, p := range pays {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		sent[i] = time.Now()
		if _, err = ch.PublishWithDeferredConfirm("", listener.MainQueue, false, false,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: p.body()}); err != nil {
			return
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var paid int
		if b.DB.GetContext(ctx, &paid, "SELECT COUNT(*) FROM t_order WHERE status = 'PAID'"); paid >= n {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var rows []struct {
		OrderNo string    `db:"order_no"`
		PayTime time.Time `db:"pay_time"`
	}
	if err = b.DB.SelectContext(ctx, &rows, "SELECT order_no, pay_time FROM t_order WHERE status = 'PAID'"); err != nil {
		return
	}
	if len(rows) != n {
		err = fmt.Errorf("open loop: %d of %d paid", len(rows), n)
		return
	}
	idx := map[string]int{}
	for i, p := range pays {
		idx[p.orderNo] = i
	}
	all := make([]time.Duration, 0, n)
	byMsg := make([]time.Duration, n)
	for _, r := range rows {
		d := max(r.PayTime.Sub(sent[idx[r.OrderNo]]), 0)
		all = append(all, d)
		byMsg[idx[r.OrderNo]] = d
	}
	lat.worst = worstSecond(start, sent, byMsg)
	if o.openDump != "" {
		dumpOpen(o.openDump, start, sent, byMsg)
		host := stopSampling()
		stopSampling = nil
		paid, sentMs, latMs := make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range sent {
			sentMs[i], latMs[i] = float64(sent[i].Sub(start))/1e6, float64(byMsg[i])/1e6
			paid[i] = sentMs[i] + latMs[i]
		}
		lat.worst += "; " + pauses(paid, sentMs, latMs, host)
	}
	lat.p50, lat.p99, lat.p999 = percentiles(all)
	rec.mu.Lock()
	if len(rec.durs) > 0 {
		_, lat.handlingP99, _ = percentiles(rec.durs)
	}
	rec.mu.Unlock()
	return
}

// dumpOpen writes one line per payment: its publish, in milliseconds from
// the loop's start, and its publish-to-payment latency in milliseconds.
func dumpOpen(dir string, start time.Time, sent []time.Time, lat []time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "# loop start %s (Unix ms %d)\nsent_ms\tlatency_ms\n", start.UTC().Format(time.RFC3339Nano), start.UnixMilli())
	for i := range sent {
		fmt.Fprintf(&b, "%.3f\t%.3f\n", float64(sent[i].Sub(start))/1e6, float64(lat[i])/1e6)
	}
	os.WriteFile(filepath.Join(dir, fmt.Sprintf("open-%s.tsv", start.UTC().Format("150405"))), []byte(b.String()), 0o644)
}

// hostSample is the host at one moment of an open loop: CPU time in
// clock ticks (user nice system idle iowait irq softirq steal, the first
// line of /proc/stat) and, summed over the disks (/proc/diskstats; loop,
// ram and zram left out), writes completed, I/Os in flight, milliseconds
// spent doing I/O and flushes completed; at ms from the loop's start.
type hostSample struct {
	ms                            float64
	cpu                           [8]int64
	writes, inFlight, ioMs, flush int64
}

// sampleHost samples the host every 10 ms until stop, which writes the
// samples to path (TSV) and returns them.
func sampleHost(path string, start time.Time) (stop func() []hostSample) {
	done, finished := make(chan struct{}), make(chan struct{})
	var samples []hostSample
	go func() {
		defer close(finished)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				if h, ok := readHost(); ok {
					h.ms = float64(now.Sub(start)) / 1e6
					samples = append(samples, h)
				}
			}
		}
	}()
	return func() []hostSample {
		close(done)
		<-finished
		var b strings.Builder
		b.WriteString("t_ms\tuser\tnice\tsystem\tidle\tiowait\tirq\tsoftirq\tsteal\twrites\tin_flight\tio_ms\tflushes\n")
		for _, h := range samples {
			fmt.Fprintf(&b, "%.1f", h.ms)
			for _, c := range h.cpu {
				fmt.Fprintf(&b, "\t%d", c)
			}
			fmt.Fprintf(&b, "\t%d\t%d\t%d\t%d\n", h.writes, h.inFlight, h.ioMs, h.flush)
		}
		os.WriteFile(path, []byte(b.String()), 0o644)
		return samples
	}
}

func readHost() (h hostSample, ok bool) {
	stat, err1 := os.ReadFile("/proc/stat")
	disks, err2 := os.ReadFile("/proc/diskstats")
	if err1 != nil || err2 != nil {
		return h, false
	}
	cpu := strings.Fields(strings.SplitN(string(stat), "\n", 2)[0])
	if len(cpu) < 9 {
		return h, false
	}
	for i := range h.cpu {
		h.cpu[i], _ = strconv.ParseInt(cpu[i+1], 10, 64)
	}
	for _, line := range strings.Split(string(disks), "\n") {
		f := strings.Fields(line)
		if len(f) < 14 || strings.HasPrefix(f[2], "loop") || strings.HasPrefix(f[2], "ram") || strings.HasPrefix(f[2], "zram") {
			continue
		}
		n := func(i int) int64 {
			if i >= len(f) {
				return 0
			}
			v, _ := strconv.ParseInt(f[i], 10, 64)
			return v
		}
		h.writes += n(7)
		h.inFlight += n(11)
		h.ioMs += n(12)
		h.flush += n(18)
	}
	return h, true
}

// pauses finds the moments of the loop in which no payment was paid for
// 50 ms or more while payments were published (paid: each payment's
// pay_time in ms from the loop's start), and says how many of them the
// disk explains: no write completed while I/Os were in flight for at
// least half the pause. It counts the payments over 50 ms that waited
// through a pause.
func pauses(paid, sentMs, latMs []float64, host []hostSample) string {
	order := make([]int, len(paid))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int { return cmp.Compare(paid[x], paid[y]) })
	// waiting[k]: the earliest publish among the payments paid at or after
	// the k-th pay time: a pause counts only if one of them waited 50 ms
	// of it (a slow publisher's gaps are no pause).
	waiting := make([]float64, len(order)+1)
	waiting[len(order)] = math.Inf(1)
	for k := len(order) - 1; k >= 0; k-- {
		waiting[k] = min(waiting[k+1], sentMs[order[k]])
	}
	var n, disk int
	var total float64
	type gap struct{ a, b float64 }
	var gaps []gap
	for k := 1; k < len(order); k++ {
		a, b := paid[order[k-1]], paid[order[k]]
		if a = max(a, waiting[k]); b-a < 50 {
			continue
		}
		n++
		total += b - a
		gaps = append(gaps, gap{a, b})
		stalled, all := 0, 0
		for j := 1; j < len(host); j++ {
			if host[j].ms < a || host[j].ms > b {
				continue
			}
			all++
			if host[j].writes == host[j-1].writes && host[j].inFlight > 0 {
				stalled++
			}
		}
		if all > 0 && 2*stalled >= all {
			disk++
		}
	}
	slow, inPause := 0, 0
	for i := range latMs {
		if latMs[i] <= 50 {
			continue
		}
		slow++
		for _, g := range gaps {
			if sentMs[i] < g.b && sentMs[i]+latMs[i] > g.a {
				inPause++
				break
			}
		}
	}
	return fmt.Sprintf("pauses of 50ms+ with nothing paid: %d (%.0f ms), %d with the disk stalled; %d of %d payments over 50ms waited through one",
		n, total, disk, inPause, slow)
}
