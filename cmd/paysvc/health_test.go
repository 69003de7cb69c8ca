package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/testenv"
)

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// MySQL is down when the pod starts: /healthz answers at once (a liveness
// or startup probe must not kill the pod for an outage), /readyz says 503
// and why, `paysvc healthcheck` exits 0 against it; once MySQL answers the
// daemon wires itself and becomes ready.
func TestHealthzAnswersBeforeMySQL(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	proxy, dsn := testenv.MySQLProxy(t, w.dsn)
	proxy.Down()
	httpAddr := freeAddr(t)
	env := w.env("PAYSVC_MYSQL_DSN="+dsn, "PAYSVC_HTTP_ADDR="+httpAddr)
	p := w.start(env, "run")
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := get("http://" + httpAddr + "/healthz")
		return code == 200
	}, "/healthz did not answer while MySQL was down")
	if code, body := get("http://" + httpAddr + "/readyz"); code != 503 || !strings.Contains(body, "waiting for MySQL") {
		t.Fatalf("/readyz while MySQL is down: %d %q, want 503 naming MySQL", code, body)
	}
	// /metrics too, with the build the pod runs, as `paysvc version` says it.
	v, err := exec.Command(binary, "version").Output()
	f := strings.Fields(string(v))
	if err != nil || len(f) != 5 {
		t.Fatalf("paysvc version: %q, %v", v, err)
	}
	short, dirty := strings.CutSuffix(f[3], "-dirty")
	_, metrics := get("http://" + httpAddr + "/metrics")
	info := regexp.MustCompile(`\npaysvc_build_info\{goversion="([^"]*)",revision="([^"]*)",version="([^"]*)"\} 1\n`).FindStringSubmatch(metrics)
	if info == nil || info[1] != f[4] || !strings.HasPrefix(info[2], short) || strings.HasSuffix(info[2], "-dirty") != dirty || info[3] != f[1] {
		t.Fatalf("/metrics paysvc_build_info %q, want the version, revision and Go version of %q", info, v)
	}
	check := w.start(env, "healthcheck")
	if err := check.wait(t, 10*time.Second); err != nil {
		t.Fatalf("healthcheck while MySQL is down: %v\n%s", err, check.out)
	}
	// The healthcheck reads http.addr alone: a secret file unreadable for
	// a moment (a rotation), or any other key the daemon read at start,
	// does not fail a daemon that answers.
	missing := filepath.Join(t.TempDir(), "rotating")
	check = w.start(append(slices.Clip(env), "PAYSVC_REDIS_PASSWORD_FILE="+missing), "healthcheck")
	if err := check.wait(t, 10*time.Second); err != nil {
		t.Fatalf("healthcheck with a secret file missing: %v\n%s", err, check.out)
	}
	if !strings.Contains(p.out.String(), "mysql unavailable; waiting") {
		t.Fatalf("the daemon did not say it waits for MySQL:\n%s", p.out)
	}
	proxy.Up()
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, body := get("http://" + httpAddr + "/readyz")
		return code == 200 && strings.HasPrefix(body, "ready")
	}, "the daemon never became ready once MySQL answered")
}

