package browsertest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/testenv"
)

// binary is paysvc, built from the repository's cmd/paysvc.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "paysvc-browsertest")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "paysvc")
	build := exec.Command("go", "build", "-o", binary, "./cmd/paysvc")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build paysvc: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// The admin pages' operators in the tests: bob by his token, carol by her
// token's hash.
const (
	adminToken = "test-admin-token-0123456789"
	bobToken   = "bob-token-0123456789abcdef"
	carolToken = "carol-token-0123456789abcdef"
)

// world is one test's isolated servers.
type world struct {
	t       *testing.T
	dsn     string
	db      *sqlx.DB
	amqpURL string
	prefix  string
}

func newWorld(t *testing.T) *world {
	w := &world{t: t}
	w.dsn, w.db = testenv.MySQL(t)
	w.amqpURL = testenv.AMQP(t)
	_, w.prefix = testenv.Redis(t)
	return w
}

// daemon runs `paysvc run` for this world, with the admin pages on a
// loopback address it returns, until the test ends; a daemon that does
// not stop cleanly on SIGTERM fails the test.
func (w *world) daemon(extra ...string) (httpAddr string) {
	w.t.Helper()
	httpAddr = testenv.FreeAddr(w.t)
	env := append([]string{
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
		"PAYSVC_HTTP_ADDR=" + httpAddr,
		"PAYSVC_ADMIN_TOKEN=" + adminToken,
		"PAYSVC_ADMIN_OPERATORS=bob:" + bobToken + ",carol:sha256:" + sha256hex(carolToken),
		"PAYSVC_METRICS_QUEUEINTERVAL=200ms",
	}, extra...)
	out := &lockedBuffer{}
	cmd := exec.Command(binary, "run")
	cmd.Env = env
	cmd.Dir = w.t.TempDir()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	w.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				w.t.Errorf("paysvc run: %v", err)
			}
		case <-time.After(30 * time.Second):
			w.t.Error("daemon did not stop")
			cmd.Process.Kill()
			<-done
		}
		if w.t.Failed() {
			w.t.Logf("daemon output:\n%s", out)
		}
	})
	testenv.Eventually(w.t, 20*time.Second, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, "daemon never ready")
	return httpAddr
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

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
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
