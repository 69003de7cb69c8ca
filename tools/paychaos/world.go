package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/scratch"
)

// Servers the suite runs against; loopback only.
type servers struct {
	mysqlDSN  string // without database
	amqpURL   string // without vhost
	redisAddr string
}

// world is one scenario's isolated database, vhost and key prefix, with
// proxies in front of each server and the paysvc instances behind them.
type world struct {
	name     string
	srv      servers
	binary   string
	dir      string
	dbName   string
	database *scratch.Database
	db       *sqlx.DB
	admin    *sqlx.DB
	vhost    string
	amqpURL  string // direct, for publishing and inspecting
	rdb      *redis.Client
	prefix   string
	delays   []time.Duration // the wait queues' delays (PAYSVC_RETRY_DELAYS)
	// maxAttempts is PAYSVC_RETRY_MAXATTEMPTS; 0: 6.
	maxAttempts int
	// The instances' own MySQL user and Redis ACL user (name and
	// password; "" in the cluster suite), so that a fault meant for paysvc
	// hits only its connections, never the suite's or another client's of
	// the shared servers.
	user, password string

	toxi                   *toxiproxy.ApiServer
	mysqlProxy, redisProxy *toxiproxy.Proxy
	amqpProxy              *toxiproxy.Proxy
	commitCut              *commitCutter
	mu                     sync.Mutex // guards instances, stopping, and each instance's process
	instances              []*instance
	exits                  []exit // every exit before stopAll, in order
	stopping               bool
	hits                   int       // how often a fault hit paysvc, as the scenario counts it
	resumedAt              time.Time // SIGCONT of a stopped instance
	seeded                 bool      // accounts exist
	cluster                *cluster  // the cluster suite's servers; nil: the shared ones behind proxies
	notes                  []string  // what a scenario measured, for the report
	faultAt                time.Time // when the fault ended (or hit): evidence looks after it
	minority, majority     time.Time // the cluster lost and regained its majority
	// leaderKills counts, per queue, the kills of its leader's node after
	// which another node was elected its leader.
	leaderKills map[string]int
	galera      *galera // a Galera scenario's cluster (galera.go)
	// extraEnv, if set, is instance i's environment beyond env's (later
	// entries win): a Galera scenario's MySQL address.
	extraEnv func(i int) []string
	pair     *mariaPair // a failover scenario's primary, replica and proxy (failover.go)
	workload *workload  // what the suite publishes; a scenario that publishes more adds to it
}

// note records a measurement for the report.
func (w *world) note(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.notes = append(w.notes, fmt.Sprintf(format, args...))
}

func (w *world) markFault(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faultAt = t
}

func (w *world) markMinority(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.minority = t
}

func (w *world) markMajority(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.majority = t
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// defaultDelays are the wait queues' delays unless a scenario names others.
var defaultDelays = []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, time.Second}

func orDefault(delays []time.Duration) []time.Duration {
	if len(delays) == 0 {
		return defaultDelays
	}
	return delays
}

// newWorld makes a scenario's database, vhost, key prefix and proxies, and
// declares the topology with the wait queues of delays (nil: defaultDelays);
// on an error it removes what it made.
func newWorld(ctx context.Context, name string, delays []time.Duration, srv servers, binary, logDir string) (_ *world, err error) {
	w := &world{name: name, srv: srv, binary: binary, delays: orDefault(delays)}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if err := w.setup(ctx, logDir, srv.mysqlDSN); err != nil {
		return nil, err
	}
	if w.amqpURL, err = scratch.NewVhost(srv.amqpURL, w.vhost, "guest"); err != nil {
		return w, err
	}
	cfg, err := mysql.ParseDSN(srv.mysqlDSN)
	if err != nil {
		return w, err
	}
	w.rdb = redis.NewClient(&redis.Options{Addr: srv.redisAddr})
	if err := w.addUsers(ctx); err != nil {
		return w, err
	}

	w.toxi = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	u, _ := splitHostPort(srv.amqpURL)
	w.mysqlProxy = toxiproxy.NewProxy(w.toxi, "mysql", "127.0.0.1:0", cfg.Addr)
	w.redisProxy = toxiproxy.NewProxy(w.toxi, "redis", "127.0.0.1:0", srv.redisAddr)
	w.amqpProxy = toxiproxy.NewProxy(w.toxi, "amqp", "127.0.0.1:0", u)
	for _, p := range []*toxiproxy.Proxy{w.mysqlProxy, w.redisProxy, w.amqpProxy} {
		if err := p.Start(); err != nil {
			return w, fmt.Errorf("proxy %s: %w", p.Name, err)
		}
	}
	if w.commitCut, err = newCommitCutter(w.mysqlProxy.Listen); err != nil {
		return w, err
	}
	return w, w.declare()
}

