package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
	"github.com/paysvc/paysvc/migrations"
)

// binary is paysvc built with the faultinject tag, whose crash points are
// armed by PAYSVC_FAULT_POINT; without it the build behaves as a normal one.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "paysvc-e2e")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "paysvc")
	out, err := exec.Command("go", "build", "-tags", "faultinject", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build paysvc: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// world is one test's isolated servers.
type world struct {
	t       *testing.T
	dsn     string
	db      *sqlx.DB
	amqpURL string
	rdb     *redis.Client
	prefix  string
}

func newWorld(t *testing.T) *world {
	w := &world{t: t}
	w.dsn, w.db = testenv.MySQL(t)
	w.amqpURL = testenv.AMQP(t)
	w.rdb, w.prefix = testenv.Redis(t)
	return w
}

// env is the process environment configuring paysvc for this world.
func (w *world) env(extra ...string) []string {
	return append([]string{
		"PATH=" + os.Getenv("PATH"),
		"PAYSVC_AMQP_URL=" + w.amqpURL,
		"PAYSVC_MYSQL_DSN=" + w.dsn,
		"PAYSVC_REDIS_ADDR=" + testenv.RedisAddr(),
		"PAYSVC_IDEMPOTENT_KEYPREFIX=" + w.prefix,
		"PAYSVC_IDEMPOTENT_LEASE=3s",
		"PAYSVC_MYSQL_LOCKWAITTIMEOUT=1s",
		"PAYSVC_RETRY_DELAYS=500ms,1s",
		"PAYSVC_RETRY_MAXATTEMPTS=10",
		"PAYSVC_AMQP_WORKERS=4",
		"PAYSVC_AMQP_PREFETCH=16",
		"PAYSVC_AMQP_DRAINTIMEOUT=20s",
		"PAYSVC_HTTP_ADDR=",
	}, extra...)
}

// proc is a running paysvc process.
type proc struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (w *world) start(env []string, args ...string) *proc {
	w.t.Helper()
	p := &proc{out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Env = env
	p.cmd.Dir = w.t.TempDir()
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	w.t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if w.t.Failed() {
			w.t.Logf("paysvc output:\n%s", p.out)
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit error.
func (p *proc) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(within):
		t.Fatalf("paysvc still running after %s", within)
		return nil
	}
}

// results counts "message handled" log lines by result.
func (p *proc) results() map[string]int {
	n := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(p.out.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct{ Msg, Result string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "message handled" {
			n[line.Result]++
		}
	}
	return n
}

// unackedBy returns how many messages the process p holds unacknowledged
// now, from the broker's view (its consumer tag carries its pid).
func (w *world) unackedBy(p *proc) int {
	w.t.Helper()
	n := 0
	for tag, unacked := range testenv.Unacked(w.t, w.amqpURL) {
		if strings.Contains(tag, fmt.Sprintf("-%d-", p.cmd.Process.Pid)) {
			n += unacked
		}
	}
	return n
}

func (w *world) count(query string, args ...any) int {
	w.t.Helper()
	var n int
	if err := w.db.Get(&n, query, args...); err != nil {
		w.t.Fatal(err)
	}
	return n
}

func payment(orderNo string, userID int64, amount string) []byte {
	return []byte(fmt.Sprintf(`{"orderNo":%q,"userId":%d,"amount":%s}`, orderNo, userID, amount))
}

// A process killed at any point between the claim and the ack neither loses
// the payment nor applies it twice.
func TestKillAnywhereLosesNothingChargesOnce(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"after_claim", "mid_transaction", "after_commit"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 100.00)")
			w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('K1', 1, 30.00)")
			testenvDeclare(t, w.amqpURL)
			testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("K1", 1, "30.00"))

			crashed := w.start(w.env("PAYSVC_FAULT_POINT="+point), "run")
			err := crashed.wait(t, 30*time.Second)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("process exit %v, want killed at %s", err, point)
			}
			committed := w.count("SELECT COUNT(*) FROM t_account_flow WHERE biz_no = 'K1'")
			if want := map[bool]int{true: 1, false: 0}[point == "after_commit"]; committed != want {
				t.Fatalf("after the crash: %d flows, want %d", committed, want)
			}

			p := w.start(w.env(), "run")
			testenv.Eventually(t, 30*time.Second, func() bool {
				r := p.results()
				return r["FIRST"]+r["DUPLICATE"] == 1
			}, "redelivered payment not settled; outcomes %v", p.results())
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := p.wait(t, 30*time.Second); err != nil {
				t.Fatalf("SIGTERM exit: %v", err)
			}
			if n := w.count("SELECT COUNT(*) FROM t_account_flow WHERE biz_no = 'K1'"); n != 1 {
				t.Fatalf("%d flows, want exactly 1", n)
			}
			var bal money.Cents
			w.db.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 1")
			if bal != 7000 || w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'K1' AND status = 'PAID'") != 1 {
				t.Fatalf("balance %s, want 70.00 and the order PAID", bal)
			}
			if d := testenv.Depth(t, w.amqpURL, listener.MainQueue); d != 0 {
				t.Fatalf("%d messages left", d)
			}
		})
	}
}

