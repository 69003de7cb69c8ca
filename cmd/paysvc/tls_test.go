package main

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/testenv"
	"github.com/paysvc/paysvc/internal/tlsca"
)

// waitPort waits for a TCP listener on addr.
func waitPort(t *testing.T, addr string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, "nothing listens on %s", addr)
}

// paysvc reaches Redis over TLS (redis.tls, redis.caFile) on a local TLS-only
// redis-server with a throwaway CA, and refuses a server its CA did not sign.
func TestRedisTLS(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ca := testenv.CA(t)
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	srv := exec.Command("redis-server", "--port", "0", "--tls-port", port, "--bind", "127.0.0.1",
		"--tls-cert-file", filepath.Join(ca, "server.pem"), "--tls-key-file", filepath.Join(ca, "server-key.pem"),
		"--tls-ca-cert-file", filepath.Join(ca, "ca.pem"), "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	waitPort(t, addr)

	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (81, 10.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('TLS1', 81, 1.00)")
	_, logs := w.daemonInProcess("PAYSVC_REDIS_ADDR="+addr, "PAYSVC_REDIS_TLS=true",
		"PAYSVC_REDIS_CAFILE="+filepath.Join(ca, "ca.pem"))
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("TLS1", 81, "1.00"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'TLS1' AND status = 'PAID'") == 1
	}, "payment not applied over TLS Redis")

	tc, err := tlsca.Config(filepath.Join(ca, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	tc.ServerName = "127.0.0.1"
	rdb := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: tc})
	defer rdb.Close()
	if v := rdb.Get(context.Background(), w.prefix+"TLS1").Val(); v != "done" {
		t.Fatalf("key in the TLS Redis = %q, want done (logs:\n%s)", v, logs)
	}

	// A CA that did not sign the server: paysvc refuses and waits.
	other := testenv.CA(t)
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = run(ctx, []string{"run"}, w.env("PAYSVC_REDIS_ADDR="+addr, "PAYSVC_REDIS_TLS=true",
		"PAYSVC_REDIS_CAFILE="+filepath.Join(other, "ca.pem")), &out)
	if err != nil || !strings.Contains(out.String(), "certificate") {
		t.Fatalf("with the wrong CA: %v; want a wait on a certificate error:\n%s", err, out.String())
	}
}
