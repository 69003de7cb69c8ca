package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/scratch"
)

// largeOptions are -only large's: the two seeded databases it measures on
// and how many payments each drain takes.
type largeOptions struct {
	small, large shape
	n            int     // payments per drain
	hotShare     float64 // share of the payments on the hot fifth of the users
	rounds       int
	openSeconds  int
	kinds, dbs   string // comma-separated filters: paysvc,ref,batched; small,large
	mixes        string // uniform,hot
	// trace is paysvc's tracing in the drains: a sample ratio, its spans
	// exported to a local receiver that discards them, or off.
	trace string
}

// wants says whether the filter list (empty: everything) names x.
func wants(list, x string) bool {
	return list == "" || strings.Contains(","+list+",", ","+x+",")
}

// kindFlag is each consumer's name in -large-kinds.
var kindFlag = map[string]string{kindPaysvc: "paysvc", kindRef: "ref", kindRefB10: "batched"}

// The consumers -only large compares, on the same data and schema.
const (
	kindPaysvc  = "paysvc defaults"
	kindRef     = "reference, per message"
	kindRefB10  = "reference, batched by 10"
	balanceSeed = "100000000.00"
)

var kinds = []string{kindPaysvc, kindRef, kindRefB10}

// sized is one drain's result on one database and mix.
type sized struct {
	db, mix, kind  string
	msgs, n        int
	rate           float64
	cost           cpuCost
	other          time.Duration // CPU per payment of every other process on the host
	counters       map[string]float64
	writtenSettled float64 // Innodb_data_written per payment until the redo is checkpointed after the drain
	load           string
}

// drawPayments draws n distinct INIT orders of s: uniformly, or with
// hotShare of them on the first fifth of the users (and the rest on the
// others).
func drawPayments(s shape, n int, hotShare float64) []payment {
	seen := map[int64]bool{}
	pays := make([]payment, 0, n)
	hotUsers := s.Accounts / 5
	for len(pays) < n {
		i := (rand.Int64N(s.inits()) + 1) * s.InitEvery
		if seen[i] {
			continue
		}
		if hotShare > 0 {
			wantHot := rand.Float64() < hotShare
			for (s.user(i) <= hotUsers) != wantHot || seen[i] {
				i = (rand.Int64N(s.inits()) + 1) * s.InitEvery
			}
		}
		seen[i] = true
		pays = append(pays, payment{orderNo: s.orderNo(i), user: s.user(i), amount: s.amount(i)})
	}
	return pays
}

// canDraw says whether drawPayments can draw n payments of s with the
// hot share (it draws by rejection: a pool too small would never fill, a
// pool nearly drawn out fills slowly).
func (s shape) canDraw(n int, hotShare float64) error {
	const most = 0.9 // of a pool
	hotPool := float64(s.inits()) / 5
	if float64(n) > most*float64(s.inits()) || hotShare*float64(n) > most*hotPool || (1-hotShare)*float64(n) > most*(float64(s.inits())-hotPool) {
		return fmt.Errorf("%s: %d payments (%.0f%% on a fifth of the users) is more than its INIT orders allow", s, n, hotShare*100)
	}
	return nil
}

// sharedBed is a vhost and a Redis prefix of their own on a seeded
// database the bed does not own (closeShared leaves the database alone).
func sharedBed(o *options, db *sqlx.DB, dsn, name string) (*bed, error) {
	id := fmt.Sprintf("bench_%s_%x", name, rand.Uint32())
	b := &bed{Database: &scratch.Database{Name: id, DSN: dsn, DB: db}, prefix: id + ":"}
	var err error
	if b.amqpURL, err = scratch.NewVhost(o.amqpURL, id, "guest"); err != nil {
		return nil, err
	}
	b.rdb = redis.NewClient(&redis.Options{Addr: o.redisAddr, PoolSize: 16})
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		b.closeShared()
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.closeShared()
		return nil, err
	}
	if err := listener.Declare(ch, delays); err != nil {
		b.closeShared()
		return nil, err
	}
	return b, nil
}

func (b *bed) closeShared() {
	scratch.DeleteVhost(b.Name)
	scratch.DeleteKeys(context.Background(), b.rdb, b.prefix)
	b.rdb.Close()
}

