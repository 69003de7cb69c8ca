package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
)

// cluster is the production topology on loopback ports of its own, from
// Debian's packages: a 3-node RabbitMQ cluster, a Redis master with a
// replica and three Sentinels, and a MariaDB that can be restarted. The
// shared servers on 5672, 6379 and 3306 are never touched. Everything it
// starts is stopped, and its directory removed, by close.
type cluster struct {
	dir       string
	nodes     []*rabbitNode
	redis     []*daemon // [0] started as the master, [1] as its replica
	sentinels []*daemon
	maria     *daemon
	mysqlPort int
}

// A rabbitNode is one RabbitMQ node: its name, ports and directories.
type rabbitNode struct {
	name string // pc1@localhost
	port int    // AMQP
	dist int    // Erlang distribution
	dir  string
	cmd  *exec.Cmd
}

// A daemon is a server process the cluster runs and may kill and restart.
type daemon struct {
	name string
	port int
	argv []string
	cmd  *exec.Cmd
}

// The Sentinels' name for the master.
const masterName = "paysvc"

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func waitPort(ctx context.Context, port int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if !at(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("nothing listens on 127.0.0.1:%d after %s", port, within)
}

// startCluster starts every server and forms the RabbitMQ cluster.
func startCluster(ctx context.Context, dir string) (c *cluster, err error) {
	c = &cluster{dir: dir}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	if os.Geteuid() != 0 {
		return c, errors.New("the cluster suite needs root: Debian's rabbitmq-server runs its nodes as the rabbitmq user")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return c, err
	}
	if err := c.startMariaDB(ctx); err != nil {
		return c, fmt.Errorf("mariadb: %w", err)
	}
	if err := c.startRedis(ctx); err != nil {
		return c, fmt.Errorf("redis: %w", err)
	}
	for i := range 3 {
		n, err := c.newNode(i)
		if err != nil {
			return c, err
		}
		c.nodes = append(c.nodes, n)
		if err := c.startNode(ctx, i); err != nil {
			return c, fmt.Errorf("rabbitmq node %s: %w", n.name, err)
		}
	}
	// Join the second and third nodes to the first, once it runs.
	for _, n := range c.nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", c.nodes[0].name}, {"start_app"}} {
			if err := c.ctl(n, args...); err != nil {
				return c, err
			}
		}
	}
	return c, c.ctl(c.nodes[0], "await_online_nodes", "3")
}

