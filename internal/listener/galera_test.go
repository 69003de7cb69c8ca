package listener_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/testenv"
)

// notReady is the error a Galera node that is not ready answers (a joiner,
// a node cut off from the primary component), raised by SIGNAL in place of
// the statement.
const notReady = "SIGNAL SQLSTATE '08S01' SET MYSQL_ERRNO = 1047, " +
	"MESSAGE_TEXT = 'WSREP has not yet prepared node for application use'"

// Behind a proxy that spreads connections over a Galera cluster's nodes
// with a plain TCP check, the payment may reach a node that is not ready
// (1047) while the probe reaches one that is. The node, not the message,
// failed: the message is held and tried again until it goes through, and
// never goes back alone, spends an attempt or reaches the terminal queue.
// Here the proxy answers 1047 to every payment statement for 4 s, well past
// the three requeues alone a message may take before it spends an attempt.
func TestNodeNotReadyHoldsEvenWhenTheProbePasses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mysqlProxy, dsn := testenv.MySQLProxy(t, e.dsn)
	e.seedAccount(93, "100.00")
	const n = 12
	msgs := e.seedOrders("GNR%02d", 93, n)
	c := e.start(e.redisAddr, dsn)
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
	payment := func(toServer []byte) bool { return bytes.Contains(toServer, []byte("PAY_DEDUCT")) }
	mysqlProxy.ReplaceWhen(payment, notReady)
	e.publish(msgs...)
	time.Sleep(4 * time.Second)
	mysqlProxy.ReplaceWhen(nil, "")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.totalFlows() == n && e.depth(listener.MainQueue) == 0 },
		"not every payment applied once the node is ready")
	if r := e.results(); r["REQUEUE"] != 0 || r["RETRY"] != 0 || r["TERMINAL"] != 0 || r["FIRST"] != n {
		t.Fatalf("outcomes %v; want %d FIRST and nothing sent back, retried or parked", r, n)
	}
	if e.depth(listener.TerminalQueue) != 0 || e.balance(93) != 10000-n*100 {
		t.Fatalf("terminal queue %d, balance %s", e.depth(listener.TerminalQueue), e.balance(93))
	}
	for i := range n {
		if no := fmt.Sprintf("GNR%02d", i); e.status(no) != order.Paid || e.flows(no) != 1 {
			t.Fatalf("%s: %s with %d flows", no, e.status(no), e.flows(no))
		}
	}
	held := 0
	for _, entry := range e.logs.FilterMessage("consumption paused; waiting for the dependency").All() {
		if entry.ContextMap()["reason"] == "mysql_node_not_ready" {
			held++
		}
	}
	if held == 0 {
		t.Error("no pause for mysql_node_not_ready logged: the fault never hit")
	}
}

// Two processes of one host share their write probe's row; probing through
// two Galera nodes at once, one probe loses the certification (1213). A
// write the server certified is a server that takes writes: the consumer
// starts and pays, it does not wait for a probe that wins.
func TestProbeThatLosesACertificationIsUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mysqlProxy, dsn := testenv.MySQLProxy(t, e.dsn)
	mysqlProxy.ReplaceWhen(func(toServer []byte) bool { return bytes.Contains(toServer, []byte("t_write_probe")) },
		"SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'Deadlock found when trying to get lock; try restarting transaction'")
	e.seedAccount(94, "10.00")
	msgs := e.seedOrders("GPD%02d", 94, 2)
	c := e.start(e.redisAddr, dsn)
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready: a probe that lost a certification held it")
	e.publish(msgs...)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.totalFlows() == 2 }, "payments not applied")
}

// No payment locks the rows the write probe writes: a probe that waits out
// the lock wait bound on them (1205) waits on another instance's probe of
// the same name whose commit does not come. That is a server that does not
// commit writes, and the consumer says so, not that MySQL does not answer.
func TestProbeLockWaitIsAWriteStall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mysqlProxy, dsn := testenv.MySQLProxy(t, e.dsn)
	mysqlProxy.ReplaceWhen(func(toServer []byte) bool { return bytes.Contains(toServer, []byte("t_write_probe")) },
		"SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205, MESSAGE_TEXT = 'Lock wait timeout exceeded; try restarting transaction'")
	c := e.start(e.redisAddr, dsn)
	waiting := func() bool {
		for _, entry := range e.logs.FilterMessage("dependency unavailable; not consuming").All() {
			if msg, _ := entry.ContextMap()["error"].(string); strings.HasPrefix(msg, "MySQL does not commit writes: ") {
				return true
			}
		}
		return false
	}
	testenv.Eventually(t, 10*time.Second, waiting, "no wait for a write stall logged: %v", e.logs.FilterMessage("dependency unavailable; not consuming").All())
	if c.Ready() {
		t.Fatal("ready while the write probe cannot commit")
	}
	mysqlProxy.ReplaceWhen(nil, "")
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer not ready once the probe commits")
}
