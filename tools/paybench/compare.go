package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// measured is one drain of preloaded messages: the rate and the CPU each
// process spent per payment.
type measured struct {
	payments, msgs int
	rate           float64 // messages per second
	cost           cpuCost
	db             string // MariaDB's counters per payment
	// lifeCPU, for the daemon, is its process's user+system CPU from
	// start to exit (rusage after the wait): start-up, the drain and the
	// stop, the last span export among it.
	lifeCPU time.Duration
}

// preloaded makes a bed with n fresh orders and their messages (a share
// published twice) waiting in q.pay.success, as every compared run gets.
func preloaded(ctx context.Context, o *options, name string, n int, hot float64) (*bed, int, error) {
	b, err := newBed(ctx, o, name)
	if err != nil {
		return nil, 0, err
	}
	pays, err := b.seed(ctx, n, o.users, hot, o.hotUsers)
	if err != nil {
		b.close()
		return nil, 0, err
	}
	var bodies [][]byte
	for _, p := range pays {
		bodies = append(bodies, p.body())
		if rand.Float64() < o.dup {
			bodies = append(bodies, p.body())
		}
	}
	rand.Shuffle(len(bodies), func(i, j int) { bodies[i], bodies[j] = bodies[j], bodies[i] })
	if err := b.preload(bodies); err != nil {
		b.close()
		return nil, 0, err
	}
	return b, len(bodies), nil
}

// measureReference drains n payments with the reference consumer.
func measureReference(ctx context.Context, o *options, workers, prefetch, n int) (measured, error) {
	b, msgs, err := preloaded(ctx, o, fmt.Sprintf("ref%d", workers), n, 0)
	if err != nil {
		return measured{}, err
	}
	defer b.close()
	status0 := dbStatus(ctx, b.DB)
	before, self0, start := procCPU(), pidCPU(os.Getpid()), time.Now()
	rctx, cancel := context.WithTimeout(ctx, time.Duration(msgs/20+60)*time.Second)
	defer cancel()
	if err := runReference(rctx, b, o, workers, prefetch, msgs); err != nil {
		return measured{}, fmt.Errorf("reference (%d workers): %w", workers, err)
	}
	elapsed := time.Since(start)
	m := measured{payments: n, msgs: msgs, rate: float64(msgs) / elapsed.Seconds(),
		cost: costSince(before, pidCPU(os.Getpid())-self0, n), db: dbPerPayment(status0, dbStatus(ctx, b.DB), n)}
	var paid int
	b.DB.GetContext(ctx, &paid, "SELECT COUNT(*) FROM t_order WHERE status = 'PAID'")
	if paid != n {
		return m, fmt.Errorf("reference: %d of %d orders paid", paid, n)
	}
	return m, nil
}

// daemon is the real paysvc binary running against a bed, on its defaults
// but for one CPU and extraEnv, logging to a file of its own.
type daemon struct {
	cmd      *exec.Cmd
	httpAddr string
	logPath  string
	logf     *os.File
}

func startDaemon(o *options, b *bed, extraEnv []string) (*daemon, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &daemon{httpAddr: ln.Addr().String(), logPath: filepath.Join(os.TempDir(), fmt.Sprintf("paybench-paysvc-%d.log", os.Getpid()))}
	ln.Close()
	if d.logf, err = os.Create(d.logPath); err != nil {
		return nil, err
	}
	bin, err := filepath.Abs(o.paysvcBinary)
	if err != nil {
		return nil, err
	}
	d.cmd = exec.Command(bin, "run")
	d.cmd.Dir = os.TempDir() // no config.yaml there: the defaults and the environment alone
	d.cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"PAYSVC_AMQP_URL=" + b.amqpURL,
		"PAYSVC_MYSQL_DSN=" + b.DSN,
		"PAYSVC_REDIS_ADDR=" + o.redisAddr,
		"PAYSVC_IDEMPOTENT_KEYPREFIX=" + b.prefix,
		"PAYSVC_HTTP_ADDR=" + d.httpAddr,
		// One CPU, as on a host shared with MySQL and RabbitMQ
		// (docs/configuration.md, "CPUs and memory"); -pair-env
		// GOMAXPROCS=2 compares (the last value of a variable wins).
		"GOMAXPROCS=1",
	}, extraEnv...)
	d.cmd.Stdout, d.cmd.Stderr = d.logf, d.logf
	if err := d.cmd.Start(); err != nil {
		d.logf.Close()
		return nil, fmt.Errorf("start %s: %w", o.paysvcBinary, err)
	}
	return d, nil
}

