package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// galera is a 3-node MariaDB Galera cluster (galera-4, rsync state
// transfer) behind HAProxy, on loopback ports of its own, as Debian's
// packages install it: the cluster suite's Galera scenarios run against it.
// It is started by the first such scenario and stopped with the cluster.
//
// HAProxy has three frontends, each a way teams run it:
//
//   - synced: one writer (node 1) and two backups, with a health check
//     that passes only Synced nodes (an HTTP check served here per node,
//     as clustercheck does); a node marked down has its sessions shut;
//   - spread: round robin over the three nodes, the same check;
//   - tcp: one writer and two backups with a plain TCP check, which
//     passes a node that is not Synced (a donor, a joiner, a node cut off
//     from the primary component).
//
// In synced and tcp, the writer marked up again shuts the backups'
// sessions (on-marked-up shutdown-backup-sessions), so that writes return
// to one node. The nodes run as the mysql user (rsync state transfer
// refuses root). A state transfer can be held: rsync, as the donor runs it
// once it holds its global read lock, waits while sst-hold exists (the
// donor stays Donor/Desynced with writes blocked). A node that rejoins by
// incremental state transfer opens its port before it has applied what it
// missed (its wsrep_ready OFF: 1047 to every statement on a table).
type galera struct {
	dir    string
	uid    int
	gid    int
	nodes  []*galeraNode
	fronts map[string]int // frontend → port
	proxy  *exec.Cmd
	sock   string // HAProxy's runtime API
	checks []*http.Server
	spawn  func(cmd *exec.Cmd, name string) error
	base   []counters // every node's at the scenario's start
	hook   *alertHook // the scenario's webhook, if any
}

// A galeraNode is one mariadbd of the cluster.
type galeraNode struct {
	name   string // n1
	port   int    // SQL
	gcomm  int    // group communication
	ist    int    // incremental state transfer
	sst    int    // rsync state transfer
	check  int    // HTTP health check: 200 while Synced
	dir    string
	cmd    *exec.Cmd
	db     *sql.DB // root, for the suite's looks and faults
	starts int     // starts since the scenario's baseline
}

// The HAProxy frontends.
const (
	frontSynced = "synced"
	frontSpread = "spread"
	frontTCP    = "tcp"
)

// startGalera bootstraps node 1, joins nodes 2 and 3 by state transfer and
// starts HAProxy in front of them.
func startGalera(ctx context.Context, dir string, spawn func(*exec.Cmd, string) error) (g *galera, err error) {
	g = &galera{dir: dir, fronts: map[string]int{}, spawn: spawn}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	u, err := user.Lookup("mysql")
	if err != nil {
		return g, fmt.Errorf("the mysql user (Debian's mariadb-server makes it): %w", err)
	}
	g.uid, _ = strconv.Atoi(u.Uid)
	g.gid, _ = strconv.Atoi(u.Gid)
	for _, bin := range []string{"mariadbd", "haproxy", "rsync", "/usr/lib/galera/libgalera_smm.so"} {
		if _, err := exec.LookPath(bin); err != nil {
			if _, serr := os.Stat(bin); serr != nil {
				return g, fmt.Errorf("%s not found (apt-get install mariadb-server galera-4 rsync haproxy): %w", bin, err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return g, err
	}
	// rsync as the state transfer script runs it: the donor's copy waits
	// while sst-hold exists (its global read lock held), the joiner's
	// daemon never does.
	shim := fmt.Sprintf("#!/bin/sh\ncase \" $* \" in *\" --daemon \"*) ;; *) while [ -e %s ]; do sleep 0.2; done ;; esac\nexec /usr/bin/rsync \"$@\"\n",
		filepath.Join(dir, "sst-hold"))
	if err := os.WriteFile(filepath.Join(dir, "bin", "rsync"), []byte(shim), 0o755); err != nil {
		return g, err
	}
	for i := range 3 {
		n := &galeraNode{name: fmt.Sprintf("n%d", i+1), dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
		for _, p := range []*int{&n.port, &n.gcomm, &n.ist, &n.sst, &n.check} {
			if *p, err = freePort(); err != nil {
				return g, err
			}
		}
		if err := os.MkdirAll(filepath.Join(n.dir, "data"), 0o755); err != nil {
			return g, err
		}
		g.nodes = append(g.nodes, n)
	}
	if err := g.chown(dir); err != nil {
		return g, err
	}
	install := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+filepath.Join(g.nodes[0].dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db")
	install.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(g.uid), Gid: uint32(g.gid)}}
	if out, err := install.CombinedOutput(); err != nil {
		return g, fmt.Errorf("mariadb-install-db: %v: %s", err, out)
	}
	for i := range g.nodes {
		var extra []string
		if i == 0 {
			extra = []string{"--wsrep-new-cluster"}
		}
		if err := g.start(ctx, i, extra...); err != nil {
			return g, err
		}
	}
	for i, n := range g.nodes {
		srv := &http.Server{Addr: fmt.Sprintf("127.0.0.1:%d", n.check), Handler: g.healthCheck(i)}
		ln, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			return g, err
		}
		go srv.Serve(ln)
		g.checks = append(g.checks, srv)
	}
	return g, g.startProxy(ctx)
}

// chown gives path, and everything under it, to the mysql user.
func (g *galera) chown(path string) error {
	return filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, g.uid, g.gid)
	})
}

