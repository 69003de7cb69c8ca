package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/sqldb"
)

// galeraScenario is a cluster scenario whose MySQL is the Galera cluster:
// the instances reach it through an HAProxy frontend, or (front "") each
// its own node directly.
type galeraScenario struct {
	scenario
	front string
	hook  bool // the instances post dead-letter alerts to a webhook of the suite's
}

// galeraScenarios run in the cluster suite (make chaos-cluster), after the
// RabbitMQ and Redis ones, against the Galera cluster (galera.go). Each
// records what hit the cluster (node states, which node took writes,
// certification failures and brute-force aborts) in the report's notes.
var galeraScenarios = []galeraScenario{
	{front: frontSynced, scenario: scenario{name: "galera-kill9-writer",
		faults: "SIGKILL the node taking writes (HAProxy: one writer, Synced-only check); it rejoins by SST",
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
			g := w.galera
			if !at(ctx, 800*time.Millisecond) {
				return 0, nil
			}
			wr, err := g.writer(frontSynced)
			if err != nil {
				return 0, err
			}
			killed := time.Now()
			g.kill(wr, syscall.SIGKILL)
			w.markFault(killed)
			w.note("killed writer %s", g.nodes[wr].name)
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
				if nw, err := g.writer(frontSynced); err == nil && nw != wr {
					w.note("HAProxy sent new connections to %s after %s", g.nodes[nw].name, time.Since(killed).Round(100*time.Millisecond))
					w.hit(1)
					break
				}
				if !at(ctx, 100*time.Millisecond) {
					return 1, ctx.Err()
				}
			}
			at(ctx, 3*time.Second)
			back := time.Now()
			if err := g.start(ctx, wr); err != nil {
				return 1, err
			}
			w.note("%s rejoined by %s in %s", g.nodes[wr].name, g.transfer(wr), time.Since(back).Round(100*time.Millisecond))
			return 1, nil
		},
		verify: all(injected(1, "writer moves"), handledAfterFault, writesOn(2))}},
	{front: frontSpread, scenario: scenario{name: "galera-spread-hot",
		faults: "connections round-robin over the 3 nodes, every payment on 2 hot accounts (conflicts on purpose)",
		shape:  hotAccounts(2),
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) { return 1, nil },
		verify: all(writesOn(3), conflicts(1))}},
	{front: frontTCP, scenario: scenario{name: "galera-nonprimary-tcp",
		faults: "the writer cut off from the others (non-Primary, 1047) behind a plain TCP check; drained from HAProxy 5s later",
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
			g := w.galera
			if !at(ctx, 800*time.Millisecond) {
				return 0, nil
			}
			wr, err := g.writer(frontTCP)
			if err != nil {
				return 0, err
			}
			cut := time.Now()
			if err := g.isolate(wr, true); err != nil {
				return 0, err
			}
			if !g.waitState(ctx, wr, 20*time.Second, func(st map[string]string) bool { return st["wsrep_cluster_status"] == "non-Primary" }) {
				return 1, fmt.Errorf("%s still Primary 20s after its isolation", g.nodes[wr].name)
			}
			w.note("%s cut off: %s after %s", g.nodes[wr].name, g.state(wr), time.Since(cut).Round(100*time.Millisecond))
			w.hit(1)
			w.markMinority(time.Now())
			at(ctx, 5*time.Second)
			// The proxy recovers: an operator drains the node.
			if err := g.drain(frontTCP, wr); err != nil {
				return 1, err
			}
			w.markMajority(time.Now())
			w.markFault(time.Now())
			w.note("drained from HAProxy %s after the cut", time.Since(cut).Round(100*time.Millisecond))
			at(ctx, 2*time.Second)
			if err := g.isolate(wr, false); err != nil {
				return 1, err
			}
			if err := g.waitSynced(ctx, wr, 60*time.Second); err != nil {
				return 1, err
			}
			w.note("%s Synced again %s after the cut", g.nodes[wr].name, time.Since(cut).Round(100*time.Millisecond))
			return 1, g.undrain(frontTCP, wr)
		},
		verify: all(injected(1, "nodes cut off"), nodeNotReadyPauses, heldWhileCutOff, handledAfterFault)}},
	{front: frontTCP, scenario: scenario{name: "galera-donor-tcp",
		faults: "the writer donates an SST to a node killed and restarted (global read lock 6s), behind a plain TCP check",
		// The donor's state comes 7 s or more after the joiner's start
		// (more on a loaded host): the load lasts well past the 6 s hold,
		// so that payments meet the donor.
		spread: 25 * time.Second,
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
			g := w.galera
			wr, err := g.writer(frontTCP)
			if err != nil {
				return 0, err
			}
			joiner := (wr + 2) % len(g.nodes)
			g.kill(joiner, syscall.SIGKILL) // it lost its position: a full state transfer
			if err := g.holdSST(true); err != nil {
				return 0, err
			}
			started := time.Now()
			if err := g.launch(joiner, "--wsrep-sst-donor="+g.nodes[wr].name); err != nil {
				return 0, err
			}
			if !g.waitState(ctx, wr, 30*time.Second, func(st map[string]string) bool { return st["wsrep_local_state"] == "2" }) {
				g.holdSST(false)
				return 1, fmt.Errorf("%s never became a donor", g.nodes[wr].name)
			}
			w.note("%s %s for %s's SST after %s", g.nodes[wr].name, g.state(wr), g.nodes[joiner].name,
				time.Since(started).Round(100*time.Millisecond))
			w.hit(1)
			at(ctx, 6*time.Second)
			if err := g.holdSST(false); err != nil {
				return 1, err
			}
			w.markFault(time.Now())
			if err := g.waitSynced(ctx, joiner, 90*time.Second); err != nil {
				return 1, err
			}
			w.note("%s rejoined by %s in %s while payments flowed", g.nodes[joiner].name, g.transfer(joiner),
				time.Since(started).Round(100*time.Millisecond))
			return 1, nil
		},
		verify: all(injected(1, "donors"), nodeNotReadyPauses, handledAfterFault)}},
	{front: frontTCP, scenario: scenario{name: "galera-joiner-tcp",
		faults: "the writer stopped, 1.5M rows written meanwhile, restarted: it applies them (IST) with its port open (1047), behind a plain TCP check",
		// The node is Synced 20 s or more after the stop: the load lasts
		// past it, so that payments meet the joiner and the Synced node.
		spread: 35 * time.Second,
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
			g := w.galera
			wr, err := g.writer(frontTCP)
			if err != nil {
				return 0, err
			}
			g.kill(wr, syscall.SIGTERM) // a clean stop: it rejoins by incremental state transfer
			// Writes the node misses, whatever paysvc did meanwhile: with
			// few, it applies them within a health check's interval of its
			// port opening, and HAProxy never sends it a connection before
			// it is Synced (1.5M rows: Joining, port open, for 0.1 to 3 s
			// here).
			gapped := time.Now()
			if err := g.gap(ctx, (wr+1)%len(g.nodes), 75); err != nil {
				return 0, err
			}
			w.note("1,500,000 rows written while %s was down, in %s", g.nodes[wr].name, time.Since(gapped).Round(100*time.Millisecond))
			started := time.Now()
			if err := g.launch(wr); err != nil {
				return 0, err
			}
			joining := func(st map[string]string) bool {
				return strings.HasPrefix(st["wsrep_local_state_comment"], "Joining") && st["wsrep_ready"] == "OFF"
			}
			if !g.waitState(ctx, wr, 30*time.Second, joining) {
				return 1, fmt.Errorf("%s never seen Joining with its port open (now %s; its log: %s)", g.nodes[wr].name,
					g.state(wr), g.logTail(wr, "IST", "SST", "state transfer", "Joining", "Synced", "ready for connections", "ERROR"))
			}
			w.note("%s %s, its port open, after %s", g.nodes[wr].name, g.state(wr), time.Since(started).Round(100*time.Millisecond))
			w.hit(1)
			// HAProxy's TCP check passes it, and marked up it shuts the
			// backups' sessions: paysvc's new connections reach it, and
			// the evidence is paysvc's pauses for mysql_node_not_ready.
			if err := g.waitSynced(ctx, wr, 60*time.Second); err != nil {
				return 1, err
			}
			w.markFault(time.Now())
			w.note("%s Synced by %s %s after its start", g.nodes[wr].name, g.transfer(wr), time.Since(started).Round(100*time.Millisecond))
			return 1, nil
		},
		verify: all(injected(1, "joiners seen with their port open"), nodeNotReadyPauses, handledAfterFault)}},
	{hook: true, scenario: scenario{name: "galera-lease-nodes",
		faults: "each instance on its own node (no proxy), alerts posted to a slow webhook: GET_LOCK vs the lease",
		inject: leaseAcrossNodes,
		verify: all(injected(1, "lease refusals across nodes"), alertedOnce, writesOn(3))}},
}