// declare declares the topology up front, so that publishing can start
// before the instances do.
func (w *world) declare() error {
	conn, err := broker.Dial(w.amqpURL, "paychaos", nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return listener.Declare(ch, w.delays)
}

// setup names the world's database, vhost and key prefix, makes its log
// directory and its migrated database on the server of mysqlDSN.
func (w *world) setup(ctx context.Context, logDir, mysqlDSN string) error {
	id := strings.ReplaceAll(w.name, "-", "_") + "_" + randHex(3)
	w.dbName, w.vhost, w.prefix = "chaos_"+id, "chaos_"+id, "chaos:"+id+":"
	w.dir = filepath.Join(logDir, w.name+"-"+id[len(id)-6:])
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return err
	}
	d, err := scratch.NewDatabase(ctx, mysqlDSN, w.dbName, 8)
	if err != nil {
		return err
	}
	w.database, w.db, w.admin = d, d.DB, d.Admin()
	return nil
}

// newClusterWorld makes a scenario's database, vhost and key prefix on the
// cluster's own servers; the instances reach them directly (every broker
// node, the Sentinels), with no proxy.
func newClusterWorld(ctx context.Context, name string, delays []time.Duration, c *cluster, binary, logDir string) (_ *world, err error) {
	w := &world{name: name, binary: binary, cluster: c, delays: orDefault(delays)}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if err := w.setup(ctx, logDir, c.mysqlDSN()); err != nil {
		return nil, err
	}
	if err := c.addVhost(w.vhost); err != nil {
		return w, err
	}
	w.amqpURL = c.amqpURLs(w.vhost)
	w.rdb = c.redisClient()
	return w, w.declare()
}

func splitHostPort(amqpURL string) (string, error) {
	u := strings.TrimPrefix(strings.TrimPrefix(amqpURL, "amqp://"), "amqps://")
	if i := strings.Index(u, "@"); i >= 0 {
		u = u[i+1:]
	}
	if i := strings.Index(u, "/"); i >= 0 {
		u = u[:i]
	}
	_, _, err := net.SplitHostPort(u)
	return u, err
}

// addUsers creates the instances' own MySQL user (every right on the
// world's database) and Redis ACL user (every command and key: the
// instances use the world's prefix); close drops them.
func (w *world) addUsers(ctx context.Context) error {
	user, password := "chaos_"+randHex(4), randHex(12)
	if _, err := w.admin.ExecContext(ctx, fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", user, password)); err != nil {
		return fmt.Errorf("mysql user: %w", err)
	}
	w.user = user
	if _, err := w.admin.ExecContext(ctx, fmt.Sprintf("GRANT ALL ON `%s`.* TO '%s'@'%%'", w.dbName, user)); err != nil {
		return fmt.Errorf("mysql grant: %w", err)
	}
	if err := w.rdb.Do(ctx, "ACL", "SETUSER", user, "on", ">"+password, "~*", "&*", "+@all").Err(); err != nil {
		return fmt.Errorf("redis acl user: %w", err)
	}
	w.password = password
	return nil
}

// close stops everything and removes the database, vhost, keys and users.
func (w *world) close() {
	w.stopAll(15 * time.Second)
	if w.user != "" && w.admin != nil {
		w.admin.Exec(fmt.Sprintf("DROP USER IF EXISTS '%s'@'%%'", w.user))
	}
	if w.password != "" && w.rdb != nil {
		w.rdb.Do(context.Background(), "ACL", "DELUSER", w.user) // also disconnects its clients
	}
	if w.commitCut != nil {
		w.commitCut.close()
	}
	for _, p := range []*toxiproxy.Proxy{w.mysqlProxy, w.redisProxy, w.amqpProxy} {
		if p != nil {
			p.Stop()
		}
	}
	if w.database != nil {
		w.database.Close()
	}
	if w.cluster != nil {
		w.cluster.saveLogs(w.dir)
		w.cluster.deleteVhost(w.vhost)
	} else {
		scratch.DeleteVhost(w.vhost)
	}
	if w.rdb != nil {
		w.deleteKeys()
		w.rdb.Close()
	}
}

func (w *world) deleteKeys() { scratch.DeleteKeys(context.Background(), w.rdb, w.prefix) }

// instance is one paysvc process; the world restarts it when it dies, as an
// orchestrator would.
type instance struct {
	name    string
	env     []string
	oneShot []string // env for the first start only (a crash point)
	cmd     *exec.Cmd
	done    chan struct{}
	starts  int
	logPath string
	termAt  time.Time // when it was last sent SIGTERM (by a scenario)
}

