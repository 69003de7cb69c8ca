package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// failoverScenarios run paysvc on a MariaDB primary with an asynchronous
// GTID replica behind a proxy, as a new user would, and fail over to a
// replica that lost acked payments.
var failoverScenarios = []scenario{
	{name: "db-failover-async-replica",
		faults: fmt.Sprintf("async replica's IO thread stopped, %d payments acked, primary SIGKILLed, replica promoted", failoverLost),
		inject: failoverLoss,
		verify: all(
			atLeast(failoverLost, "lost orders named in the log by a walk of the keys", lostNamed),
			exactly(failoverLost, "lost payments applied again where Redis said done (half by the producer's retry, half re-driven)",
				msg("redis and database disagree: key says done, order is not paid; applying")),
			atLeast(failoverLost, "duplicates of the lost payments (their last re-publish)", lostDuplicate)),
	},
}

// isFailoverScenario reports whether name runs on a primary and replica of
// its own (newFailoverWorld).
func isFailoverScenario(name string) bool {
	for _, s := range failoverScenarios {
		if s.name == name {
			return true
		}
	}
	return false
}

// failoverPairs starts a primary and replica per failover scenario (the
// scenario kills the primary) and stops them all at the end of the suite.
type failoverPairs struct{ started []*mariaPair }

func (ps *failoverPairs) start(ctx context.Context, c *cluster) (*mariaPair, error) {
	p, err := startPair(ctx, c)
	if p != nil {
		ps.started = append(ps.started, p)
	}
	return p, err
}

func (ps *failoverPairs) close() {
	for _, p := range ps.started {
		p.close()
	}
}

// newFailoverWorld makes a scenario's database on the pair's primary,
// reached by the proxy alone (paysvc and the suite), and its vhost and key
// prefix on the cluster's servers.
func newFailoverWorld(ctx context.Context, name string, delays []time.Duration, c *cluster, p *mariaPair, binary, logDir string) (_ *world, err error) {
	w := &world{name: name, binary: binary, cluster: c, pair: p, delays: orDefault(delays)}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if err := w.setup(ctx, logDir, p.dsn()); err != nil {
		return nil, err
	}
	if err := c.addVhost(w.vhost); err != nil {
		return w, err
	}
	w.amqpURL = c.amqpURLs(w.vhost)
	w.rdb = c.redisClient()
	w.extraEnv = func(int) []string {
		cfg, _ := mysql.ParseDSN(p.dsn())
		cfg.DBName = w.dbName
		return []string{"PAYSVC_MYSQL_DSN=" + cfg.FormatDSN()}
	}
	return w, w.declare()
}

// failoverLost is how many acked payments the failover loses.
const failoverLost = 100

// lostNamed matches a sweeper's line naming a lost order.
func lostNamed(e entry) bool { return strings.HasPrefix(e.str("msg"), "payment lost: ") }

// lostDuplicate matches a lost payment's message answered as a duplicate.
func lostDuplicate(e entry) bool {
	return handled("DUPLICATE")(e) && strings.HasPrefix(e.str("order_no"), "FL")
}

// exactly is a verify: exactly n log entries match.
func exactly(n int, what string, match func(entry) bool) func(context.Context, *world, *workload) (bool, string) {
	return func(_ context.Context, w *world, _ *workload) (bool, string) {
		got := count(w.entries(), match)
		return got == n, fmt.Sprintf("%d %s (want %d)", got, what, n)
	}
}