// healthcheck fails (exit 1) when nothing answers, and run refuses an
// http.addr it cannot bind before it touches any dependency.
func TestHealthcheckFailsAndABusyAddressStopsStartup(t *testing.T) {
	t.Parallel()
	w := &world{t: t}
	free := freeAddr(t)
	check := w.start([]string{"PAYSVC_HTTP_ADDR=" + free}, "healthcheck")
	if err := check.wait(t, 10*time.Second); err == nil || !strings.Contains(check.out.String(), "healthcheck") {
		t.Fatalf("healthcheck with nothing listening: %v\n%s", err, check.out)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	// The MySQL DSN points nowhere: a daemon that waited for MySQL before
	// binding would hang here instead of failing.
	p := w.start([]string{"PAYSVC_HTTP_ADDR=" + busy.Addr().String(), "PAYSVC_MYSQL_DSN=root@tcp(127.0.0.1:1)/paysvc"}, "run")
	if err := p.wait(t, 10*time.Second); err == nil || !strings.Contains(p.out.String(), "http.addr") {
		t.Fatalf("run on a busy http.addr: %v\n%s", err, p.out)
	}
	if !strings.Contains(p.out.String(), "http.addr "+busy.Addr().String()) {
		t.Fatalf("run on a busy http.addr: the error does not name the address %s:\n%s", busy.Addr(), p.out)
	}
}

// net/http's own lines (here a handler's panic) reach the log as JSON
// entries with lib net/http, not stderr in plain text.
func TestHTTPServerErrorsGoToTheLog(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	addr := testenv.FreeAddr(t)
	h, err := startHealth(addr, "", metrics.New(), zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer h.srv.Close()
	h.mux.HandleFunc("GET /boom", func(http.ResponseWriter, *http.Request) { panic("boom") })
	if resp, err := http.Get("http://" + addr + "/boom"); err == nil {
		resp.Body.Close()
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		for _, e := range logs.All() {
			if e.ContextMap()["lib"] == "net/http" && strings.Contains(e.Message, "panic serving") {
				return true
			}
		}
		return false
	}, "the handler's panic did not reach the log")
}

// With admin.addr set, the operator pages and their sign-in are served
// there alone: http.addr answers /healthz, /readyz and /metrics and 404 for
// every page, admin.addr serves the pages and none of the probes. A busy
// admin.addr stops start-up naming it, and both listeners close when the
// daemon stops.
func TestAdminPagesOnTheirOwnListener(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	httpAddr, adminAddr := freeAddr(t), freeAddr(t)
	env := w.env("PAYSVC_HTTP_ADDR="+httpAddr, "PAYSVC_ADMIN_ADDR="+adminAddr,
		"PAYSVC_ADMIN_OPERATORS=bob:"+bobToken, "PAYSVC_METRICS_QUEUEINTERVAL=200ms")
	logs := &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"run"}, env, logs) }()
	defer func() {
		cancel()
		if t.Failed() {
			t.Logf("daemon output:\n%s", logs)
		}
	}()
	testenv.Eventually(t, 20*time.Second, func() bool {
		code, _ := get("http://" + httpAddr + "/readyz")
		return code == 200
	}, "daemon never ready")

	// do sends one request, with bob's token as a Bearer when bearer.
	do := func(method, url string, bearer bool, form string) (int, *http.Response) {
		t.Helper()
		req, err := newRequest(method, url, form)
		if err != nil {
			t.Fatal(err)
		}
		if bearer {
			req.Header.Set("Authorization", "Bearer "+bobToken)
		}
		resp, err := noRedirect().Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp
	}
	pages := []struct{ method, path, form string }{
		{"GET", "/login", ""},
		{"POST", "/login", "token=" + bobToken + "&next=/dlq"},
		{"GET", "/dlq", ""},
		{"GET", "/dlq/1", ""},
		{"POST", "/dlq/bulk", "action=discard"},
		{"GET", "/admin/sessions", ""},
		{"POST", "/logout", ""},
	}
	for _, p := range pages {
		if code, _ := do(p.method, "http://"+httpAddr+p.path, true, p.form); code != http.StatusNotFound {
			t.Errorf("http.addr %s %s: %d, want 404 (the page belongs to admin.addr)", p.method, p.path, code)
		}
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, _ := do("GET", "http://"+httpAddr+path, false, ""); code != http.StatusOK {
			t.Errorf("http.addr GET %s: %d, want 200", path, code)
		}
		if code, _ := do("GET", "http://"+adminAddr+path, false, ""); code != http.StatusNotFound {
			t.Errorf("admin.addr GET %s: %d, want 404 (probes and metrics belong to http.addr)", path, code)
		}
	}
	// The pages on admin.addr: the sign-in page, a sign-in that gives a
	// session, the list through it and through a token.
	if code, _ := do("GET", "http://"+adminAddr+"/login", false, ""); code != http.StatusOK {
		t.Errorf("admin.addr GET /login: %d, want 200", code)
	}
	code, resp := do("POST", "http://"+adminAddr+"/login", false, "token="+bobToken+"&next=/dlq")
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "paysvc_admin" && c.Value != "" {
			session = c
		}
	}
	if code != http.StatusSeeOther || session == nil {
		t.Fatalf("admin.addr POST /login: %d, cookie %v, want 303 with a session", code, session)
	}
	req, _ := http.NewRequest("GET", "http://"+adminAddr+"/dlq", nil)
	req.AddCookie(session)
	if resp, err := noRedirect().Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("admin.addr GET /dlq with the session: %v %v, want 200", resp, err)
	} else {
		resp.Body.Close()
	}
	for _, path := range []string{"/dlq", "/admin/sessions"} {
		if code, _ := do("GET", "http://"+adminAddr+path, true, ""); code != http.StatusOK {
			t.Errorf("admin.addr GET %s with the token: %d, want 200", path, code)
		}
	}

	// A busy admin.addr stops start-up, naming it.
	busy := w.start(w.env("PAYSVC_HTTP_ADDR="+freeAddr(t), "PAYSVC_ADMIN_ADDR="+adminAddr), "run")
	if err := busy.wait(t, 10*time.Second); err == nil || !strings.Contains(busy.out.String(), "admin.addr "+adminAddr) {
		t.Errorf("run on a busy admin.addr: %v\n%s", err, busy.out)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not stop")
	}
	for _, addr := range []string{httpAddr, adminAddr} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the daemon stopped", addr)
		}
	}
}