func (w *world) env() []string {
	delays := make([]string, len(w.delays))
	for i, d := range w.delays {
		delays[i] = d.String()
	}
	var servers []string
	if c := w.cluster; c != nil {
		mcfg, _ := mysql.ParseDSN(c.mysqlDSN())
		mcfg.DBName = w.dbName
		servers = []string{
			"PAYSVC_AMQP_URL=" + w.amqpURL, // every node
			"PAYSVC_MYSQL_DSN=" + mcfg.FormatDSN(),
			"PAYSVC_REDIS_ADDR=" + strings.Join(c.sentinelAddrs(), ","),
			"PAYSVC_REDIS_MASTERNAME=" + masterName,
		}
	} else {
		mcfg, _ := mysql.ParseDSN(w.srv.mysqlDSN)
		mcfg.Addr, mcfg.DBName = w.commitCut.addr(), w.dbName
		mcfg.User, mcfg.Passwd = w.user, w.password
		servers = []string{
			"PAYSVC_AMQP_URL=" + strings.Replace(strings.TrimSuffix(w.srv.amqpURL, "/"), mustHost(w.srv.amqpURL), w.amqpProxy.Listen, 1) + "/" + w.vhost,
			"PAYSVC_MYSQL_DSN=" + mcfg.FormatDSN(),
			"PAYSVC_REDIS_ADDR=" + w.redisProxy.Listen,
			"PAYSVC_REDIS_USERNAME=" + w.user,
			"PAYSVC_REDIS_PASSWORD=" + w.password,
		}
	}
	return append(servers,
		"PATH="+os.Getenv("PATH"),
		"PAYSVC_IDEMPOTENT_KEYPREFIX="+w.prefix,
		"PAYSVC_IDEMPOTENT_LEASE=3s",
		"PAYSVC_MYSQL_LOCKWAITTIMEOUT=1s",
		"PAYSVC_MYSQL_IDLETRANSACTIONTIMEOUT=3s",
		"PAYSVC_RETRY_DELAYS="+strings.Join(delays, ","),
		"PAYSVC_RETRY_MAXATTEMPTS="+strconv.Itoa(cmp.Or(w.maxAttempts, 6)),
		"PAYSVC_AMQP_WORKERS=8",
		"PAYSVC_AMQP_PREFETCH=16",
		"PAYSVC_AMQP_DRAINTIMEOUT=10s",
		"PAYSVC_HTTP_ADDR=",
		"PAYSVC_METRICS_QUEUEINTERVAL=1s",
	)
}

func mustHost(u string) string {
	h, _ := splitHostPort(u)
	return h
}