// galeraScenarioNamed returns the Galera scenario called name.
func galeraScenarioNamed(name string) (galeraScenario, bool) {
	for _, s := range galeraScenarios {
		if s.name == name {
			return s, true
		}
	}
	return galeraScenario{}, false
}

// galeraSuiteScenarios are the Galera scenarios as the suite lists them.
func galeraSuiteScenarios() []scenario {
	var out []scenario
	for _, s := range galeraScenarios {
		out = append(out, s.scenario)
	}
	return out
}

// newGaleraWorld makes a scenario's database on the Galera cluster
// (through the Synced-only frontend, so that the suite's own reads and
// writes ride out the faults), and its vhost and key prefix on the
// cluster's RabbitMQ and Redis.
func newGaleraWorld(ctx context.Context, name string, c *cluster, g *galera, s galeraScenario, binary, logDir string) (_ *world, err error) {
	w := &world{name: name, binary: binary, cluster: c, galera: g,
		delays: []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, time.Second}}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if err := w.setup(ctx, logDir, g.dsn(frontSynced, "")); err != nil {
		return nil, err
	}
	if err := c.addVhost(w.vhost); err != nil {
		return w, err
	}
	w.amqpURL = c.amqpURLs(w.vhost)
	w.rdb = c.redisClient()
	g.baseline()
	g.hook = nil
	var hookEnv []string
	if s.hook {
		if g.hook, err = newAlertHook(); err != nil {
			return w, err
		}
		hookEnv = []string{"PAYSVC_ALERT_WEBHOOKURL=" + g.hook.url}
	}
	w.extraEnv = func(i int) []string {
		dsn := g.dsn(s.front, w.dbName)
		if s.front == "" {
			dsn = g.nodeDSN(i%len(g.nodes), w.dbName)
		}
		return append([]string{"PAYSVC_MYSQL_DSN=" + dsn}, hookEnv...)
	}
	return w, w.declare()
}

