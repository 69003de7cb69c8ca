package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/testenv"
)

// Competing consumers in three processes, as the incident had: every payment
// published twice, one instance killed mid-stream so that its unacked
// messages are redelivered to the others. Every order is charged once.
func TestThreeInstancesCompetingConsumers(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const users, orders = 5, 1000
	for u := 1; u <= users; u++ {
		w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (?, 1000.00)", u)
	}
	var msgs [][]byte
	for i := range orders {
		no := fmt.Sprintf("T%04d", i)
		w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, 2.00)", no, i%users+1)
		msgs = append(msgs, payment(no, int64(i%users+1), "2.00"), payment(no, int64(i%users+1), "2.00"))
	}
	testenvDeclare(t, w.amqpURL)
	testenv.Publish(t, w.amqpURL, listener.MainQueue, msgs...)
	// Two workers paying alone each: slow enough that the backlog lasts.
	start := func() *proc { return w.start(w.env("PAYSVC_AMQP_WORKERS=2", "PAYSVC_MYSQL_GROUPSIZE=1"), "run") }
	// The victim starts first and holds unacked messages when it dies: the
	// broker must give them to the others, which start meanwhile.
	procs := []*proc{start()}
	testenv.Eventually(t, 20*time.Second, func() bool { return w.unackedBy(procs[0]) > 0 },
		"the instance to kill held no unacked message: the kill would prove nothing")
	procs = append(procs, start(), start())
	procs[0].cmd.Process.Signal(syscall.SIGKILL)
	// Paid, and every copy settled: duplicates that met an in-flight claim
	// wait in the wait queues before they are acked as duplicates.
	// Settled means: nothing ready or unacked in any of the queues, every
	// order paid, and so for longer than the longest wait queue's delay (a
	// copy on its way back from a wait queue is in no queue's count).
	queues := []string{listener.MainQueue, listener.WaitQueue(500 * time.Millisecond), listener.WaitQueue(time.Second)}
	var settledSince time.Time
	testenv.Eventually(t, 90*time.Second, func() bool {
		left := 0
		for _, q := range queues {
			left += testenv.Depth(t, w.amqpURL, q) + testenv.Held(t, w.amqpURL, q)
		}
		if left != 0 || w.count("SELECT COUNT(*) FROM t_order WHERE status = 'PAID'") != orders {
			settledSince = time.Time{}
			return false
		}
		if settledSince.IsZero() {
			settledSince = time.Now()
		}
		return time.Since(settledSince) > 2*time.Second
	}, "not every order paid and every copy settled by the surviving instances")
	for _, p := range procs[1:] {
		p.cmd.Process.Signal(syscall.SIGTERM)
		if err := p.wait(t, 30*time.Second); err != nil {
			t.Fatalf("SIGTERM exit: %v", err)
		}
	}
	if n := w.count("SELECT COUNT(*) FROM t_account_flow"); n != orders {
		t.Fatalf("%d flows for %d orders", n, orders)
	}
	if n := w.count("SELECT COUNT(*) FROM t_account WHERE balance <> 1000.00 - 2.00 * ?", orders/users); n != 0 {
		t.Fatalf("%d balances wrong", n)
	}
	for _, q := range queues {
		if d := testenv.Depth(t, w.amqpURL, q); d != 0 {
			t.Fatalf("%d messages left in %s", d, q)
		}
	}
}

// Redis through Sentinel (redis.addr = the sentinels, redis.masterName): a
// sentinel started for the test watches the real Redis.
func TestRedisSentinel(t *testing.T) {
	t.Parallel()
	testRedisSentinel(t, "")
}

// Sentinels that require a password of their own (requirepass) are given
// redis.sentinelPassword; the data node is still reached with
// redis.password (none here). go-redis sends the sentinels only their own
// credentials: without them every master lookup failed with NOAUTH.
func TestRedisSentinelWithAPassword(t *testing.T) {
	t.Parallel()
	testRedisSentinel(t, "sentinel-Pw-0f-test")
}