// startInstances starts n instances; crash, if set, arms a crash point in the
// first instance's first run.
func (w *world) startInstances(n int, crash []string) error {
	for i := range n {
		in := &instance{name: fmt.Sprintf("%s-%d", w.name, i+1), env: w.env()}
		if w.extraEnv != nil {
			in.env = append(in.env, w.extraEnv(i)...)
		}
		if i == 0 {
			in.oneShot = crash
		}
		in.logPath = filepath.Join(w.dir, in.name+".log")
		w.mu.Lock()
		w.instances = append(w.instances, in)
		w.mu.Unlock()
		w.mu.Lock()
		err := w.start(in)
		w.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *world) start(in *instance) error {
	logf, err := os.OpenFile(in.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	env := in.env
	if in.starts == 0 {
		env = append(append([]string{}, env...), in.oneShot...)
	}
	cmd := exec.Command(w.binary, "run")
	name := in.name
	cmd.Env, cmd.Stdout, cmd.Stderr, cmd.Dir = env, logf, logf, w.dir
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	in.cmd, in.done, in.starts, in.termAt = cmd, make(chan struct{}), in.starts+1, time.Time{}
	done := in.done
	go func() {
		cmd.Wait()
		logf.Close()
		close(done)
		w.mu.Lock()
		restart := !w.stopping
		if restart {
			w.exits = append(w.exits, exitOf(name, cmd.ProcessState, in.termAt))
		}
		w.mu.Unlock()
		if restart {
			time.Sleep(300 * time.Millisecond)
			w.mu.Lock()
			if !w.stopping {
				w.start(in)
			}
			w.mu.Unlock()
		}
	}()
	return nil
}

// signal sends sig to instance i.
func (w *world) signal(i int, sig syscall.Signal) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i < len(w.instances) && w.instances[i].cmd != nil && w.instances[i].cmd.Process != nil {
		if sig == syscall.SIGTERM {
			w.instances[i].termAt = time.Now()
		}
		w.instances[i].cmd.Process.Signal(sig)
	}
}

// exit is how an instance ended before the suite stopped it.
type exit struct {
	name  string
	code  int    // -1 when killed by a signal
	sig   string // the signal that killed it, if one did
	drain time.Duration
	term  bool // it had been sent SIGTERM
}

func (e exit) String() string {
	if e.sig != "" {
		return fmt.Sprintf("%s killed by %s", e.name, e.sig)
	}
	if e.term {
		return fmt.Sprintf("%s exited %d %s after SIGTERM", e.name, e.code, e.drain.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s exited %d", e.name, e.code)
}

func exitOf(name string, ps *os.ProcessState, termAt time.Time) exit {
	e := exit{name: name, code: ps.ExitCode()}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		e.sig = ws.Signal().String()
	}
	if !termAt.IsZero() {
		e.term, e.drain = true, time.Since(termAt)
	}
	return e
}

// drainBound is how long a SIGTERMed instance may take to exit: its
// amqp.drainTimeout (10s) plus the bounded teardown waits.
const drainBound = 20 * time.Second

// unexpectedExits lists the exits a scenario did not intend: any, unless it
// crashes instances on purpose (allowed signals) or SIGTERMs them (those
// must exit 0 within drainBound).
func (w *world) unexpectedExits(allowSignals map[string]bool) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var bad []string
	for _, e := range w.exits {
		switch {
		case e.sig != "" && allowSignals[e.sig]:
		case e.term && e.sig == "" && e.code == 0 && e.drain <= drainBound:
		default:
			bad = append(bad, e.String())
		}
	}
	return bad
}

// stopAll sends SIGTERM (SIGCONT first, for a stopped one) and waits.
func (w *world) stopAll(within time.Duration) (clean bool) {
	w.mu.Lock()
	w.stopping = true
	ins := append([]*instance{}, w.instances...)
	w.mu.Unlock()
	clean = true
	for _, in := range ins {
		if in.cmd != nil && in.cmd.Process != nil {
			in.cmd.Process.Signal(syscall.SIGCONT)
			in.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.After(within)
	for _, in := range ins {
		if in.cmd == nil || in.done == nil {
			continue
		}
		select {
		case <-in.done:
			if in.cmd.ProcessState != nil && !in.cmd.ProcessState.Success() {
				clean = false
			}
		case <-deadline:
			in.cmd.Process.Kill()
			clean = false
		}
	}
	return clean
}

// hit records n hits of the scenario's fault.
func (w *world) hit(n int) {
	w.mu.Lock()
	w.hits += n
	w.mu.Unlock()
}

// killedExits counts the exits by SIGKILL (a crash point fired).
func (w *world) killedExits() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.exits {
		if e.sig == syscall.SIGKILL.String() {
			n++
		}
	}
	return n
}

// restarts counts instance starts beyond the first.
func (w *world) restarts() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, in := range w.instances {
		n += in.starts - 1
	}
	return n
}

// outcomes counts "message handled" results over every instance's log.
func (w *world) outcomes() map[string]int {
	n := map[string]int{}
	for _, e := range w.entries() {
		if e.str("msg") == "message handled" {
			n[e.str("result")]++
		}
	}
	return n
}

// commitCutter is a TCP proxy in front of MySQL that, when armed, drops the
// connection right after forwarding a COMMIT: the server may have committed,
// the client never hears. That is "commit outcome unknown".
type commitCutter struct {
	ln    net.Listener
	mu    sync.Mutex
	armed int // connections to cut, one COMMIT each
	cuts  int
}

func newCommitCutter(upstream string) (*commitCutter, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &commitCutter{ln: ln}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go c.pipe(client, upstream)
		}
	}()
	return c, nil
}

func (c *commitCutter) addr() string { return c.ln.Addr().String() }
func (c *commitCutter) close()       { c.ln.Close() }

func (c *commitCutter) arm(n int) {
	c.mu.Lock()
	c.armed += n
	c.mu.Unlock()
}

func (c *commitCutter) take() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armed > 0 {
		c.armed--
		c.cuts++
		return true
	}
	return false
}

func (c *commitCutter) pipe(client net.Conn, upstream string) {
	server, err := net.Dial("tcp", upstream)
	if err != nil {
		client.Close()
		return
	}
	go func() { io.Copy(client, server); client.Close(); server.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if _, werr := server.Write(buf[:n]); werr != nil {
				break
			}
			// COM_QUERY (0x03) "COMMIT": cut after forwarding it.
			if strings.Contains(string(buf[:n]), "\x03COMMIT") && c.take() {
				break
			}
		}
		if err != nil {
			break
		}
	}
	client.Close()
	server.Close()
}