// SIGTERM under load: in-flight messages finish and are acked, the rest go
// back to the queue, the process exits 0, and a second run finishes the job
// with every payment applied exactly once.
func TestSIGTERMUnderLoadLosesAndDoublesNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const users, orders = 10, 1000
	for u := 1; u <= users; u++ {
		w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (?, 1000.00)", u)
	}
	var msgs [][]byte
	for i := range orders {
		no := fmt.Sprintf("L%04d", i)
		u := i%users + 1
		w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, 1.25)", no, u)
		msgs = append(msgs, payment(no, int64(u), "1.25"))
		if i%3 == 0 {
			msgs = append(msgs, payment(no, int64(u), `"1.25"`)) // a duplicate
		}
	}
	testenvDeclare(t, w.amqpURL)
	testenv.Publish(t, w.amqpURL, listener.MainQueue, msgs...)

	// One worker paying alone: slow enough that the backlog outlasts the
	// checks below.
	first := w.start(w.env("PAYSVC_AMQP_WORKERS=1", "PAYSVC_MYSQL_GROUPSIZE=1"), "run")
	testenv.Eventually(t, 60*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_account_flow") >= 30
	}, "no progress")
	// Work in flight at the signal: the process holds unacked messages.
	testenv.Eventually(t, 10*time.Second, func() bool { return w.unackedBy(first) > 0 },
		"the first process held no unacked message: the SIGTERM would drain nothing")
	first.cmd.Process.Signal(syscall.SIGTERM)
	if err := first.wait(t, 30*time.Second); err != nil {
		t.Fatalf("SIGTERM exit: %v", err)
	}
	if strings.Contains(first.out.String(), "outcome not acknowledged") {
		t.Fatal("an outcome was not acked during the drain")
	}
	// Copies sent to retry come back from the wait queues to the main queue;
	// once they have, every published message is settled or in the queue.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return testenv.Depth(t, w.amqpURL, listener.WaitQueue(500*time.Millisecond))+
			testenv.Depth(t, w.amqpURL, listener.WaitQueue(time.Second)) == 0
	}, "wait queues did not drain back to the main queue")
	handled := first.results()
	left := testenv.Depth(t, w.amqpURL, listener.MainQueue)
	if settled := handled["FIRST"] + handled["DUPLICATE"] + handled["TERMINAL"]; settled+left != len(msgs) {
		t.Fatalf("after SIGTERM: %v handled + %d in the queue != %d published", handled, left, len(msgs))
	}
	t.Logf("first run: %v, %d left in the queue", handled, left)

	second := w.start(w.env(), "run")
	settled := func(r map[string]int) int { return r["FIRST"] + r["DUPLICATE"] + r["TERMINAL"] }
	testenv.Eventually(t, 60*time.Second, func() bool {
		return settled(first.results())+settled(second.results()) >= len(msgs)
	}, "not every message settled after the restart")
	second.cmd.Process.Signal(syscall.SIGTERM)
	if err := second.wait(t, 30*time.Second); err != nil {
		t.Fatalf("second SIGTERM exit: %v", err)
	}
	if n := w.count("SELECT COUNT(*) FROM t_order WHERE status = 'PAID'"); n != orders {
		t.Fatalf("%d orders paid, want %d", n, orders)
	}
	if n := w.count("SELECT COUNT(*) FROM t_account_flow"); n != orders {
		t.Fatalf("%d flows, want %d", n, orders)
	}
	if n := w.count("SELECT COUNT(*) FROM (SELECT biz_no FROM t_account_flow GROUP BY biz_no HAVING COUNT(*) > 1) d"); n != 0 {
		t.Fatalf("%d orders charged twice", n)
	}
	if n := w.count("SELECT COUNT(*) FROM t_account WHERE balance <> 1000.00 - 1.25 * ?", orders/users); n != 0 {
		t.Fatalf("%d balances wrong", n)
	}
	total := first.results()["FIRST"] + second.results()["FIRST"]
	if total != orders {
		t.Fatalf("%d FIRST outcomes over both runs, want %d", total, orders)
	}
	if d := testenv.Depth(t, w.amqpURL, listener.MainQueue); d != 0 {
		t.Fatalf("%d messages left", d)
	}
}

