// Package testenv gives integration tests isolated resources on the real
// servers: a fresh MySQL database with the real migrations, a fresh RabbitMQ
// vhost, a Redis key prefix. Everything is removed when the test ends.
// It makes them through internal/scratch, which programs that are not tests
// (the benchmark, the fault-injection suite) use directly.
//
// The servers default to loopback and can be moved with PAYSVC_TEST_MYSQL_DSN
// (a DSN without database), PAYSVC_TEST_AMQP_URL (without vhost) and
// PAYSVC_TEST_REDIS_ADDR. An unreachable server fails the test: it never skips.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/scratch"
)

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Name returns a short unique name for t, safe as a database, vhost or key
// prefix component.
func Name(t testing.TB) string {
	b := make([]byte, 4)
	rand.Read(b)
	base := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_"))
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	return "pt_" + strings.Trim(base, "_") + "_" + hex.EncodeToString(b)
}

// MySQL creates a database, applies the migrations, and returns its DSN and
// an open pool. The database is dropped at cleanup.
func MySQL(t testing.TB) (string, *sqlx.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := scratch.NewDatabase(ctx, env("PAYSVC_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/"), Name(t), 16)
	if err != nil {
		t.Fatalf("mysql (start it: scripts/ensure-services.sh): %v", err)
	}
	t.Cleanup(d.Close)
	return d.DSN, d.DB
}

// AMQP creates a vhost that the URL's user may use and returns its URL. The
// vhost, with its queues, is deleted at cleanup.
func AMQP(t testing.TB) string {
	t.Helper()
	base := env("PAYSVC_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("PAYSVC_TEST_AMQP_URL: %v", err)
	}
	user := "guest"
	if u.User != nil {
		user = u.User.Username()
	}
	vhost := Name(t)
	t.Cleanup(func() { scratch.DeleteVhost(vhost) })
	vurl, err := scratch.NewVhost(base, vhost, user)
	if err != nil {
		t.Fatal(err)
	}
	return vurl
}

func rabbitmqctl(t testing.TB, args ...string) {
	t.Helper()
	if err := scratch.RabbitmqCtl(args...); err != nil {
		t.Fatal(err)
	}
}

// RedisAddr is the Redis server the tests use.
func RedisAddr() string { return env("PAYSVC_TEST_REDIS_ADDR", "127.0.0.1:6379") }

// Redis returns a client and a key prefix of the test's own; the prefix's keys
// are deleted at cleanup.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: RedisAddr()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis unreachable (start it: scripts/ensure-services.sh): %v", err)
	}
	prefix := Name(t) + ":"
	t.Cleanup(func() {
		scratch.DeleteKeys(context.Background(), rdb, prefix)
		rdb.Close()
	})
	return rdb, prefix
}

// Eventually polls cond every 20ms until it returns true or the deadline
// passes, then fails the test with msg.
func Eventually(t testing.TB, within time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, fmt.Sprintf(msg, args...))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
