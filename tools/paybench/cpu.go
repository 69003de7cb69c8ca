package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// The server processes whose CPU a run is charged, by their command name,
// read from /proc like the yardstick's sampler does.
var servers = []string{"mariadbd", "beam.smp", "redis-server"}

// clockTick is USER_HZ: /proc/*/stat counts CPU in these.
const clockTick = 100

// procCPU sums utime+stime of every process, by command name.
func procCPU() map[string]time.Duration {
	out := map[string]time.Duration{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if name, cpu, ok := readStat(filepath.Join(d, "stat")); ok {
			out[name] += cpu
		}
	}
	return out
}

// pidCPU is one process's utime+stime.
func pidCPU(pid int) time.Duration {
	_, cpu, _ := readStat(fmt.Sprintf("/proc/%d/stat", pid))
	return cpu
}

func readStat(path string) (string, time.Duration, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || close < open {
		return "", 0, false
	}
	f := strings.Fields(s[close+1:])
	if len(f) < 13 {
		return "", 0, false
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return s[open+1 : close], time.Duration(utime+stime) * time.Second / clockTick, true
}

// cpuCost is the CPU a run used per payment, by process.
type cpuCost map[string]time.Duration

// costSince returns the CPU per payment since before (a procCPU snapshot)
// for the servers, and consumer as the consumer's own CPU.
func costSince(before map[string]time.Duration, consumer time.Duration, payments int) cpuCost {
	now := procCPU()
	c := cpuCost{"consumer": consumer / time.Duration(payments)}
	for _, s := range servers {
		c[s] = (now[s] - before[s]) / time.Duration(payments)
	}
	return c
}

func (c cpuCost) total() time.Duration {
	var t time.Duration
	for _, d := range c {
		t += d
	}
	return t
}

// String prints µs per payment: MariaDB, consumer, RabbitMQ, Redis, total.
func (c cpuCost) String() string {
	us := func(d time.Duration) int64 { return d.Microseconds() }
	return fmt.Sprintf("CPU µs/payment: mariadb %d, consumer %d, rabbitmq %d, redis %d, total %d",
		us(c["mariadbd"]), us(c["consumer"]), us(c["beam.smp"]), us(c["redis-server"]), us(c.total()))
}

// dbCounters are MariaDB's global counters a run is charged per payment:
// what the server was asked to do, next to what it cost. The rows read are
// the handler's reads by key, next in an index and in a table scan
// (MariaDB 10.11 has no Innodb_rows_read); the pages read from disk are
// Innodb_buffer_pool_reads.
var dbCounters = []string{"Questions", "Com_commit", "Handler_write", "Handler_update", "Handler_read_key", "Handler_read_next",
	"Handler_read_rnd_next", "Innodb_buffer_pool_reads", "Innodb_data_written", "Innodb_data_fsyncs", "Innodb_os_log_written"}

// dbStatus reads dbCounters (a failed read gives zeros: the figures are
// context, not the measurement).
func dbStatus(ctx context.Context, db *sqlx.DB) map[string]int64 {
	out := map[string]int64{}
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('"+strings.Join(dbCounters, "','")+"')")
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var v int64
		if rows.Scan(&k, &v) == nil {
			out[k] = v
		}
	}
	return out
}

// dbPerPayment prints the counters' growth since before, per payment.
func dbPerPayment(before, after map[string]int64, payments int) string {
	var b strings.Builder
	b.WriteString("MariaDB per payment:")
	for _, k := range dbCounters {
		fmt.Fprintf(&b, " %s %.2f", strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(k, "Innodb_"), "Com_"), "Handler_"), float64(after[k]-before[k])/float64(payments))
	}
	return b.String()
}