// start starts node i (again: a node killed with SIGKILL rejoins by full
// state transfer, one stopped cleanly by incremental) and waits until it
// is Synced.
func (g *galera) start(ctx context.Context, i int, extra ...string) error {
	if err := g.launch(i, extra...); err != nil {
		return err
	}
	return g.waitSynced(ctx, i, 120*time.Second)
}

// launch starts node i's mariadbd with extra options and returns at once.
func (g *galera) launch(i int, extra ...string) error {
	n := g.nodes[i]
	var peers []string
	for _, m := range g.nodes {
		peers = append(peers, fmt.Sprintf("127.0.0.1:%d", m.gcomm))
	}
	// Failure detection in seconds, not the default 5 to 15: a node cut
	// off leaves the primary component within the scenario. A write-set
	// cache that holds what a stopped node misses in galera-joiner-tcp
	// (1.5M rows, about 200 MB): it rejoins by IST, not SST.
	provider := fmt.Sprintf("gmcast.listen_addr=tcp://127.0.0.1:%d;ist.recv_addr=127.0.0.1:%d;"+
		"gcache.size=512M;evs.keepalive_period=PT0.5S;evs.suspect_timeout=PT2S;evs.inactive_timeout=PT4S;"+
		"evs.inactive_check_period=PT0.5S;evs.install_timeout=PT4S", n.gcomm, n.ist)
	args := append([]string{"--no-defaults", "--datadir=" + filepath.Join(n.dir, "data"),
		"--port=" + strconv.Itoa(n.port), "--bind-address=127.0.0.1", "--socket=" + filepath.Join(n.dir, "sock"),
		"--pid-file=" + filepath.Join(n.dir, "pid"), "--log-error=" + filepath.Join(n.dir, "error.log"),
		"--innodb-buffer-pool-size=32M", "--innodb-log-file-size=32M", "--max-connections=500",
		// HAProxy's TCP checks connect and hang up: never block the host.
		"--max-connect-errors=4294967295",
		"--binlog-format=ROW", "--innodb-autoinc-lock-mode=2", "--skip-log-bin",
		"--wsrep-on=ON", "--wsrep-provider=/usr/lib/galera/libgalera_smm.so",
		"--wsrep-cluster-name=paychaos", "--wsrep-cluster-address=gcomm://" + strings.Join(peers, ","),
		"--wsrep-node-name=" + n.name, fmt.Sprintf("--wsrep-node-address=127.0.0.1:%d", n.gcomm),
		"--wsrep-sst-method=rsync", fmt.Sprintf("--wsrep-sst-receive-address=127.0.0.1:%d", n.sst),
		"--wsrep-slave-threads=2", "--wsrep-provider-options=" + provider}, extra...)
	cmd := exec.Command("mariadbd", args...)
	cmd.Env = []string{"PATH=" + filepath.Join(g.dir, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + n.dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(g.uid), Gid: uint32(g.gid)}, Setpgid: true}
	if err := g.spawn(cmd, "galera-"+n.name); err != nil {
		return err
	}
	n.cmd = cmd
	n.starts++
	if n.db == nil {
		db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%d)/?timeout=2s&readTimeout=5s&writeTimeout=5s", n.port))
		if err != nil {
			return err
		}
		db.SetMaxIdleConns(1)
		db.SetConnMaxIdleTime(time.Second)
		n.db = db
	}
	return nil
}