// failoverLoss is a failover as a new user meets it: the suite's load paid
// on the primary and replicated; the replica's IO thread stopped; more payments
// paid and acked on the primary alone; the primary SIGKILLed, the replica
// promoted (STOP SLAVE; RESET SLAVE ALL; read_only off) and the proxy
// pointed at it. Then what the loss looks like, and the recovery: the
// producer sends half of the lost payments again (each applied once: a done
// key on an INIT order is no duplicate); paysvc reconcile lists exactly the
// other half, from the done keys and from the notices; reconcile --fix
// re-drives them, each applied once; reconcile is then clean; and every
// lost payment published once more is a duplicate.
func failoverLoss(ctx context.Context, w *world, rng *rand.Rand) (int, error) {
	p, wl := w.pair, w.workload
	if err := waitFor(ctx, 120*time.Second, "the suite's load settled", func() bool {
		ok, _ := w.settled(ctx, wl, false)
		return ok
	}); err != nil {
		return 0, err
	}
	// The payments to lose: their orders exist on both servers.
	lost := make([]order, failoverLost)
	for i := range lost {
		lost[i] = order{no: fmt.Sprintf("FL%05d", i), user: int64(rng.IntN(users) + 1), amount: money.Cents(rng.IntN(9999) + 1)}
		if err := w.insertOrder(ctx, lost[i]); err != nil {
			return 0, err
		}
		wl.orders[lost[i].no] = lost[i]
		wl.payable = append(wl.payable, lost[i].no)
	}
	if err := p.sync(ctx); err != nil {
		return 0, err
	}
	if _, err := p.replica.db.ExecContext(ctx, "STOP SLAVE IO_THREAD"); err != nil {
		return 0, err
	}
	w.note("replica's IO thread stopped after %d orders replicated", len(wl.orders))
	bodies := make([][]byte, len(lost))
	for i, o := range lost {
		bodies[i] = []byte(fmt.Sprintf(`{"orderNo":%q,"userId":%d,"amount":"%s"}`, o.no, o.user, o.amount))
	}
	if _, err := w.publish(ctx, bodies, nil, 2, 0); err != nil {
		return 0, err
	}
	// Paid and acked on the primary: PAID, every queue empty (nothing in a
	// worker's hands), every done key written.
	if err := waitFor(ctx, 60*time.Second, "the payments to lose paid and acked", func() bool {
		return w.paid(ctx, lost) == len(lost) && w.queuesEmpty() && w.doneKeys(ctx, lost) == len(lost)
	}); err != nil {
		return 0, err
	}

	killed := time.Now()
	w.cluster.kill(p.primary.d, syscall.SIGKILL)
	if err := p.promote(ctx); err != nil {
		return 1, err
	}
	p.proxy.point(p.replica.addr())
	w.note("primary SIGKILLed, replica promoted and the proxy moved in %s", time.Since(killed).Round(10*time.Millisecond))
	w.markFault(time.Now())

	// The loss, from the suite's own reading: on the new primary the
	// orders are INIT with no flow and no notice, the balances without
	// them; Redis still says done.
	var paid, flows, notices int
	w.db.GetContext(ctx, &paid, "SELECT COUNT(*) FROM t_order WHERE order_no LIKE 'FL%' AND status <> 'INIT'")
	w.db.GetContext(ctx, &flows, "SELECT COUNT(*) FROM t_account_flow WHERE biz_no LIKE 'FL%'")
	w.db.GetContext(ctx, &notices, "SELECT COUNT(*) FROM t_outbox WHERE biz_no LIKE 'FL%'")
	if paid+flows+notices != 0 || w.doneKeys(ctx, lost) != len(lost) {
		return 1, fmt.Errorf("after the failover: %d lost orders not INIT, %d flows, %d notices, %d done keys of %d: the loss is not what the scenario makes",
			paid, flows, notices, w.doneKeys(ctx, lost), len(lost))
	}
	// paysvc notices: a walk of the keys names every lost order.
	if err := waitFor(ctx, 60*time.Second, "every lost order named in the instances' logs", func() bool {
		return len(w.named(lostNamed)) >= len(lost)
	}); err != nil {
		return 1, err
	}
	w.note("every lost order named in the log %s after the failover", time.Since(killed).Round(100*time.Millisecond))
	out, _, err := w.paysvc(ctx, "trace", lost[0].no)
	if err != nil || !strings.Contains(out, "while its Redis key says done") {
		return 1, fmt.Errorf("paysvc trace %s: %v\n%s", lost[0].no, err, out)
	}

	// The producer sends half again: applied once each.
	retried, redriven := lost[:len(lost)/2], lost[len(lost)/2:]
	if _, err := w.publish(ctx, bodies[:len(retried)], nil, 2, 0); err != nil {
		return 1, err
	}
	if err := waitFor(ctx, 60*time.Second, "the payments sent again applied", func() bool { return w.paid(ctx, retried) == len(retried) }); err != nil {
		return 1, err
	}

	// paysvc reconcile finds exactly the other half, from the done keys
	// and from the notices.
	want := orderNos(redriven)
	if err := w.reconcileLost(ctx, want, 0, "reconcile", "--output", "json"); err != nil {
		return 1, err
	}
	file, err := filepath.Abs(filepath.Join(w.dir, "notices.jsonl"))
	if err != nil {
		return 1, err
	}
	n, err := w.drainNotices(file)
	if err != nil {
		return 1, err
	}
	if err := w.reconcileLost(ctx, want, 0, "reconcile", "--skip-redis", "--notices", file, "--output", "json"); err != nil {
		return 1, err
	}
	w.note("reconcile found the %d lost payments not sent again, from the done keys and from %d notices", len(want), n)

	// Re-driven, each applied once.
	if err := w.reconcileLost(ctx, want, len(want), "reconcile", "--fix", "--operator", "paychaos",
		"--reason", "failover to a replica that missed commits", "--rate", "200", "--output", "json"); err != nil {
		return 1, err
	}
	if err := waitFor(ctx, 60*time.Second, "the re-driven payments applied", func() bool { return w.paid(ctx, lost) == len(lost) }); err != nil {
		return 1, err
	}
	if out, code, err := w.paysvc(ctx, "reconcile"); code != 0 || err != nil {
		return 1, fmt.Errorf("reconcile after the re-drive: exit %d, %v\n%s", code, err, out)
	}
	// The producer sends every lost payment once more: duplicates all.
	if _, err := w.publish(ctx, bodies, nil, 2, 0); err != nil {
		return 1, err
	}
	return 1, waitFor(ctx, 60*time.Second, "the last re-publish answered", func() bool {
		return w.queuesEmpty() && count(w.entries(), lostDuplicate) >= len(lost)
	})
}