// readyzBudget is the longest /readyz may take while MySQL is slow: half
// the kubelet's default probe timeout (1 s).
const readyzBudget = 500 * time.Millisecond

// /readyz answers from the state the consumer's dependency checks keep,
// never by asking MySQL: while MySQL commits nothing (a table locked by
// another session: payments and reads of the table wait; or a network
// path that loses everything, reads included) every /readyz answers
// within readyzBudget, and still means what it says: 503 with the pause's
// reason once consumption pauses on the stall, 200 once it is over.
func TestReadyzAnswersFastWhileMySQLIsSlow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		stall func(t *testing.T, w *world, proxy *testenv.Proxy) (end func())
		why   string // in /readyz once paused
	}{
		{"table-locked", func(t *testing.T, w *world, _ *testenv.Proxy) func() {
			ctx := context.Background()
			conn, err := w.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, "LOCK TABLES t_account WRITE, t_order WRITE"); err != nil {
				t.Fatal(err)
			}
			end := func() { conn.ExecContext(ctx, "UNLOCK TABLES"); conn.Close() }
			t.Cleanup(end)
			return end
		}, "paused"},
		{"everything-black-holed", func(t *testing.T, _ *world, proxy *testenv.Proxy) func() {
			proxy.BlackholeWhen(func([]byte) bool { return true })
			// The black-holed connections stay stuck: close them so the
			// daemon dials anew once the path is back.
			return func() { proxy.BlackholeWhen(nil); proxy.Down(); proxy.Up() }
		}, "paused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			proxy, dsn := testenv.MySQLProxy(t, w.dsn)
			w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (71, 100.00)")
			for i := range 8 {
				w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, 71, 1.00)", fmt.Sprintf("RDY%d", i))
			}
			addr, _ := w.daemonInProcess("PAYSVC_MYSQL_DSN=" + dsn)
			client := &http.Client{Timeout: 2 * time.Second}
			var slowest time.Duration
			var answers int
			// probe asks /readyz once, failing the test past readyzBudget.
			probe := func() (int, string) {
				t.Helper()
				start := time.Now()
				resp, err := client.Get("http://" + addr + "/readyz")
				took := time.Since(start)
				if err != nil {
					t.Fatalf("/readyz: %v after %v", err, took)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answers++
				slowest = max(slowest, took)
				if took > readyzBudget {
					t.Errorf("/readyz took %v (%d %q), want under %v", took, resp.StatusCode, b, readyzBudget)
				}
				return resp.StatusCode, string(b)
			}
			testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("RDY0", 71, "1.00"))
			testenv.Eventually(t, 20*time.Second, func() bool {
				return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'RDY0' AND status = 'PAID'") == 1
			}, "the payment before the stall was not applied")

			end := tc.stall(t, w, proxy)
			for i := 1; i < 8; i++ {
				testenv.Publish(t, w.amqpURL, listener.MainQueue, payment(fmt.Sprintf("RDY%d", i), 71, "1.00"))
			}
			// Ask every 50 ms until consumption pauses on the stall, and
			// for 3 s after: each answer within the budget.
			deadline, pausedAt := time.Now().Add(30*time.Second), time.Time{}
			for time.Now().Before(deadline) && (pausedAt.IsZero() || time.Since(pausedAt) < 3*time.Second) {
				code, body := probe()
				if pausedAt.IsZero() && code == http.StatusServiceUnavailable && strings.Contains(body, tc.why) {
					pausedAt = time.Now()
				}
				time.Sleep(50 * time.Millisecond)
			}
			if pausedAt.IsZero() {
				t.Fatalf("/readyz never said the consumer paused on the stall (%d answers)", answers)
			}
			end()
			testenv.Eventually(t, 60*time.Second, func() bool {
				code, body := probe()
				return code == http.StatusOK && strings.HasPrefix(body, "ready")
			}, "/readyz not ready again after the stall")
			testenv.Eventually(t, 60*time.Second, func() bool {
				return w.count("SELECT COUNT(*) FROM t_order WHERE order_no LIKE 'RDY%' AND status = 'PAID'") == 8
			}, "the payments of the stall were not applied after it")
			t.Logf("%d /readyz answers, the slowest in %v", answers, slowest)
		})
	}
}