// baseline records every node's counters at a scenario's start.
func (g *galera) baseline() {
	g.base = g.base[:0]
	for i := range g.nodes {
		g.base = append(g.base, g.counters(i))
		g.nodes[i].starts = 0
	}
}

// delta is node i's counters since the scenario's start (since its
// restart, for a node restarted meanwhile: its counters began again).
func (g *galera) delta(i int) counters {
	now := g.counters(i)
	if g.nodes[i].starts > 0 || i >= len(g.base) {
		return now
	}
	b := g.base[i]
	return counters{commits: now.commits - b.commits, certFailures: now.certFailures - b.certFailures, bfAborts: now.bfAborts - b.bfAborts}
}

// waitState waits until node i's status satisfies ok.
func (g *galera) waitState(ctx context.Context, i int, within time.Duration, ok func(map[string]string) bool) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); {
		if ok(g.status(i)) {
			return true
		}
		if !at(ctx, 100*time.Millisecond) {
			return false
		}
	}
	return false
}

// transfer says how node i last received its state, from its error log.
func (g *galera) transfer(i int) string {
	b, _ := os.ReadFile(filepath.Join(g.nodes[i].dir, "error.log"))
	log := string(b)
	ist, sst := strings.LastIndex(log, "IST received"), strings.LastIndex(log, "SST received")
	switch {
	case sst > ist:
		return "full state transfer (SST)"
	case ist >= 0:
		return "incremental state transfer (IST)"
	}
	return "an unknown transfer"
}