// stop ends the daemon (SIGTERM, its drain) and keeps its log only if
// asked to (a failed run points at it).
func (d *daemon) stop(keepLog bool) {
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()
	d.logf.Close()
	if !keepLog {
		os.Remove(d.logPath)
	}
}

// measureDaemon drains n payments (a share hot of them on o.hotUsers
// accounts) with the real paysvc
// binary, from the moment it starts to the moment every message is handled
// and every notice published; the daemon's CPU is its process's.
func measureDaemon(ctx context.Context, o *options, n int, hot float64, extraEnv ...string) (measured, error) {
	b, msgs, err := preloaded(ctx, o, "paysvc", n, hot)
	if err != nil {
		return measured{}, err
	}
	defer b.close()
	status0 := dbStatus(ctx, b.DB)
	before, start := procCPU(), time.Now()
	d, err := startDaemon(o, b, extraEnv)
	if err != nil {
		return measured{}, err
	}
	failed := true
	defer func() {
		if d.cmd.ProcessState == nil {
			d.stop(failed)
		}
	}()
	deadline := time.Now().Add(time.Duration(msgs/20+60) * time.Second)
	nextReport := msgs / 10
	for {
		handled, _ := handledMessages(d.httpAddr)
		if o.heapTrace && handled >= nextReport {
			// The daemon's own figures, as an operator's Prometheus sees
			// them: memory flat over a long run.
			g, err := scrape(d.httpAddr, "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes", "go_goroutines")
			if err != nil {
				return measured{}, err
			}
			fmt.Printf("  paysvc daemon: %d of %d handled, heap in use %.1f MiB, RSS %.1f MiB, %.0f goroutines\n", handled, msgs,
				g["go_memstats_heap_inuse_bytes"]/(1<<20), g["process_resident_memory_bytes"]/(1<<20), g["go_goroutines"])
			nextReport += msgs / 10
		}
		if handled >= msgs {
			var pending int
			if err := b.DB.GetContext(ctx, &pending, "SELECT COUNT(*) FROM t_outbox WHERE status = 'PENDING'"); err == nil && pending == 0 {
				break
			}
		}
		if d.cmd.ProcessState != nil || time.Now().After(deadline) {
			return measured{}, fmt.Errorf("paysvc: %d of %d messages handled before the deadline (log %s)", handled, msgs, d.logPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(start)
	m := measured{payments: n, msgs: msgs, rate: float64(msgs) / elapsed.Seconds(),
		cost: costSince(before, pidCPU(d.cmd.Process.Pid), n), db: dbPerPayment(status0, dbStatus(ctx, b.DB), n)}
	var paid int
	b.DB.GetContext(ctx, &paid, "SELECT COUNT(*) FROM t_order WHERE status = 'PAID'")
	if paid != n {
		return m, fmt.Errorf("paysvc: %d of %d orders paid (log %s)", paid, n, d.logPath)
	}
	failed = false
	d.stop(false)
	if ps := d.cmd.ProcessState; ps != nil {
		m.lifeCPU = ps.UserTime() + ps.SystemTime()
	}
	return m, nil
}

// handledMessages sums paysvc_messages_total from the daemon's /metrics.
//
// The poll is part of what the daemon is charged for, so it is kept light:
// 20 a second, uncompressed (a gzipped /metrics 50 times a second cost the
// daemon about a tenth of its CPU in a profile). A run's end is seen up to
// 50 ms late, which counts against paysvc.
func handledMessages(addr string) (int, error) {
	m, err := scrape(addr, "paysvc_messages_total")
	return int(m["paysvc_messages_total"]), err
}

// scrape reads the named series from the daemon's /metrics, each summed
// over its labels.
func scrape(addr string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sums := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range names {
			rest, ok := strings.CutPrefix(line, name)
			if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
				continue
			}
			if i := strings.LastIndexByte(rest, ' '); i >= 0 {
				if v, err := strconv.ParseFloat(rest[i+1:], 64); err == nil {
					sums[name] += v
				}
			}
		}
	}
	return sums, sc.Err()
}

// compare runs, rounds times and interleaved, the reference consumer (32
// goroutines, prefetch 200), the paysvc daemon on its defaults, the
// reference at the article's configuration (1 goroutine, prefetch 10, a
// quarter of the payments), the daemon with every payment on o.hotUsers
// accounts, and an open loop into the daemon at half the rate it drained at
// in that round; then it prints the medians of the per-round ratios the
// targets are set on (docs/benchmarks.md), and the open loop's worst round.
func compare(ctx context.Context, o *options, rounds int, row func(string, float64, string)) error {
	var vsRef, vsArticle, dbRatio, totalRatio, hotRatio []float64
	var openP99 []time.Duration
	settings := "defaults"
	if len(o.paysvcEnv) > 0 {
		settings = strings.Join(o.paysvcEnv, " ")
	}
	for i := 1; i <= rounds; i++ {
		ref, err := measureReference(ctx, o, 32, 200, o.n)
		if err != nil {
			return err
		}
		row(fmt.Sprintf("round %d: reference consumer (32 goroutines, prefetch 200), %d msgs", i, ref.msgs), ref.rate, ref.cost.String()+"; "+ref.db)
		psv, err := measureDaemon(ctx, o, o.n, 0, o.paysvcEnv...)
		if err != nil {
			return err
		}
		row(fmt.Sprintf("round %d: paysvc daemon, %s, %d msgs", i, settings, psv.msgs), psv.rate, psv.cost.String()+"; "+psv.db)
		art, err := measureReference(ctx, o, 1, 10, o.n/4)
		if err != nil {
			return err
		}
		row(fmt.Sprintf("round %d: reference at the article's config (1 goroutine, prefetch 10), %d msgs", i, art.msgs), art.rate, art.cost.String()+"; "+art.db)
		hot, err := measureDaemon(ctx, o, o.n/2, 1.0, o.paysvcEnv...)
		if err != nil {
			return err
		}
		row(fmt.Sprintf("round %d: paysvc daemon, every payment on %d accounts, %d msgs", i, o.hotUsers, hot.msgs), hot.rate, hot.cost.String())
		lat, err := openLoop(ctx, o, psv.rate/2, 10*time.Second, true)
		if err != nil {
			return err
		}
		row(fmt.Sprintf("round %d: open loop into the daemon at half its peak, publish→payment", i), psv.rate/2,
			fmt.Sprintf("p50 %s  p99 %s  p99.9 %s; %s", ms(lat.p50), ms(lat.p99), ms(lat.p999), lat.worst+"; "+lat.redo))
		r := []float64{psv.rate / ref.rate, psv.rate / art.rate,
			float64(psv.cost["mariadbd"]) / float64(ref.cost["mariadbd"]), float64(psv.cost.total()) / float64(ref.cost.total()),
			hot.rate / psv.rate}
		vsRef, vsArticle, dbRatio, totalRatio = append(vsRef, r[0]), append(vsArticle, r[1]), append(dbRatio, r[2]), append(totalRatio, r[3])
		hotRatio, openP99 = append(hotRatio, r[4]), append(openP99, lat.p99)
		fmt.Printf("round %d: paysvc %.2fx the reference, %.2fx the article config; CPU per payment: MariaDB %.2fx, total %.2fx the reference's; hot accounts %.2fx uniform; open-loop p99 %s\n",
			i, r[0], r[1], r[2], r[3], r[4], ms(lat.p99))
	}
	worst := slices.Max(openP99)
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	fmt.Printf("median of %d rounds: paysvc %.2fx the reference (target >= 1.5: %s), %.2fx the article config (>= 4: %s); "+
		"CPU per payment: MariaDB %.2fx (<= 0.6: %s), total %.2fx (<= 0.65: %s) the reference's; hot accounts %.2fx uniform (>= 0.8: %s); "+
		"open-loop p99 worst round %s (< 50ms in every round: %s)\n",
		rounds, median(vsRef), verdict(median(vsRef) >= 1.5), median(vsArticle), verdict(median(vsArticle) >= 4),
		median(dbRatio), verdict(median(dbRatio) <= 0.6), median(totalRatio), verdict(median(totalRatio) <= 0.65),
		median(hotRatio), verdict(median(hotRatio) >= 0.8), ms(worst), verdict(worst < 50*time.Millisecond))
	return nil
}

// median of xs (the upper one of an even count).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// ready says whether the daemon consumes (GET /readyz answers 200).
func (d *daemon) ready() bool {
	resp, err := http.Get("http://" + d.httpAddr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