func TestRunRefusesUnmigratedSchema(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("ALTER TABLE t_account_flow DROP INDEX uk_biz_no_type")
	p := w.start(w.env(), "run")
	err := p.wait(t, 30*time.Second)
	if err == nil || !strings.Contains(p.out.String(), "uk_biz_no_type") {
		t.Fatalf("run without the unique index: exit %v, output %s", err, p.out)
	}
}

func TestBadConfigStopsStartupNamingTheKey(t *testing.T) {
	t.Parallel()
	w := &world{t: t}
	p := w.start([]string{"PAYSVC_AMQP_PREFETCH=0", "PAYSVC_IDEMPOTENT_REDISFALLBACK=SOMETIMES"}, "run")
	err := p.wait(t, 10*time.Second)
	if err == nil || !strings.Contains(p.out.String(), "amqp.prefetch") ||
		!strings.Contains(p.out.String(), "idempotent.redisFallback") {
		t.Fatalf("exit %v, output %s", err, p.out)
	}
}

// migrate creates the database, applies the migrations, and is safe to re-run.
func TestMigrateCreatesAndIsIdempotent(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	name := testenv.Name(t)
	dsn := strings.Replace(w.dsn, w.dsn[strings.LastIndex(w.dsn, "/"):], "/"+name, 1)
	t.Cleanup(func() { w.db.Exec("DROP DATABASE IF EXISTS `" + name + "`") })
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"migrate"}, []string{"PAYSVC_MYSQL_DSN=" + dsn}, &out); err != nil {
			t.Fatalf("migrate #%d: %v\n%s", i+1, err, out.String())
		}
		applied := strings.Count(out.String(), "migration applied")
		if want := map[int]int{0: len(ms), 1: 0}[i]; applied != want {
			t.Fatalf("migrate #%d applied %d migrations, want %d", i+1, applied, want)
		}
	}
	var n int
	w.db.Get(&n, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? AND table_name IN ('t_order','t_account','t_account_flow')", name)
	if n != 3 {
		t.Fatalf("%d tables, want 3", n)
	}
}

// The daemon started through run applies a payment and stops cleanly when
// its context ends.
func TestRunInProcess(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (2, 10.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('IP1', 2, 2.50)")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out lockedBuffer
	go func() { done <- run(ctx, []string{"run"}, w.env(), &out) }()
	testenv.Eventually(t, 20*time.Second, func() bool {
		return testenvQueueExists(t, w.amqpURL)
	}, "topology never declared")
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("IP1", 2, "2.50"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'IP1' AND status = 'PAID'") == 1
	}, "payment not applied")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

func testenvDeclare(t *testing.T, url string) {
	testenv.Declare(t, url, func(ch *amqp.Channel) error {
		return listener.Declare(ch, []time.Duration{500 * time.Millisecond, time.Second})
	})
}

func testenvQueueExists(t *testing.T, url string) bool {
	return testenv.QueueExists(t, url, listener.MainQueue)
}

// A panic while handling becomes a terminal outcome with its reason; the
// process keeps running and handles the next message.
func TestPanicBecomesTerminalNotACrashLoop(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (3, 10.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('PN1', 3, 1.00), ('PN2', 3, 2.00)")
	testenvDeclare(t, w.amqpURL)
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("PN1", 3, "1.00"))
	p := w.start(w.env("PAYSVC_FAULT_POINT=after_claim", "PAYSVC_FAULT_ACTION=panic"), "run")
	testenv.Eventually(t, 20*time.Second, func() bool { return p.results()["TERMINAL"] == 1 }, "panic not terminal")
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("PN2", 3, "2.00"))
	testenv.Eventually(t, 20*time.Second, func() bool { return p.results()["FIRST"] == 1 }, "next message not handled")
	// The parker files the terminal copy as a dead letter.
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count(`SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'PN1' AND error_class = 'panic'
			AND last_error LIKE '%fault injected at after_claim%' AND status = 'NEW'`) == 1
	}, "no dead letter for the panic")
	if w.rdb.Exists(context.Background(), w.prefix+"PN1").Val() != 0 {
		t.Fatal("the panicking message's claim was not released")
	}
	if n := w.count("SELECT COUNT(*) FROM t_account_flow WHERE biz_no = 'PN1'"); n != 0 {
		t.Fatalf("%d flows for the panicked payment", n)
	}
}