// waitSynced waits until node i is Synced in the primary component.
func (g *galera) waitSynced(ctx context.Context, i int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		st := g.status(i)
		if st["wsrep_local_state"] == "4" && st["wsrep_ready"] == "ON" && st["wsrep_cluster_status"] == "Primary" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("galera %s not Synced after %s: %v", g.nodes[i].name, within, st)
		}
		if !at(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// status is node i's wsrep status (empty when it does not answer).
func (g *galera) status(i int) map[string]string {
	out := map[string]string{}
	n := g.nodes[i]
	if n.db == nil || n.cmd == nil {
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	rows, err := n.db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_state', "+
		"'wsrep_local_state_comment', 'wsrep_ready', 'wsrep_cluster_status', 'wsrep_cluster_size', "+
		"'wsrep_local_cert_failures', 'wsrep_local_bf_aborts', 'wsrep_local_commits')")
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if rows.Scan(&k, &v) == nil {
			out[strings.ToLower(k)] = v
		}
	}
	return out
}

// state is node i's state in words, for notes: "Synced", "Donor/Desynced".
func (g *galera) state(i int) string {
	st := g.status(i)
	if len(st) == 0 {
		return "down"
	}
	s := st["wsrep_local_state_comment"]
	if st["wsrep_cluster_status"] != "Primary" {
		s += ", " + st["wsrep_cluster_status"]
	}
	if st["wsrep_ready"] != "ON" {
		s += ", not ready"
	}
	return s
}

// healthCheck serves node i's health check: 200 while it is Synced and
// ready, 503 otherwise (what clustercheck answers HAProxy).
func (g *galera) healthCheck(i int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := g.status(i)
		if st["wsrep_local_state"] == "4" && st["wsrep_ready"] == "ON" {
			io.WriteString(w, "Synced\n")
			return
		}
		http.Error(w, "not Synced: "+st["wsrep_local_state_comment"], http.StatusServiceUnavailable)
	})
}