func orderNos(os []order) []string {
	out := make([]string, len(os))
	for i, o := range os {
		out[i] = o.no
	}
	slices.Sort(out)
	return out
}

// waitFor polls cond until it holds or within passes.
func waitFor(ctx context.Context, within time.Duration, what string, cond func() bool) error {
	for deadline := time.Now().Add(within); !cond(); {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %s", within, what)
		}
		if !at(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// paid counts the orders of os that are PAID.
func (w *world) paid(ctx context.Context, os []order) int {
	q, args, err := sqlx.In("SELECT COUNT(*) FROM t_order WHERE status = 'PAID' AND order_no IN (?)", orderNos(os))
	if err != nil {
		return -1
	}
	var n int
	if w.db.GetContext(ctx, &n, q, args...) != nil {
		return -1
	}
	return n
}

// doneKeys counts the orders of os whose Redis key says done.
func (w *world) doneKeys(ctx context.Context, os []order) int {
	pipe := w.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(os))
	for i, o := range os {
		cmds[i] = pipe.Get(ctx, w.prefix+o.no)
	}
	pipe.Exec(ctx)
	n := 0
	for _, c := range cmds {
		if c.Val() == "done" {
			n++
		}
	}
	return n
}

// queuesEmpty reports whether every paysvc queue holds nothing, ready or
// in a consumer's hands.
func (w *world) queuesEmpty() bool {
	depths, err := w.depths()
	if err != nil {
		return false
	}
	for _, d := range depths {
		if d != 0 {
			return false
		}
	}
	return true
}

// named lists the distinct order numbers of the log entries match takes.
func (w *world) named(match func(entry) bool) map[string]bool {
	out := map[string]bool{}
	for _, e := range w.entries() {
		if match(e) {
			out[e.str("order_no")] = true
		}
	}
	return out
}

// paysvc runs an operator command with the instances' configuration and
// returns its standard output and exit status.
func (w *world) paysvc(ctx context.Context, args ...string) (string, int, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, w.binary, args...)
	cmd.Env, cmd.Dir = append(w.env(), w.extraEnv(0)...), w.dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return stdout.String() + stderr.String(), exit.ExitCode(), nil
	}
	return stdout.String() + stderr.String(), 0, err
}

