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
}

// preloaded makes a bed with n fresh orders and their messages (a share
// published twice) waiting in q.pay.success, as every compared run gets.
func preloaded(ctx context.Context, o *options, name string, n int) (*bed, int, error) {
	b, err := newBed(ctx, o, name)
	if err != nil {
		return nil, 0, err
	}
	pays, err := b.seed(ctx, n, o.users, 0, 0)
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
	b, msgs, err := preloaded(ctx, o, fmt.Sprintf("ref%d", workers), n)
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

// measureDaemon drains n payments with the real paysvc binary on its
// defaults (notices, trace, monitor and all), from the moment it starts to
// the moment every message is handled and every notice published; the
// daemon's CPU is its process's.
func measureDaemon(ctx context.Context, o *options, n int, extraEnv ...string) (measured, error) {
	b, msgs, err := preloaded(ctx, o, "paysvc", n)
	if err != nil {
		return measured{}, err
	}
	defer b.close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return measured{}, err
	}
	httpAddr := ln.Addr().String()
	ln.Close()
	logPath := filepath.Join(os.TempDir(), fmt.Sprintf("paybench-paysvc-%d.log", os.Getpid()))
	logf, err := os.Create(logPath)
	if err != nil {
		return measured{}, err
	}
	defer logf.Close()
	cmd := exec.Command(o.paysvcBinary, "run")
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"PAYSVC_AMQP_URL=" + b.amqpURL,
		"PAYSVC_MYSQL_DSN=" + b.DSN,
		"PAYSVC_REDIS_ADDR=" + o.redisAddr,
		"PAYSVC_IDEMPOTENT_KEYPREFIX=" + b.prefix,
		"PAYSVC_HTTP_ADDR=" + httpAddr,
	}, extraEnv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	status0 := dbStatus(ctx, b.DB)
	before, start := procCPU(), time.Now()
	if err := cmd.Start(); err != nil {
		return measured{}, fmt.Errorf("start %s: %w", o.paysvcBinary, err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	deadline := time.Now().Add(time.Duration(msgs/20+60) * time.Second)
	for {
		handled, _ := handledMessages(httpAddr)
		if handled >= msgs {
			var pending int
			if err := b.DB.GetContext(ctx, &pending, "SELECT COUNT(*) FROM t_outbox WHERE status = 'PENDING'"); err == nil && pending == 0 {
				break
			}
		}
		if cmd.ProcessState != nil || time.Now().After(deadline) {
			return measured{}, fmt.Errorf("paysvc: %d of %d messages handled before the deadline (log %s)", handled, msgs, logPath)
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	m := measured{payments: n, msgs: msgs, rate: float64(msgs) / elapsed.Seconds(),
		cost: costSince(before, pidCPU(cmd.Process.Pid), n), db: dbPerPayment(status0, dbStatus(ctx, b.DB), n)}
	var paid int
	b.DB.GetContext(ctx, &paid, "SELECT COUNT(*) FROM t_order WHERE status = 'PAID'")
	if paid != n {
		return m, fmt.Errorf("paysvc: %d of %d orders paid", paid, n)
	}
	os.Remove(logPath)
	return m, nil
}

// handledMessages sums paysvc_messages_total from the daemon's /metrics.
func handledMessages(addr string) (int, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	total := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "paysvc_messages_total{") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				total += int(v)
			}
		}
	}
	return total, sc.Err()
}

// compare runs, rounds times and interleaved, the reference consumer (32
// goroutines, prefetch 200), the paysvc daemon on its defaults, and the
// reference at the article's configuration (1 goroutine, prefetch 10, a
// quarter of the payments), then prints the medians of the per-round
// ratios the performance issue sets its targets on.
func compare(ctx context.Context, o *options, rounds int, row func(string, float64, string)) error {
	var vsRef, vsArticle, dbRatio, totalRatio []float64
	for i := 1; i <= rounds; i++ {
		ref, err := measureReference(ctx, o, 32, 200, o.n)
		if err != nil {
			return err
		}
		row(fmt.Sprintf("round %d: reference consumer (32 goroutines, prefetch 200), %d msgs", i, ref.msgs), ref.rate, ref.cost.String()+"; "+ref.db)
		psv, err := measureDaemon(ctx, o, o.n)
		if err != nil {
			return err
		}
		row(fmt.Sprintf("round %d: paysvc daemon, defaults, %d msgs", i, psv.msgs), psv.rate, psv.cost.String()+"; "+psv.db)
		art, err := measureReference(ctx, o, 1, 10, o.n/4)
		if err != nil {
			return err
		}
		row(fmt.Sprintf("round %d: reference at the article's config (1 goroutine, prefetch 10), %d msgs", i, art.msgs), art.rate, art.cost.String()+"; "+art.db)
		r := []float64{psv.rate / ref.rate, psv.rate / art.rate,
			float64(psv.cost["mariadbd"]) / float64(ref.cost["mariadbd"]), float64(psv.cost.total()) / float64(ref.cost.total())}
		vsRef, vsArticle, dbRatio, totalRatio = append(vsRef, r[0]), append(vsArticle, r[1]), append(dbRatio, r[2]), append(totalRatio, r[3])
		fmt.Printf("round %d: paysvc %.2fx the reference, %.2fx the article config; CPU per payment: MariaDB %.2fx, total %.2fx the reference's\n",
			i, r[0], r[1], r[2], r[3])
	}
	fmt.Printf("median of %d rounds: paysvc %.2fx the reference (target >= 1.5), %.2fx the article config (>= 4); "+
		"CPU per payment: MariaDB %.2fx (<= 0.6), total %.2fx (<= 0.65) the reference's\n",
		rounds, median(vsRef), median(vsArticle), median(dbRatio), median(totalRatio))
	return nil
}

// median of xs (the upper one of an even count).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