func (c *cluster) newNode(i int) (*rabbitNode, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dist, err := freePort()
	if err != nil {
		return nil, err
	}
	n := &rabbitNode{name: fmt.Sprintf("paychaos%d_%d@localhost", i+1, port), port: port, dist: dist,
		dir: filepath.Join(c.dir, fmt.Sprintf("rabbit%d", i+1))}
	for _, sub := range []string{"mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(n.dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	conf := fmt.Sprintf("listeners.tcp.default = %d\n", port)
	if err := os.WriteFile(filepath.Join(n.dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	// No plugins: the management plugin would fight the shared node for 15672.
	if err := os.WriteFile(filepath.Join(n.dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		return nil, err
	}
	// A quorum queue dead-letters at least once: a message whose target
	// (here the main queue, without a majority) did not confirm is sent
	// again only after this timeout, 3 minutes by default on 3.10. Lowered
	// so that the suite settles in its deadline; see docs/fault-injection.md.
	advanced := "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].\n"
	if err := os.WriteFile(filepath.Join(n.dir, "advanced.config"), []byte(advanced), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command("chown", "-R", "rabbitmq:rabbitmq", n.dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("chown %s: %v: %s", n.dir, err, out)
	}
	os.Chmod(c.dir, 0o755)
	return n, nil
}

// startNode starts node i (again, after a kill: it rejoins the cluster
// from its data directory) and waits until it runs.
func (c *cluster) startNode(ctx context.Context, i int) error {
	n := c.nodes[i]
	u, err := user.Lookup("rabbitmq")
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cmd := exec.Command("/usr/lib/rabbitmq/bin/rabbitmq-server")
	cmd.Dir = u.HomeDir
	cmd.Env = append(os.Environ(), "HOME="+u.HomeDir, // the shared Erlang cookie
		"RABBITMQ_NODENAME="+n.name, "RABBITMQ_NODE_PORT="+strconv.Itoa(n.port), "RABBITMQ_DIST_PORT="+strconv.Itoa(n.dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.dir, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(n.dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(n.dir, "rabbitmq"), "RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(n.dir, "enabled_plugins"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(n.dir, "advanced.config"),
		"RABBITMQ_PID_FILE="+filepath.Join(n.dir, "pid"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, Setpgid: true}
	if err := c.spawn(cmd, "rabbit-"+strconv.Itoa(i+1)); err != nil {
		return err
	}
	n.cmd = cmd
	if err := waitPort(ctx, n.port, 90*time.Second); err != nil {
		return err
	}
	return c.ctl(n, "await_startup")
}

// killNode kills node i with SIGKILL (its whole process group: the Erlang
// VM and its helpers) and waits for it to be gone.
func (c *cluster) killNode(i int) {
	n := c.nodes[i]
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	if pid, err := os.ReadFile(filepath.Join(n.dir, "pid")); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(pid))); err == nil {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.port), 100*time.Millisecond); err != nil {
			break
		} else {
			c.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
	n.cmd = nil
}

// ctl runs rabbitmqctl against one node.
func (c *cluster) ctl(n *rabbitNode, args ...string) error {
	_, err := c.ctlOutput(n, args...)
	return err
}

func (c *cluster) ctlOutput(n *rabbitNode, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q", "-n", n.name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl -n %s %s: %v: %s", n.name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// alive returns the nodes that run now.
func (c *cluster) alive() []*rabbitNode {
	var out []*rabbitNode
	for _, n := range c.nodes {
		if n.cmd != nil {
			out = append(out, n)
		}
	}
	return out
}

// leader returns the index of the node that leads vhost's q.pay.success.
func (c *cluster) leader(vhost string) (int, error) { return c.leaderOf(vhost, listener.MainQueue) }

// leaderOf returns the index of the node that leads vhost's queue q.
func (c *cluster) leaderOf(vhost, q string) (int, error) {
	leaders, _, err := c.leaders(vhost)
	if err != nil {
		return -1, err
	}
	l, ok := leaders[q]
	if !ok {
		return -1, fmt.Errorf("%s has no leader now", q)
	}
	return l, nil
}

// leaders returns, for every queue of vhost that has a leader on a node of
// ours, that node's index and the queue's total messages, as the first
// running node that answers tells.
func (c *cluster) leaders(vhost string) (leaders, messages map[string]int, err error) {
	err = errors.New("no node runs")
	for _, n := range c.alive() {
		var out string
		if out, err = c.ctlOutput(n, "list_queues", "-p", vhost, "--no-table-headers", "name", "leader", "messages"); err != nil {
			continue
		}
		leaders, messages = map[string]int{}, map[string]int{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) != 3 {
				continue
			}
			for i, m := range c.nodes {
				if m.name == f[1] {
					leaders[f[0]] = i
				}
			}
			if m, err := strconv.Atoi(f[2]); err == nil {
				messages[f[0]] = m
			}
		}
		return leaders, messages, nil
	}
	return nil, nil, err
}

// saveLogs copies every node's log files into dir, as rabbit-N-<file>.
func (c *cluster) saveLogs(dir string) {
	for i, n := range c.nodes {
		files, _ := filepath.Glob(filepath.Join(n.dir, "log", "*.log"))
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil {
				os.WriteFile(filepath.Join(dir, fmt.Sprintf("rabbit-%d-%s", i+1, filepath.Base(f))), b, 0o644)
			}
		}
	}
}

// amqpURLs returns every node's URL for vhost, comma-separated.
func (c *cluster) amqpURLs(vhost string) string {
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/%s", n.port, vhost))
	}
	return strings.Join(urls, ",")
}

// addVhost makes vhost on the cluster with every permission for guest.
func (c *cluster) addVhost(vhost string) error {
	n := c.alive()[0]
	if err := c.ctl(n, "add_vhost", vhost); err != nil {
		return err
	}
	return c.ctl(n, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
}

func (c *cluster) deleteVhost(vhost string) {
	if nodes := c.alive(); len(nodes) > 0 {
		c.ctl(nodes[0], "delete_vhost", vhost)
	}
}

func (c *cluster) mysqlDSN() string { return fmt.Sprintf("root@tcp(127.0.0.1:%d)/", c.mysqlPort) }

func (c *cluster) sentinelAddrs() []string {
	var out []string
	for _, s := range c.sentinels {
		out = append(out, fmt.Sprintf("127.0.0.1:%d", s.port))
	}
	return out
}

// redisClient reaches the current master through the Sentinels.
func (c *cluster) redisClient() *redis.Client {
	return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: masterName, SentinelAddrs: c.sentinelAddrs()})
}

func (c *cluster) startMariaDB(ctx context.Context) error {
	dir := filepath.Join(c.dir, "mariadb")
	if out, err := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+dir+"/data",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput(); err != nil {
		return fmt.Errorf("mariadb-install-db: %v: %s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	c.mysqlPort = port
	c.maria = &daemon{name: "mariadb", port: port, argv: []string{"mariadbd", "--no-defaults", "--datadir=" + dir + "/data",
		"--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1", "--socket=" + dir + "/sock", "--pid-file=" + dir + "/pid",
		"--innodb-buffer-pool-size=64M", "--skip-log-bin", "--user=root"}}
	return c.start(ctx, c.maria)
}

func (c *cluster) startRedis(ctx context.Context) error {
	for i := range 2 {
		port, err := freePort()
		if err != nil {
			return err
		}
		argv := []string{"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
			"--appendonly", "no", "--dir", c.dir}
		if i == 1 {
			argv = append(argv, "--replicaof", "127.0.0.1", strconv.Itoa(c.redis[0].port))
		}
		d := &daemon{name: fmt.Sprintf("redis-%d", i+1), port: port, argv: argv}
		c.redis = append(c.redis, d)
		if err := c.start(ctx, d); err != nil {
			return err
		}
	}
	for i := range 3 {
		port, err := freePort()
		if err != nil {
			return err
		}
		conf := filepath.Join(c.dir, fmt.Sprintf("sentinel-%d.conf", i+1))
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %s 2000\nsentinel failover-timeout %s 10000\n",
			port, masterName, c.redis[0].port, masterName, masterName)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return err
		}
		d := &daemon{name: fmt.Sprintf("sentinel-%d", i+1), port: port, argv: []string{"redis-server", conf, "--sentinel"}}
		c.sentinels = append(c.sentinels, d)
		if err := c.start(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

// start starts (or restarts) a daemon and waits for its port.
func (c *cluster) start(ctx context.Context, d *daemon) error {
	cmd := exec.Command(d.argv[0], d.argv[1:]...)
	if err := c.spawn(cmd, d.name); err != nil {
		return err
	}
	d.cmd = cmd
	return waitPort(ctx, d.port, 60*time.Second)
}

// spawn starts cmd with its output appended to <name>.out in the cluster's
// directory, and reaps it when it exits.
func (c *cluster) spawn(cmd *exec.Cmd, name string) error {
	log, err := os.OpenFile(filepath.Join(c.dir, name+".out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	go func() { cmd.Wait(); log.Close() }()
	return nil
}

// kill stops a daemon with sig and waits for it to exit.
func (c *cluster) kill(d *daemon, sig syscall.Signal) {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	d.cmd.Process.Signal(sig)
	deadline := time.Now().Add(30 * time.Second)
	for d.cmd.ProcessState == nil && time.Now().Before(deadline) {
		if d.cmd.Process.Signal(syscall.Signal(0)) != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.cmd = nil
}

// master returns the Redis daemon the Sentinels now call master.
func (c *cluster) master(ctx context.Context) (*daemon, error) {
	s := redis.NewSentinelClient(&redis.Options{Addr: c.sentinelAddrs()[0]})
	defer s.Close()
	addr, err := s.GetMasterAddrByName(ctx, masterName).Result()
	if err != nil {
		return nil, err
	}
	for _, d := range c.redis {
		if len(addr) == 2 && addr[1] == strconv.Itoa(d.port) {
			return d, nil
		}
	}
	return nil, fmt.Errorf("master %v is no Redis of ours", addr)
}

func (c *cluster) nodeNames() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, fmt.Sprintf("%s:%d", n.name, n.port))
	}
	return out
}

// heal starts whatever a scenario left stopped and waits for the three
// nodes to run together again.
func (c *cluster) heal(ctx context.Context) error {
	for i, n := range c.nodes {
		if n.cmd == nil {
			if err := c.startNode(ctx, i); err != nil {
				return err
			}
		}
	}
	for _, d := range append(append([]*daemon{c.maria}, c.redis...), c.sentinels...) {
		if d.cmd == nil {
			if err := c.start(ctx, d); err != nil {
				return err
			}
		}
	}
	return c.ctl(c.nodes[0], "await_online_nodes", "3")
}

// close stops everything and removes the directory.
func (c *cluster) close() {
	for i := range c.nodes {
		c.killNode(i)
	}
	for _, d := range append(append([]*daemon{}, c.sentinels...), c.redis...) {
		c.kill(d, syscall.SIGKILL)
	}
	if c.maria != nil {
		c.kill(c.maria, syscall.SIGKILL)
	}
	// The Erlang port mapper forgets the dead nodes by itself; their
	// directories go.
	os.RemoveAll(c.dir)
}