// reconcileLost runs paysvc reconcile with --output json among args and
// checks it exits 2 with exactly want as its lost payments, fixed of them
// re-driven by this run.
func (w *world) reconcileLost(ctx context.Context, want []string, fixed int, args ...string) error {
	out, code, err := w.paysvc(ctx, args...)
	if err != nil {
		return err
	}
	var rep struct {
		Problems []struct {
			Kind    string `json:"kind"`
			OrderNo string `json:"order_no"`
			Fixed   bool   `json:"fixed"`
		} `json:"problems"`
	}
	if jerr := json.NewDecoder(strings.NewReader(out)).Decode(&rep); jerr != nil {
		return fmt.Errorf("paysvc %s: %v\n%s", strings.Join(args, " "), jerr, out)
	}
	var got []string
	var others []string
	n := 0
	for _, p := range rep.Problems {
		if p.Kind != "lost_payment" {
			others = append(others, p.Kind+" "+p.OrderNo)
			continue
		}
		got = append(got, p.OrderNo)
		if p.Fixed {
			n++
		}
	}
	slices.Sort(got)
	if code != 2 || !slices.Equal(got, want) || n != fixed || len(others) > 0 {
		return fmt.Errorf("paysvc %s: exit %d, %d lost payments %v, %d re-driven, other findings %v; want exit 2, the %d not sent again %v, %d re-driven",
			strings.Join(args, " "), code, len(got), first(got, 3), n, others, len(want), first(want, 3), fixed)
	}
	return nil
}

// drainNotices takes every notice in q.pay.notify into file, one body a
// line: the copy of the notice stream an operator points reconcile at.
func (w *world) drainNotices(file string) (int, error) {
	conn, err := broker.Dial(w.amqpURL, "paychaos notices", nil)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	var b bytes.Buffer
	n := 0
	for {
		d, ok, err := ch.Get(outbox.Queue, true)
		if err != nil {
			return n, err
		}
		if !ok {
			break
		}
		b.Write(d.Body)
		b.WriteByte('\n')
		n++
	}
	return n, os.WriteFile(file, b.Bytes(), 0o644)
}

// mariaPair is a primary and an asynchronous GTID replica, each a mariadbd
// of its own on a loopback port (Debian's mariadb-server), and a proxy in
// front that paysvc and the suite reach the primary by.
type mariaPair struct {
	dir              string
	cluster          *cluster
	primary, replica *mariaNode
	proxy            *switchProxy
}

type mariaNode struct {
	d  *daemon
	db *sqlx.DB // root, no database
}

func (n *mariaNode) addr() string { return fmt.Sprintf("127.0.0.1:%d", n.d.port) }

// dsn is the proxy's, without a database.
func (p *mariaPair) dsn() string { return "root@tcp(" + p.proxy.addr() + ")/" }

// startPair starts the primary and the replica, replicating with GTIDs
// (MASTER_USE_GTID=slave_pos), and the proxy on the primary. On an error
// what started is stopped by close.
func startPair(ctx context.Context, c *cluster) (*mariaPair, error) {
	dir, err := os.MkdirTemp(c.dir, "failover-")
	if err != nil {
		return nil, err
	}
	p := &mariaPair{dir: dir, cluster: c}
	for i, name := range []string{"primary", "replica"} {
		n, err := p.startNode(ctx, name, i+1)
		if err != nil {
			return p, fmt.Errorf("%s: %w", name, err)
		}
		if i == 0 {
			p.primary = n
		} else {
			p.replica = n
		}
	}
	if _, err := p.replica.db.ExecContext(ctx, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%d, "+
		"MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos", p.primary.d.port)); err != nil {
		return p, fmt.Errorf("replica: %w", err)
	}
	if _, err := p.replica.db.ExecContext(ctx, "START SLAVE"); err != nil {
		return p, fmt.Errorf("replica: %w", err)
	}
	if p.proxy, err = newSwitchProxy(p.primary.addr()); err != nil {
		return p, err
	}
	return p, p.sync(ctx)
}