// marks are the tables' highest ids before a drain: what it added is above.
type marks struct{ Flow, Outbox, Event int64 }

var markedTables = []struct {
	table string
	field func(*marks) *int64
}{
	{"t_account_flow", func(m *marks) *int64 { return &m.Flow }},
	{"t_outbox", func(m *marks) *int64 { return &m.Outbox }},
	{"t_payment_event", func(m *marks) *int64 { return &m.Event }},
}

func readMarks(ctx context.Context, db *sqlx.DB) (marks, error) {
	var m marks
	for _, t := range markedTables {
		if err := db.GetContext(ctx, t.field(&m), "SELECT COALESCE(MAX(id), 0) FROM "+t.table); err != nil {
			return m, err
		}
	}
	return m, nil
}

// restore puts the seed back as it was before a drain of pays: the orders
// INIT, the balances as seeded, the rows the drain added deleted.
func restore(ctx context.Context, db *sqlx.DB, pays []payment, m marks) error {
	for lo := 0; lo < len(pays); lo += 1000 {
		part := pays[lo:min(lo+1000, len(pays))]
		nos, users := make([]string, len(part)), make([]string, len(part))
		for i, p := range part {
			nos[i], users[i] = "'"+p.orderNo+"'", fmt.Sprint(p.user)
		}
		if _, err := db.ExecContext(ctx, "UPDATE t_order SET status = 'INIT', pay_time = NULL WHERE order_no IN ("+strings.Join(nos, ",")+")"); err != nil {
			return fmt.Errorf("restore orders: %w", err)
		}
		if _, err := db.ExecContext(ctx, "UPDATE t_account SET balance = "+balanceSeed+" WHERE user_id IN ("+strings.Join(users, ",")+")"); err != nil {
			return fmt.Errorf("restore balances: %w", err)
		}
	}
	for _, t := range markedTables {
		for {
			res, err := db.ExecContext(ctx, fmt.Sprintf("DELETE FROM %s WHERE id > ? ORDER BY id LIMIT 5000", t.table), *t.field(&m))
			if err != nil {
				return fmt.Errorf("restore %s: %w", t.table, err)
			}
			if n, _ := res.RowsAffected(); n < 5000 {
				break
			}
		}
	}
	return nil
}

// The journal: a drain's orders and marks, written before it pays and
// cleared after its restore, so that a run cut half way (an interrupt, a
// crash) is restored by the next one (recoverSeed) instead of leaving
// INIT orders paid.
const journalDDL = `CREATE TABLE IF NOT EXISTS bench_journal (order_no VARCHAR(64) NOT NULL PRIMARY KEY);
CREATE TABLE IF NOT EXISTS bench_journal_marks (flow BIGINT NOT NULL, outbox BIGINT NOT NULL, event BIGINT NOT NULL)`

func journal(ctx context.Context, db *sqlx.DB, pays []payment, m marks) error {
	if _, err := db.ExecContext(ctx, journalDDL); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM bench_journal_marks; INSERT INTO bench_journal_marks VALUES (?, ?, ?)", m.Flow, m.Outbox, m.Event); err != nil {
		return err
	}
	for lo := 0; lo < len(pays); lo += 1000 {
		part := pays[lo:min(lo+1000, len(pays))]
		vals := make([]string, len(part))
		for i, p := range part {
			vals[i] = "('" + p.orderNo + "')"
		}
		if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO bench_journal VALUES "+strings.Join(vals, ",")); err != nil {
			return err
		}
	}
	return nil
}

func clearJournal(ctx context.Context, db *sqlx.DB) error {
	_, err := db.ExecContext(ctx, "DELETE FROM bench_journal_marks; DELETE FROM bench_journal")
	return err
}