func testRedisSentinel(t *testing.T, password string) {
	w := newWorld(t)
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	master := "pm" + port
	rhost, rport, _ := net.SplitHostPort(testenv.RedisAddr())
	dir := t.TempDir()
	conf := fmt.Sprintf("port %s\nbind %s\nsentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 60000\n",
		port, host, master, rhost, rport, master)
	env := []string{"PAYSVC_REDIS_ADDR=" + addr, "PAYSVC_REDIS_MASTERNAME=" + master}
	if password != "" {
		conf += "requirepass " + password + "\n"
		env = append(env, "PAYSVC_REDIS_SENTINELPASSWORD="+password)
	}
	os.WriteFile(filepath.Join(dir, "sentinel.conf"), []byte(conf), 0o644)
	s := exec.Command("redis-server", filepath.Join(dir, "sentinel.conf"), "--sentinel")
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Process.Kill(); s.Wait() })
	waitPort(t, addr)
	if password != "" { // the premise: the sentinel refuses a client without it
		probe := redis.NewSentinelClient(&redis.Options{Addr: addr})
		defer probe.Close()
		if _, err := probe.GetMasterAddrByName(context.Background(), master).Result(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
			t.Fatalf("a sentinel with requirepass answered a client without a password: %v", err)
		}
	}

	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (84, 10.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('SEN1', 84, 1.00)")
	w.daemonInProcess(env...)
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("SEN1", 84, "1.00"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'SEN1' AND status = 'PAID'") == 1
	}, "payment not applied through Sentinel")
	// "done" is written just after the commit: wait for it, do not race it.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return w.rdb.Get(context.Background(), w.prefix+"SEN1").Val() == "done"
	}, "the key on the master never became done")
}

// amqp.url lists several nodes (here a dead one and two proxies before the
// one broker): paysvc connects to one that answers, says which on /readyz,
// and when that node goes away it moves to another for consuming, retry
// copies, notices and replays; the move is counted as a failover.
func TestSeveralBrokerAddresses(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	u, err := url.Parse(w.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	a, b := testenv.NewProxy(t, u.Host), testenv.NewProxy(t, u.Host)
	node := func(addr string) string { v := *u; v.Host = addr; return v.String() }
	urls := strings.Join([]string{node(freeAddr(t)), node(a.Addr()), node(b.Addr())}, ",")
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (85, 10.00), (86, 1.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('MN1', 85, 1.00), ('MN2', 85, 1.00), ('MN3', 86, 5.00)")
	httpAddr, _ := w.daemonInProcess("PAYSVC_AMQP_URL="+urls, "PAYSVC_RETRY_MAXATTEMPTS=1")
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("MN1", 85, "1.00"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'MN1' AND status = 'PAID'") == 1
	}, "payment not applied through the node list")
	_, body := readyz()
	on, other := a, b
	if strings.Contains(body, "broker node: "+b.Addr()) {
		on, other = b, a
	}
	if !strings.Contains(body, "broker node: "+on.Addr()) || !strings.Contains(body, "redis server: 127.0.0.1:6379") {
		t.Fatalf("/readyz says %q: want the node it uses and the Redis server", body)
	}
	on.Down() // that node dies
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, body := readyz()
		return code == 200 && strings.Contains(body, "broker node: "+other.Addr())
	}, "paysvc did not move to the other node")
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("MN2", 85, "1.00"), payment("MN3", 86, "5.00"))
	testenv.Eventually(t, 30*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'MN2' AND status = 'PAID'") == 1 &&
			w.count("SELECT COUNT(*) FROM t_outbox WHERE status = 'SENT'") == 2 &&
			w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'MN3'") == 1
	}, "payment, notices and the retried-then-parked copy did not go through the other node")
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsText, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metricsText), `paysvc_failovers_total{component="broker"} 1`) {
		t.Fatal("the move to another node was not counted in paysvc_failovers_total")
	}
	// A replay from the command line goes through the list too.
	w.db.MustExec("UPDATE t_account SET balance = 10.00 WHERE user_id = 86")
	var out lockedBuffer
	if err := run(context.Background(), []string{"dlq", "replay", "MN3", "--reason", "topped up"},
		w.env("USER=tester", "PAYSVC_AMQP_URL="+urls), &out); err != nil {
		t.Fatalf("replay through the node list: %v\n%s", err, out.String())
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'MN3' AND status = 'PAID'") == 1
	}, "the replayed payment was not applied")
}