// startNode installs and starts one server: binary log and GTIDs on both
// (a replica promoted is a primary); the replica starts read-only.
func (p *mariaPair) startNode(ctx context.Context, name string, serverID int) (*mariaNode, error) {
	dir := filepath.Join(p.dir, name)
	if out, err := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+dir+"/data",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mariadb-install-db: %v: %s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	argv := []string{"mariadbd", "--no-defaults", "--datadir=" + dir + "/data", "--port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket=" + dir + "/sock", "--pid-file=" + dir + "/pid",
		"--innodb-buffer-pool-size=64M", "--user=root", "--server-id=" + strconv.Itoa(serverID),
		"--log-bin=" + dir + "/binlog", "--binlog-format=ROW", "--log-slave-updates"}
	if name == "replica" {
		argv = append(argv, "--read-only=1")
	}
	n := &mariaNode{d: &daemon{name: "failover-" + name, port: port, argv: argv}}
	if err := p.cluster.start(ctx, n.d); err != nil {
		return nil, err
	}
	if n.db, err = sqldb.Open(ctx, "root@tcp("+n.addr()+")/", 2); err != nil {
		return n, err
	}
	return n, nil
}

// sync waits until the replica has applied everything the primary wrote.
func (p *mariaPair) sync(ctx context.Context) error {
	var pos string
	if err := p.primary.db.GetContext(ctx, &pos, "SELECT @@gtid_binlog_pos"); err != nil {
		return err
	}
	var r int
	if err := p.replica.db.GetContext(ctx, &r, "SELECT MASTER_GTID_WAIT(?, 60)", pos); err != nil {
		return err
	}
	if r != 0 {
		return fmt.Errorf("the replica did not reach the primary's GTID position %s within 60s", pos)
	}
	return nil
}

// promote makes the replica a primary: replication stopped and forgotten,
// writes taken.
func (p *mariaPair) promote(ctx context.Context) error {
	for _, q := range []string{"STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0"} {
		if _, err := p.replica.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("promote: %s: %w", q, err)
		}
	}
	return nil
}

// close stops both servers and the proxy and removes their files.
func (p *mariaPair) close() {
	if p.proxy != nil {
		p.proxy.close()
	}
	for _, n := range []*mariaNode{p.primary, p.replica} {
		if n != nil {
			if n.db != nil {
				n.db.Close()
			}
			p.cluster.kill(n.d, syscall.SIGKILL)
		}
	}
	os.RemoveAll(p.dir)
}

// switchProxy forwards each connection to the server it points at; point
// moves it to another and closes every connection it carries, as a load
// balancer's failover does (HAProxy's on-marked-down shutdown-sessions).
type switchProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  map[net.Conn]bool
}

func newSwitchProxy(target string) (*switchProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &switchProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
	return p, nil
}

func (p *switchProxy) addr() string { return p.ln.Addr().String() }

func (p *switchProxy) pipe(client net.Conn) {
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	server, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	if p.target != target { // moved while dialling
		p.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	p.conns[client], p.conns[server] = true, true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, client)
		delete(p.conns, server)
		p.mu.Unlock()
		client.Close()
		server.Close()
	}()
	go func() { io.Copy(server, client); server.Close() }()
	io.Copy(client, server)
}

// point sends new connections to target and closes the ones open.
func (p *switchProxy) point(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
	}
}

func (p *switchProxy) close() {
	p.ln.Close()
	p.point("")
}