// recoverSeed restores what a cut run left in the journal.
func recoverSeed(ctx context.Context, db *sqlx.DB, s shape) (int, error) {
	if _, err := db.ExecContext(ctx, journalDDL); err != nil {
		return 0, err
	}
	var ms []marks
	if err := db.SelectContext(ctx, &ms, "SELECT flow, outbox, event FROM bench_journal_marks"); err != nil || len(ms) == 0 {
		return 0, err
	}
	var nos []string
	if err := db.SelectContext(ctx, &nos, "SELECT order_no FROM bench_journal"); err != nil {
		return 0, err
	}
	pays := make([]payment, 0, len(nos))
	for _, no := range nos {
		var i int64
		if _, err := fmt.Sscanf(no, "L%d", &i); err != nil {
			return 0, fmt.Errorf("journal: order %q: %w", no, err)
		}
		pays = append(pays, payment{orderNo: no, user: s.user(i), amount: s.amount(i)})
	}
	if err := restore(ctx, db, pays, ms[0]); err != nil {
		return 0, err
	}
	return len(pays), clearJournal(ctx, db)
}

// paidCount counts the orders of pays that are PAID.
func paidCount(ctx context.Context, db *sqlx.DB, pays []payment) (int, error) {
	total := 0
	for lo := 0; lo < len(pays); lo += 1000 {
		part := pays[lo:min(lo+1000, len(pays))]
		nos := make([]string, len(part))
		for i, p := range part {
			nos[i] = "'" + p.orderNo + "'"
		}
		var n int
		if err := db.GetContext(ctx, &n, "SELECT COUNT(*) FROM t_order WHERE status = 'PAID' AND order_no IN ("+strings.Join(nos, ",")+")"); err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// settle waits (at most 20 s each) until InnoDB has purged what the
// restore deleted and checkpointed most of its redo, so that one drain's
// clean-up is not charged to the next: both are background page reads
// and writes that the global counters would count.
func settle(ctx context.Context, db *sqlx.DB) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var h int64
		if db.GetContext(ctx, &h, "SELECT `count` FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'") != nil || h < 2000 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	deadline = time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var name string
		var age, maxAge int64
		if db.QueryRowxContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_checkpoint_age'").Scan(&name, &age) != nil ||
			db.QueryRowxContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_checkpoint_max_age'").Scan(&name, &maxAge) != nil ||
			age < maxAge/4 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func allCPU(m map[string]time.Duration) time.Duration {
	var t time.Duration
	for _, d := range m {
		t += d
	}
	return t
}

// drainOn drains pays (10% published twice, as every bench run) from a
// vhost of its own with one of the consumers, on a seeded database, then
// restores the seed.
func drainOn(ctx context.Context, o *options, db *sqlx.DB, dsn, dbName, mix, kind string, pays []payment) (sized, error) {
	r := sized{db: dbName, mix: mix, kind: kind, n: len(pays)}
	b, err := sharedBed(o, db, dsn, "large")
	if err != nil {
		return r, err
	}
	defer b.closeShared()
	var bodies [][]byte
	for _, p := range pays {
		bodies = append(bodies, p.body())
		if rand.Float64() < o.dup {
			bodies = append(bodies, p.body())
		}
	}
	rand.Shuffle(len(bodies), func(i, j int) { bodies[i], bodies[j] = bodies[j], bodies[i] })
	if err := b.preload(bodies); err != nil {
		return r, err
	}
	r.msgs = len(bodies)
	m, err := readMarks(ctx, db)
	if err != nil {
		return r, err
	}
	if err := journal(ctx, db, pays, m); err != nil {
		return r, err
	}
	defer func() {
		rctx := context.WithoutCancel(ctx)
		if err := restore(rctx, db, pays, m); err != nil {
			fmt.Fprintf(os.Stderr, "paybench: %v (the next run restores the journal)\n", err)
			return
		}
		clearJournal(rctx, db)
	}()
	settle(ctx, db)
	status0 := dbStatus(ctx, db)
	load0 := loadavg()
	before, start := procCPU(), time.Now()
	var consumer time.Duration
	rctx, cancel := context.WithTimeout(ctx, time.Duration(len(bodies)/20+120)*time.Second)
	defer cancel()
	switch kind {
	case kindPaysvc:
		d, err := startDaemon(o, b, o.paysvcEnv)
		if err != nil {
			return r, err
		}
		failed := true
		defer func() { d.stop(failed) }()
		for {
			handled, _ := handledMessages(d.httpAddr)
			if handled >= len(bodies) {
				var pending int
				if err := db.GetContext(ctx, &pending, "SELECT COUNT(*) FROM t_outbox WHERE status = 'PENDING'"); err == nil && pending == 0 {
					break
				}
			}
			if d.cmd.ProcessState != nil || rctx.Err() != nil {
				return r, fmt.Errorf("paysvc: %d of %d messages handled before the deadline (log %s)", handled, len(bodies), d.logPath)
			}
			time.Sleep(50 * time.Millisecond)
		}
		consumer = pidCPU(d.cmd.Process.Pid)
		failed = false
	case kindRef, kindRefB10:
		self0 := pidCPU(os.Getpid())
		if kind == kindRef {
			err = runReference(rctx, b, o, 32, 200, len(bodies))
		} else {
			err = runReferenceBatched(rctx, b, o, 32, 200, 10, len(bodies))
		}
		if err != nil {
			return r, fmt.Errorf("%s: %w", kind, err)
		}
		consumer = pidCPU(os.Getpid()) - self0
	}
	elapsed := time.Since(start)
	after := procCPU()
	status1 := dbStatus(ctx, db)
	r.rate = float64(len(bodies)) / elapsed.Seconds()
	r.cost = costSince(before, consumer, len(pays))
	measuredCPU := consumer
	for _, s := range servers {
		measuredCPU += after[s] - before[s]
	}
	r.other = max(allCPU(after)-allCPU(before)-measuredCPU, 0) / time.Duration(len(pays))
	r.counters = map[string]float64{}
	for _, k := range dbCounters {
		r.counters[k] = float64(status1[k]-status0[k]) / float64(len(pays))
	}
	r.load = load0 + " → " + loadavg()
	// Pages the drain dirtied are written when InnoDB flushes them, partly
	// after it: the writes until the redo is checkpointed again count too.
	settle(ctx, db)
	r.writtenSettled = float64(dbStatus(ctx, db)["Innodb_data_written"]-status0["Innodb_data_written"]) / float64(len(pays))
	paid, err := paidCount(ctx, db, pays)
	if err != nil {
		return r, err
	}
	if paid != len(pays) {
		return r, fmt.Errorf("%s on %s: %d of %d orders paid", kind, dbName, paid, len(pays))
	}
	return r, nil
}

// openOn publishes fresh payments of the seeded database at rate for d
// into a paysvc daemon started for them, from the moment it is ready, and
// times each from its publish to its order's pay_time; then restores the
// seed.
func openOn(ctx context.Context, o *options, db *sqlx.DB, dsn string, s shape, rate float64, d time.Duration) (lat latencies, err error) {
	pays := drawPayments(s, int(rate*d.Seconds()), 0)
	b, err := sharedBed(o, db, dsn, "open")
	if err != nil {
		return lat, err
	}
	defer b.closeShared()
	m, err := readMarks(ctx, db)
	if err != nil {
		return lat, err
	}
	if err = journal(ctx, db, pays, m); err != nil {
		return lat, err
	}
	defer func() {
		rctx := context.WithoutCancel(ctx)
		if rerr := restore(rctx, db, pays, m); rerr != nil && err == nil {
			err = rerr
		} else if rerr == nil {
			clearJournal(rctx, db)
		}
	}()
	settle(ctx, db)
	dm, err := startDaemon(o, b, o.paysvcEnv)
	if err != nil {
		return lat, err
	}
	defer func() { dm.stop(err != nil) }()
	deadline := time.Now().Add(60 * time.Second)
	for !dm.ready() {
		if time.Now().After(deadline) {
			return lat, fmt.Errorf("open loop: the daemon never became ready (log %s)", dm.logPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		return lat, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return lat, err
	}
	if err = ch.Confirm(false); err != nil {
		return lat, err
	}
	lat.redo = redoState(ctx, db)
	sent := make([]time.Time, len(pays))
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i, p := range pays {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		sent[i] = time.Now()
		if _, err = ch.PublishWithDeferredConfirm("", listener.MainQueue, false, false,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: p.body()}); err != nil {
			return lat, err
		}
	}
	deadline = time.Now().Add(120 * time.Second)
	for time.Now().Before(deadline) {
		if handled, _ := handledMessages(dm.httpAddr); handled >= len(pays) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	idx := map[string]int{}
	for i, p := range pays {
		idx[p.orderNo] = i
	}
	byMsg := make([]time.Duration, len(pays))
	all := make([]time.Duration, 0, len(pays))
	for lo := 0; lo < len(pays); lo += 1000 {
		part := pays[lo:min(lo+1000, len(pays))]
		nos := make([]string, len(part))
		for i, p := range part {
			nos[i] = "'" + p.orderNo + "'"
		}
		var rows []struct {
			OrderNo string    `db:"order_no"`
			PayTime time.Time `db:"pay_time"`
		}
		if err = db.SelectContext(ctx, &rows, "SELECT order_no, pay_time FROM t_order WHERE status = 'PAID' AND order_no IN ("+
			strings.Join(nos, ",")+")"); err != nil {
			return lat, err
		}
		for _, r := range rows {
			d := max(r.PayTime.Sub(sent[idx[r.OrderNo]]), 0)
			all = append(all, d)
			byMsg[idx[r.OrderNo]] = d
		}
	}
	if len(all) != len(pays) {
		return lat, fmt.Errorf("open loop: %d of %d paid", len(all), len(pays))
	}
	lat.worst = worstSecond(start, sent, byMsg)
	lat.p50, lat.p99, lat.p999 = percentiles(all)
	return lat, nil
}

// large measures the consumers on a small and a production-size seeded
// database (kept between runs), on uniform and hot payments, interleaved,
// and prints the per-payment figures, how each moves from small to large,
// and the production-size targets (docs/benchmarks.md).
func large(ctx context.Context, o *options, lo largeOptions) error {
	say := func(s string) { fmt.Printf("%s  %s\n", time.Now().UTC().Format("15:04:05"), s) }
	type seeded struct {
		s   shape
		db  *sqlx.DB
		dsn string
	}
	for _, s := range []shape{lo.small, lo.large} {
		if err := s.canDraw(lo.n, lo.hotShare); err != nil {
			return err
		}
	}
	if modes, err := traceModes(lo.trace); err != nil || len(modes) != 1 {
		return fmt.Errorf("-large-trace: want off or one sample ratio from 0 to 1, got %q", lo.trace)
	}
	if lo.trace != "off" {
		sink := newSpanSink()
		defer func() {
			say(fmt.Sprintf("paysvc's tracing at %s: %d spans in %d requests received", lo.trace, sink.spans.Load(), sink.requests.Load()))
			sink.Close()
		}()
		o.paysvcEnv = append(slices.Clone(o.paysvcEnv), "PAYSVC_TRACE_OTLPENDPOINT="+sink.URL, "PAYSVC_TRACE_SAMPLERATIO="+lo.trace)
	}
	var dbs []seeded
	for _, s := range []shape{lo.small, lo.large} {
		if !wants(lo.dbs, map[bool]string{true: "small", false: "large"}[s == lo.small]) {
			continue
		}
		db, dsn, info, err := openSeeded(ctx, o.mysqlDSN, s, say)
		if err != nil {
			return err
		}
		defer db.Close()
		if n, err := recoverSeed(ctx, db, s); err != nil {
			return fmt.Errorf("%s: restore a cut run's journal: %w", s.DB, err)
		} else if n > 0 {
			say(fmt.Sprintf("%s: restored the %d orders of a cut run", s.DB, n))
		}
		fp, err := footprint(ctx, db, s.DB)
		if err != nil {
			return err
		}
		say(fmt.Sprintf("%s; seeded %s UTC in %.0f s; %s", s, info.at.Format("2006-01-02 15:04"), info.seconds, fp))
		dbs = append(dbs, seeded{s, db, dsn})
	}
	if len(dbs) == 0 {
		return fmt.Errorf("-large-dbs %q names neither small nor large", lo.dbs)
	}
	var pool int64
	dbs[0].db.GetContext(ctx, &pool, "SELECT @@innodb_buffer_pool_size")
	say(fmt.Sprintf("InnoDB buffer pool %d MiB; %d payments per drain, %.0f%% published twice; hot mix: %.0f%% of the payments on a fifth of the users",
		pool>>20, lo.n, o.dup*100, lo.hotShare*100))
	if lo.rounds == 0 {
		return nil
	}
	mixes := []struct {
		name  string
		share float64
	}{{"uniform", 0}, {"hot", lo.hotShare}}
	var results []sized
	for round := 1; round <= lo.rounds; round++ {
		for _, mix := range mixes {
			if !wants(lo.mixes, mix.name) {
				continue
			}
			for _, sd := range dbs {
				for _, kind := range kinds {
					if !wants(lo.kinds, kindFlag[kind]) {
						continue
					}
					pays := drawPayments(sd.s, lo.n, mix.share)
					r, err := drainOn(ctx, o, sd.db, sd.dsn, sd.s.DB, mix.name, kind, pays)
					if err != nil {
						return err
					}
					results = append(results, r)
					say(fmt.Sprintf("round %d: %s", round, r))
				}
			}
		}
	}
	// The open loops: paysvc at half its (median) uniform rate, per database.
	p99 := map[string]latencies{}
	for _, sd := range dbs {
		if !wants(lo.kinds, "paysvc") || lo.openSeconds == 0 {
			break
		}
		peak := medianOf(results, sd.s.DB, "uniform", kindPaysvc, func(r sized) float64 { return r.rate })
		if peak == 0 { // no uniform drain this run: the hot one's
			peak = medianOf(results, sd.s.DB, "hot", kindPaysvc, func(r sized) float64 { return r.rate })
		}
		lat, err := openOn(ctx, o, sd.db, sd.dsn, sd.s, peak/2, time.Duration(lo.openSeconds)*time.Second)
		if err != nil {
			return err
		}
		p99[sd.s.DB] = lat
		say(fmt.Sprintf("open loop on %s, paysvc at %.0f msg/s (half its drain), publish→paid p50 %s p99 %s p99.9 %s; %s; %s",
			sd.s.DB, peak/2, ms(lat.p50), ms(lat.p99), ms(lat.p999), lat.worst, lat.redo))
	}
	summarize(results, lo, p99)
	return nil
}

func (r sized) String() string {
	c := r.counters
	return fmt.Sprintf("%s, %s, %s: %d msgs %.0f msg/s; %s, other processes %d; per payment: pages read from disk %.2f, rows read %.1f, "+
		"data written %.1f KiB (%.1f KiB until checkpointed), redo %.1f KiB, statements %.2f, commits %.2f, fsyncs %.2f; load %s",
		r.db, r.mix, r.kind, r.msgs, r.rate, r.cost, r.other.Microseconds(), c["Innodb_buffer_pool_reads"], rowsRead(c),
		c["Innodb_data_written"]/1024, r.writtenSettled/1024, c["Innodb_os_log_written"]/1024, c["Questions"], c["Com_commit"], c["Innodb_data_fsyncs"], r.load)
}

// medianOf is the median of f over the results of one database, mix and
// consumer (the upper one of an even count; 0 if none).
func medianOf(rs []sized, db, mix, kind string, f func(sized) float64) float64 {
	var v []float64
	for _, r := range rs {
		if r.db == db && r.mix == mix && r.kind == kind {
			v = append(v, f(r))
		}
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func summarize(rs []sized, lo largeOptions, lat map[string]latencies) {
	small, large := lo.small.DB, lo.large.DB
	us := func(k string) func(sized) float64 {
		return func(r sized) float64 { return float64(r.cost[k].Microseconds()) }
	}
	cols := []struct {
		name string
		f    func(sized) float64
		fmt  string
	}{
		{"msg/s", func(r sized) float64 { return r.rate }, "%.0f"},
		{"CPU µs: MariaDB", us("mariadbd"), "%.0f"},
		{"consumer", us("consumer"), "%.0f"},
		{"RabbitMQ", us("beam.smp"), "%.0f"},
		{"Redis", us("redis-server"), "%.0f"},
		{"total", func(r sized) float64 { return float64(r.cost.total().Microseconds()) }, "%.0f"},
		{"pages read", func(r sized) float64 { return r.counters["Innodb_buffer_pool_reads"] }, "%.2f"},
		{"rows read", func(r sized) float64 { return rowsRead(r.counters) }, "%.1f"},
		{"KiB written", func(r sized) float64 { return r.counters["Innodb_data_written"] / 1024 }, "%.1f"},
		{"KiB written, checkpointed", func(r sized) float64 { return r.writtenSettled / 1024 }, "%.1f"},
	}
	fmt.Println()
	fmt.Printf("medians of %d round(s), per payment\n\n", lo.rounds)
	var hdr []string
	for _, c := range cols {
		hdr = append(hdr, c.name)
	}
	fmt.Printf("| tables | mix | consumer | %s |\n|---|---|---|%s\n", strings.Join(hdr, " | "), strings.Repeat("---|", len(cols)))
	for _, mix := range []string{"uniform", "hot"} {
		for _, db := range []string{small, large} {
			for _, kind := range kinds {
				if medianOf(rs, db, mix, kind, cols[0].f) == 0 {
					continue // not measured this run
				}
				var cells []string
				for _, c := range cols {
					cells = append(cells, fmt.Sprintf(c.fmt, medianOf(rs, db, mix, kind, c.f)))
				}
				fmt.Printf("| %s | %s | %s | %s |\n", db, mix, kind, strings.Join(cells, " | "))
			}
			if db == large && medianOf(rs, small, mix, kindPaysvc, cols[0].f) > 0 {
				var cells []string
				for _, kind := range kinds {
					var parts []string
					for _, c := range cols[:1] {
						parts = append(parts, fmt.Sprintf("%s %.2fx", c.name, medianOf(rs, large, mix, kind, c.f)/medianOf(rs, small, mix, kind, c.f)))
					}
					parts = append(parts, fmt.Sprintf("total CPU %.2fx", medianOf(rs, large, mix, kind, cols[5].f)/medianOf(rs, small, mix, kind, cols[5].f)))
					cells = append(cells, kind+": "+strings.Join(parts, ", "))
				}
				fmt.Printf("\nlarge/small, %s: %s\n\n", mix, strings.Join(cells, "; "))
			}
		}
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	rate := func(db, mix, kind string) float64 {
		return medianOf(rs, db, mix, kind, func(r sized) float64 { return r.rate })
	}
	if rate(large, "uniform", kindPaysvc) == 0 || rate(large, "uniform", kindRefB10) == 0 || rate(small, "uniform", kindPaysvc) == 0 {
		fmt.Println("targets: they need the uniform mix, paysvc on both databases and the batched reference on the large one")
		return
	}
	pages := medianOf(rs, large, "uniform", kindPaysvc, cols[6].f)
	written := medianOf(rs, large, "uniform", kindPaysvc, cols[9].f)
	fmt.Println("targets at production size (uniform mix):")
	vsBatched := rate(large, "uniform", kindPaysvc) / rate(large, "uniform", kindRefB10)
	fmt.Printf("  paysvc %.2fx the batched reference's rate (>= 1.5: %s)\n", vsBatched, verdict(vsBatched >= 1.5))
	vsSmall := rate(large, "uniform", kindPaysvc) / rate(small, "uniform", kindPaysvc)
	fmt.Printf("  paysvc %.2fx its own small-table rate (>= 0.6: %s)\n", vsSmall, verdict(vsSmall >= 0.6))
	fmt.Printf("  %.2f pages read from disk per payment (<= 3: %s)\n", pages, verdict(pages <= 3))
	fmt.Printf("  %.1f KiB written per payment until checkpointed (a fraction of 137 KiB: %.2f of it)\n", written, written/137)
	l := lat[large]
	fmt.Printf("  publish→paid p99 at half its peak %s, p50 %s (< 100ms: %s)\n", ms(l.p99), ms(l.p50), verdict(l.p99 < 100*time.Millisecond && l.p99 > 0))
}

// rowsRead is the rows MariaDB's handler read per payment.
func rowsRead(c map[string]float64) float64 {
	return c["Handler_read_key"] + c["Handler_read_next"] + c["Handler_read_rnd_next"]
}
