package main

import (
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
	h, err := startHealth(addr, metrics.New(), zap.New(core))
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