func (g *galera) startProxy(ctx context.Context) error {
	g.sock = filepath.Join(g.dir, "haproxy.sock")
	var b strings.Builder
	fmt.Fprintf(&b, "global\n  stats socket %s mode 600 level admin\n  maxconn 4000\n\n", g.sock)
	b.WriteString("defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 1h\n  timeout server 1h\n" +
		"  timeout check 2s\n  retries 3\n  option redispatch\n\n")
	for _, f := range []string{frontSynced, frontSpread, frontTCP} {
		port, err := freePort()
		if err != nil {
			return err
		}
		g.fronts[f] = port
		fmt.Fprintf(&b, "listen %s\n  bind 127.0.0.1:%d\n", f, port)
		check := "check inter 500ms fall 2 rise 2"
		switch f {
		case frontSynced, frontSpread:
			b.WriteString("  option httpchk GET /\n")
			check += " on-marked-down shutdown-sessions"
		}
		if f == frontSpread {
			b.WriteString("  balance roundrobin\n")
		}
		for i, n := range g.nodes {
			fmt.Fprintf(&b, "  server %s 127.0.0.1:%d %s", n.name, n.port, check)
			if f != frontTCP {
				fmt.Fprintf(&b, " port %d", n.check)
			}
			switch {
			case f == frontSpread:
			case i == 0:
				b.WriteString(" on-marked-up shutdown-backup-sessions")
			default:
				b.WriteString(" backup")
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	conf := filepath.Join(g.dir, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		return err
	}
	cmd := exec.Command("haproxy", "-db", "-f", conf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := g.spawn(cmd, "haproxy"); err != nil {
		return err
	}
	g.proxy = cmd
	for _, port := range g.fronts {
		if err := waitPort(ctx, port, 10*time.Second); err != nil {
			return fmt.Errorf("haproxy: %w", err)
		}
	}
	return nil
}

// api sends one command to HAProxy's runtime API and returns its answer.
func (g *galera) api(cmd string) (string, error) {
	c, err := net.DialTimeout("unix", g.sock, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return "", err
	}
	out, err := io.ReadAll(bufio.NewReader(c))
	return strings.TrimSpace(string(out)), err
}

// drain takes node i out of frontend f, as an operator would: no new
// connection goes to it, and its sessions are shut.
func (g *galera) drain(f string, i int) error {
	srv := f + "/" + g.nodes[i].name
	if _, err := g.api("set server " + srv + " state maint"); err != nil {
		return err
	}
	_, err := g.api("shutdown sessions server " + srv)
	return err
}

// undrain puts node i back into frontend f.
func (g *galera) undrain(f string, i int) error {
	_, err := g.api("set server " + f + "/" + g.nodes[i].name + " state ready")
	return err
}

// dsn is root's DSN for database db through frontend f.
func (g *galera) dsn(f, db string) string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s", g.fronts[f], db)
}

// nodeDSN is root's DSN for database db on node i, with no proxy.
func (g *galera) nodeDSN(i int, db string) string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s", g.nodes[i].port, db)
}

// writer is the node a new connection through frontend f reaches now.
func (g *galera) writer(f string) (int, error) {
	db, err := sql.Open("mysql", g.dsn(f, "")+"?timeout=2s&readTimeout=3s")
	if err != nil {
		return -1, err
	}
	defer db.Close()
	var port int
	if err := db.QueryRow("SELECT @@port").Scan(&port); err != nil {
		return -1, err
	}
	for i, n := range g.nodes {
		if n.port == port {
			return i, nil
		}
	}
	return -1, fmt.Errorf("port %d is no node of ours", port)
}

// kill stops node i with sig and waits for it to exit: SIGKILL loses its
// saved position (it rejoins by full state transfer), SIGTERM keeps it.
func (g *galera) kill(i int, sig syscall.Signal) {
	n := g.nodes[i]
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	syscall.Kill(-n.cmd.Process.Pid, sig)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && syscall.Kill(n.cmd.Process.Pid, 0) == nil {
		time.Sleep(50 * time.Millisecond)
	}
	n.cmd = nil
}

// isolate cuts node i off from the others (gmcast.isolate), or lets it
// back: cut off, it leaves the primary component and answers 1047.
func (g *galera) isolate(i int, on bool) error {
	v := 0
	if on {
		v = 1
	}
	_, err := g.nodes[i].db.Exec(fmt.Sprintf("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=%d'", v))
	return err
}

// holdSST makes the next state transfers' donors wait with their global
// read lock held (true), or lets them go.
func (g *galera) holdSST(on bool) error {
	hold := filepath.Join(g.dir, "sst-hold")
	if on {
		return os.WriteFile(hold, nil, 0o644)
	}
	if err := os.Remove(hold); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// counters is a node's counters for the evidence.
type counters struct{ commits, certFailures, bfAborts int64 }

func (g *galera) counters(i int) counters {
	st := g.status(i)
	n := func(k string) int64 { v, _ := strconv.ParseInt(st[k], 10, 64); return v }
	return counters{commits: n("wsrep_local_commits"), certFailures: n("wsrep_local_cert_failures"), bfAborts: n("wsrep_local_bf_aborts")}
}

// heal brings the cluster back to three Synced nodes, nothing held, every
// node in every frontend.
func (g *galera) heal(ctx context.Context) error {
	if err := g.holdSST(false); err != nil {
		return err
	}
	for i, n := range g.nodes {
		if n.cmd == nil {
			if err := g.start(ctx, i); err != nil {
				return err
			}
			continue
		}
		if st := g.status(i); st["wsrep_cluster_status"] != "Primary" {
			g.isolate(i, false)
		}
	}
	for i := range g.nodes {
		if err := g.waitSynced(ctx, i, 60*time.Second); err != nil {
			return err
		}
		for _, f := range []string{frontSynced, frontSpread, frontTCP} {
			if err := g.undrain(f, i); err != nil {
				return err
			}
		}
	}
	// The checks see every node up again before the next scenario starts.
	return at2(ctx, 1500*time.Millisecond)
}

func at2(ctx context.Context, d time.Duration) error {
	if !at(ctx, d) {
		return ctx.Err()
	}
	return nil
}

func (g *galera) close() {
	for _, s := range g.checks {
		s.Close()
	}
	if g.proxy != nil && g.proxy.Process != nil {
		syscall.Kill(-g.proxy.Process.Pid, syscall.SIGKILL)
	}
	for i, n := range g.nodes {
		g.kill(i, syscall.SIGKILL)
		if n.db != nil {
			n.db.Close()
		}
	}
}

// galeraSuite starts the Galera cluster on first use, once.
type galeraSuite struct {
	once sync.Once
	g    *galera
	err  error
}

func (s *galeraSuite) get(ctx context.Context, c *cluster) (*galera, error) {
	s.once.Do(func() {
		started := time.Now()
		s.g, s.err = startGalera(ctx, filepath.Join(c.dir, "galera"), c.spawn)
		if s.err == nil {
			fmt.Printf("galera up in %s: nodes %d %d %d, HAProxy synced %d, spread %d, tcp %d\n",
				time.Since(started).Round(100*time.Millisecond), s.g.nodes[0].port, s.g.nodes[1].port, s.g.nodes[2].port,
				s.g.fronts[frontSynced], s.g.fronts[frontSpread], s.g.fronts[frontTCP])
		}
	})
	if s.err != nil {
		return nil, s.err
	}
	return s.g, s.g.heal(ctx)
}

func (s *galeraSuite) close() {
	if s.g != nil {
		s.g.close()
	}
}