// gap commits batches of 20,000 rows through node i, in a database of the
// suite's own: a node that is down meanwhile has them to receive when it
// rejoins, and applies them with its port open and wsrep_ready OFF.
func (g *galera) gap(ctx context.Context, i, batches int) error {
	qs := []string{
		"CREATE DATABASE IF NOT EXISTS paychaos_gap",
		"CREATE TABLE IF NOT EXISTS paychaos_gap.t (id BIGINT AUTO_INCREMENT PRIMARY KEY, n BIGINT NOT NULL, pad CHAR(100) NOT NULL)",
	}
	for range batches {
		qs = append(qs, "INSERT INTO paychaos_gap.t (n, pad) SELECT seq, REPEAT('x', 100) FROM paychaos_gap.seq_1_to_20000")
	}
	for _, q := range qs {
		if _, err := g.nodes[i].db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("writes through %s: %w", g.nodes[i].name, err)
		}
	}
	return nil
}

// logTail is the last lines of node i's error log that mention any of
// words, joined: what a scenario that failed on the node reports.
func (g *galera) logTail(i int, words ...string) string {
	b, _ := os.ReadFile(filepath.Join(g.nodes[i].dir, "error.log"))
	var hits []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				hits = append(hits, strings.TrimSpace(l))
				break
			}
		}
	}
	if len(hits) > 25 {
		hits = hits[len(hits)-25:]
	}
	return strings.Join(hits, " | ")
}

// hotAccounts moves every rich user's payment onto n users: payments of
// one account committed on several nodes at once conflict.
func hotAccounts(n int) func(*workload) {
	return func(wl *workload) {
		bodies := map[string][]byte{}
		for no, o := range wl.orders {
			if o.user == poorUser {
				continue
			}
			old := []byte(fmt.Sprintf(`{"orderNo":%q,"userId":%d,"amount":"%s"}`, o.no, o.user, o.amount))
			o.user = int64(hash(no)%uint64(n)) + 1
			wl.orders[no] = o
			if _, late := wl.late[no]; late {
				wl.late[no] = o
			}
			bodies[string(old)] = []byte(fmt.Sprintf(`{"orderNo":%q,"userId":%d,"amount":"%s"}`, o.no, o.user, o.amount))
		}
		for i, b := range wl.messages {
			if nb, ok := bodies[string(b)]; ok {
				wl.messages[i] = nb
			}
		}
	}
}

// writesOn is the evidence that at least n nodes committed the scenario's
// writes, with each node's share.
func writesOn(n int) func(context.Context, *world, *workload) (bool, string) {
	return func(_ context.Context, w *world, _ *workload) (bool, string) {
		g, nodes := w.galera, 0
		var parts []string
		for i, node := range g.nodes {
			d := g.delta(i)
			if d.commits > 0 {
				nodes++
			}
			parts = append(parts, fmt.Sprintf("%s %d", node.name, d.commits))
		}
		return nodes >= n, fmt.Sprintf("commits by node: %s (want >= %d nodes)", strings.Join(parts, ", "), n)
	}
}

// conflicts is the evidence of conflicting writers: at least n
// certification failures and brute-force aborts over the nodes, and what
// paysvc saw of them.
func conflicts(n int64) func(context.Context, *world, *workload) (bool, string) {
	return func(_ context.Context, w *world, _ *workload) (bool, string) {
		g := w.galera
		var cert, bf int64
		for i := range g.nodes {
			d := g.delta(i)
			cert += d.certFailures
			bf += d.bfAborts
		}
		es := w.entries()
		deadlocks, unknown := count(es, class("deadlock")), count(es, class("commit_unknown"))
		return cert+bf >= n, fmt.Sprintf("%d certification failures, %d brute-force aborts (want >= %d together); "+
			"paysvc: %d deadlock retries, %d commit_unknown re-reads", cert, bf, n, deadlocks, unknown)
	}
}

// nodeNotReadyPauses is the evidence that paysvc met a node that was not
// ready and paused for it.
func nodeNotReadyPauses(_ context.Context, w *world, _ *workload) (bool, string) {
	es := w.entries()
	n := count(es, func(e entry) bool {
		return (e.str("msg") == "consumption paused; waiting for the dependency" ||
			e.str("msg") == "consumption still paused, for another reason") && e.str("reason") == "mysql_node_not_ready"
	})
	stalled := count(es, func(e entry) bool { return e.str("reason") == "mysql_writes_stalled" })
	return n >= 1, fmt.Sprintf("%d pauses for mysql_node_not_ready, %d for mysql_writes_stalled (want >= 1 of the first)", n, stalled)
}

