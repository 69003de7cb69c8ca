package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/sqldb"
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

	plain := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(context.Background()).Err(); err == nil {
		t.Fatal("the TLS Redis answered a plaintext PING: the test proves nothing")
	}
	tc, err := tlsca.Config(filepath.Join(ca, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	tc.ServerName = "127.0.0.1"
	rdb := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: tc})
	defer rdb.Close()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return rdb.Get(context.Background(), w.prefix+"TLS1").Val() == "done"
	}, "the key in the TLS Redis never became done (logs:\n%s)", logs)

	// A CA that did not sign the server: paysvc refuses and waits.
	other := testenv.CA(t)
	var out lockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = run(ctx, []string{"run"}, w.env("PAYSVC_REDIS_ADDR="+addr, "PAYSVC_REDIS_TLS=true",
		"PAYSVC_REDIS_CAFILE="+filepath.Join(other, "ca.pem")), &out)
	if err != nil || !strings.Contains(out.String(), "certificate") {
		t.Fatalf("with the wrong CA: %v; want a wait on a certificate error:\n%s", err, out.String())
	}
}

// paysvc reaches MySQL over TLS (mysql.caFile) on a second, TLS-only MariaDB
// (require_secure_transport) started for the test with a throwaway CA.
func TestMySQLTLS(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ca := testenv.CA(t)
	addr := testenv.MariaDB(t, "--skip-log-bin",
		"--ssl-cert="+filepath.Join(ca, "server.pem"), "--ssl-key="+filepath.Join(ca, "server-key.pem"),
		"--ssl-ca="+filepath.Join(ca, "ca.pem"), "--require-secure-transport=ON")

	dsn := "root@tcp(" + addr + ")/paysvc_tls"
	caFile := filepath.Join(ca, "ca.pem")
	tlsEnv := []string{"PAYSVC_MYSQL_DSN=" + dsn, "PAYSVC_MYSQL_CAFILE=" + caFile}
	var out lockedBuffer
	if err := run(context.Background(), []string{"migrate"}, tlsEnv, &out); err != nil {
		t.Fatalf("migrate over TLS: %v\n%s", err, out.String())
	}
	if err := run(context.Background(), []string{"migrate"}, []string{"PAYSVC_MYSQL_DSN=" + dsn}, &out); err == nil {
		t.Fatal("a plain connection to the TLS-only server succeeded: the test proves nothing")
	}
	cfg := &Config{}
	cfg.MySQL.DSN, cfg.MySQL.CAFile = dsn, caFile
	tlsDSN, err := cfg.mysqlDSN()
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqldb.Open(context.Background(), tlsDSN, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (82, 10.00)")
	db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('MTLS1', 82, 1.00)")
	w.daemonInProcess(tlsEnv...)
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("MTLS1", 82, "1.00"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		var n int
		db.Get(&n, "SELECT COUNT(*) FROM t_order WHERE order_no = 'MTLS1' AND status = 'PAID'")
		return n == 1
	}, "payment not applied over TLS MySQL")
	var cipher struct{ Name, Value string }
	if err := db.QueryRow("SHOW STATUS LIKE 'Ssl_cipher'").Scan(&cipher.Name, &cipher.Value); err != nil || cipher.Value == "" {
		t.Fatalf("connection not encrypted: %+v %v", cipher, err)
	}

	// A CA that did not sign the server: paysvc refuses it, naming the
	// certificate, instead of taking any server that answers.
	other := testenv.CA(t)
	var refused lockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = run(ctx, []string{"migrate"}, []string{"PAYSVC_MYSQL_DSN=" + dsn,
		"PAYSVC_MYSQL_CAFILE=" + filepath.Join(other, "ca.pem")}, &refused)
	if err == nil || !strings.Contains(err.Error()+refused.String(), "certificate") {
		t.Fatalf("migrate with the wrong CA: %v; want a certificate error:\n%s", err, refused.String())
	}
}

// paysvc reaches RabbitMQ over TLS (amqps://, amqp.caFile) on a second,
// TLS-only RabbitMQ node started for the test with a throwaway CA.
func TestAMQPTLS(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ca := testenv.CA(t)
	files := map[string][]byte{}
	for _, f := range []string{"ca.pem", "server.pem", "server-key.pem"} {
		b, err := os.ReadFile(filepath.Join(ca, f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = b
	}
	// The node's directory is known once it exists: name the files from it.
	const conf = "listeners.tcp = none\nlisteners.ssl.default = {{PORT}}\nssl_options.cacertfile = {{DIR}}/ca.pem\n" +
		"ssl_options.certfile = {{DIR}}/server.pem\nssl_options.keyfile = {{DIR}}/server-key.pem\n" +
		"ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n"
	_, _, addr := testenv.RabbitNode(t, conf, files)

	url := "amqps://guest:guest@" + addr + "/"
	caFile := filepath.Join(ca, "ca.pem")
	if c, err := amqp.DialConfig("amqp://guest:guest@"+addr+"/", amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)}); err == nil {
		c.Close()
		t.Fatal("the TLS-only node took a plaintext AMQP connection: the test proves nothing")
	}
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (83, 10.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('ATLS1', 83, 1.00)")
	w.daemonInProcess("PAYSVC_AMQP_URL="+url, "PAYSVC_AMQP_CAFILE="+caFile)

	tc, err := tlsca.Config(caFile)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.DialTLS(url, tc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	if err := ch.Publish("", listener.MainQueue, true, false, amqp.Publishing{DeliveryMode: amqp.Persistent,
		Body: payment("ATLS1", 83, "1.00")}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'ATLS1' AND status = 'PAID'") == 1
	}, "payment not applied over amqps")

	// A CA that did not sign the node: paysvc refuses it and waits, naming
	// the certificate, instead of taking any broker that answers.
	other := testenv.CA(t)
	var out lockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = run(ctx, []string{"run"}, w.env("PAYSVC_AMQP_URL="+url, "PAYSVC_AMQP_CAFILE="+filepath.Join(other, "ca.pem")), &out)
	if err != nil || !strings.Contains(out.String(), "certificate") {
		t.Fatalf("with the wrong CA: %v; want a wait on a certificate error:\n%s", err, out.String())
	}
}