// Passwords never reach the logs: not in the logged configuration, not in
// connection errors.
func TestSecretsNeverLogged(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const secret = "s3cretPW"
	secretFile := filepath.Join(t.TempDir(), "dsn")
	os.WriteFile(secretFile, []byte("root:"+secret+"@tcp(127.0.0.1:3306)/nope\n"), 0o600)

	// A wrong MySQL password: paysvc waits for MySQL, logging why.
	var env []string
	for _, kv := range w.env("PAYSVC_MYSQL_DSN_FILE="+secretFile, "PAYSVC_REDIS_PASSWORD="+secret) {
		if !strings.HasPrefix(kv, "PAYSVC_MYSQL_DSN=") {
			env = append(env, kv)
		}
	}
	p := w.start(env, "run")
	testenv.Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(p.out.String(), "mysql unavailable")
	}, "no log of the MySQL failure")
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t, 20*time.Second)

	// A wrong broker password: start-up stops with the reason.
	badURL := strings.Replace(w.amqpURL, "guest:guest@", "guest:"+secret+"@", 1)
	q := w.start(w.env("PAYSVC_AMQP_URL="+badURL), "run")
	if err := q.wait(t, 30*time.Second); err == nil {
		t.Fatal("paysvc started with a wrong broker password")
	}
	for _, out := range []string{p.out.String(), q.out.String()} {
		if strings.Contains(out, secret) {
			t.Fatalf("secret in the output:\n%s", out)
		}
	}
	if !strings.Contains(q.out.String(), "xxxxx") || !strings.Contains(p.out.String(), "xxxxx") {
		t.Fatal("the logged configuration does not show redacted passwords")
	}
}

// The daemon's goroutines run on the Go runtime's own default number of
// CPUs (the cgroup's CPU limit, else the CPUs) unless GOMAXPROCS says
// otherwise, never forced to one; the soft memory limit is GOMEMLIMIT's
// when set. The start-up log says each and where it came from.
func TestDaemonFollowsTheRuntimeDefaultUnlessGOMAXPROCSSaysOtherwise(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	if defaultProcs == 1 {
		t.Log("the runtime's default here is 1 CPU: the default case cannot tell it from a forced 1")
	}
	for _, c := range []struct {
		env       []string
		procs     float64
		procsFrom string
		memLimit  float64
		memFrom   string
	}{
		{nil, float64(defaultProcs), "Go runtime default", -1, ""},
		{[]string{"GOMAXPROCS=3", "GOMEMLIMIT=300MiB"}, 3, "GOMAXPROCS environment variable", 300 << 20, "GOMEMLIMIT environment variable"},
	} {
		p := w.start(w.env(append([]string{"PAYSVC_LOG_FORMAT=json"}, c.env...)...), "run")
		var got struct {
			GOMAXPROCS     *float64
			GOMAXPROCSFrom string  `json:"gomaxprocs_from"`
			GOMEMLIMIT     float64 `json:"gomemlimit"`
			GOMEMLIMITFrom string  `json:"gomemlimit_from"`
		}
		testenv.Eventually(t, 20*time.Second, func() bool {
			for _, line := range strings.Split(p.out.String(), "\n") {
				if json.Unmarshal([]byte(line), &got) == nil && got.GOMAXPROCS != nil {
					return true
				}
			}
			return false
		}, "no gomaxprocs in the start-up log")
		if *got.GOMAXPROCS != c.procs || !strings.HasPrefix(got.GOMAXPROCSFrom, c.procsFrom) {
			t.Errorf("env %v: gomaxprocs %v from %q, want %v from %q", c.env, *got.GOMAXPROCS, got.GOMAXPROCSFrom, c.procs, c.procsFrom)
		}
		if c.memLimit >= 0 && (got.GOMEMLIMIT != c.memLimit || got.GOMEMLIMITFrom != c.memFrom) {
			t.Errorf("env %v: gomemlimit %v from %q, want %v from %q", c.env, got.GOMEMLIMIT, got.GOMEMLIMITFrom, c.memLimit, c.memFrom)
		}
		if got.GOMEMLIMITFrom == "" {
			t.Errorf("env %v: the log does not say where gomemlimit came from", c.env)
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		if err := p.wait(t, 30*time.Second); err != nil {
			t.Errorf("env %v: exit: %v", c.env, err)
		}
	}
}