// heldWhileCutOff is the evidence that nothing was paid while every
// connection went to a node cut off from the primary component: from a
// second after it left it to its drain.
func heldWhileCutOff(_ context.Context, w *world, _ *workload) (bool, string) {
	w.mu.Lock()
	from, to := w.minority.Add(time.Second), w.majority
	w.mu.Unlock()
	if from.IsZero() || to.IsZero() {
		return false, "the node was never cut off"
	}
	n := count(w.entries(), func(e entry) bool {
		return e.str("msg") == "message handled" && e.str("result") == "FIRST" && e.at().After(from) && e.at().Before(to)
	})
	return n == 0, fmt.Sprintf("%d payments applied through the cut-off node over %s (want 0: held)",
		n, to.Sub(from).Round(100*time.Millisecond))
}

// leaseAcrossNodes shows on the scenario's database what a second holder
// on another node gets: GET_LOCK grants the name on two nodes at once, the
// lease refuses it.
func leaseAcrossNodes(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
	g := w.galera
	const name = "paychaos.lease"
	var granted []string
	for i := 1; i <= 2; i++ {
		conn, err := g.nodes[i].db.Conn(ctx)
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); err != nil {
			return 0, err
		}
		if got.Int64 == 1 {
			granted = append(granted, g.nodes[i].name)
		}
	}
	w.note("GET_LOCK(%q) granted on %v at once", name, granted)
	var dbs []*sqlx.DB
	for i := 1; i <= 2; i++ {
		db, err := sqldb.Open(ctx, g.nodeDSN(i, w.dbName), 2)
		if err != nil {
			return 0, err
		}
		defer db.Close()
		dbs = append(dbs, db)
	}
	// A lease released through one node is taken through the other once
	// that node has applied the release, or once the two takers'
	// writesets are certified in order: the taker waits for it, as
	// reconcile --fix does, instead of failing at once.
	refused := 0
	for round := range 3 {
		_, release, err := sqldb.Lease(ctx, dbs[round%2], name, 10*time.Second)
		if err != nil {
			return refused, fmt.Errorf("lease through %s: %w", g.nodes[1+round%2].name, err)
		}
		_, _, err = sqldb.Lease(ctx, dbs[(round+1)%2], name, 0)
		release()
		if !errors.Is(err, sqldb.ErrLocked) {
			return refused, fmt.Errorf("lease held through %s, taken through %s too: %v", g.nodes[1+round%2].name,
				g.nodes[1+(round+1)%2].name, err)
		}
		refused++
	}
	w.note("the lease held through one node was refused through the other %d times of %d", refused, 3)
	w.hit(refused)
	return refused, nil
}

// alertHook is a slow webhook that counts the alerts posted per dead letter.
type alertHook struct {
	url   string
	srv   *http.Server
	mu    sync.Mutex
	posts map[int64]int
}

func newAlertHook() (*alertHook, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &alertHook{url: "http://" + ln.Addr().String() + "/alert", posts: map[int64]int{}}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var a struct {
			ID int64 `json:"deadLetterId"`
		}
		json.NewDecoder(r.Body).Decode(&a)
		h.mu.Lock()
		h.posts[a.ID]++
		h.mu.Unlock()
		time.Sleep(300 * time.Millisecond) // slow: rounds of two replicas overlap
	})}
	go h.srv.Serve(ln)
	return h, nil
}

// alertedOnce is the evidence that the instances' alerters, each on its
// own node, posted each dead letter's alert once: the rounds take turns
// across nodes.
func alertedOnce(ctx context.Context, w *world, _ *workload) (bool, string) {
	h := w.galera.hook
	if h == nil {
		return false, "no webhook"
	}
	defer h.srv.Close()
	var alerted int
	if err := w.db.GetContext(ctx, &alerted, "SELECT COUNT(*) FROM t_dead_letter WHERE alerted_at IS NOT NULL"); err != nil {
		return false, err.Error()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	posts, twice := 0, 0
	for _, n := range h.posts {
		posts += n
		if n > 1 {
			twice++
		}
	}
	return alerted > 0 && twice == 0, fmt.Sprintf("%d dead letters alerted, %d posts, %d alerted more than once (want none)",
		alerted, posts, twice)
}
