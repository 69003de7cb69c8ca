package main

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigDefaults(t *testing.T) {
	c, err := loadConfig(filepath.Join(t.TempDir(), "absent.yaml"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Idempotent.KeyPrefix != "mq:consumed:pay_success:" || c.Idempotent.TTL != 24*time.Hour ||
		c.Idempotent.RedisFallback != "CLOSED" || c.Retry.MaxAttempts != 5 ||
		!reflect.DeepEqual(c.Retry.Delays, []time.Duration{30 * time.Second, time.Minute, 5 * time.Minute}) {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestConfigShippedFileIsValid(t *testing.T) {
	if _, err := loadConfig("../../config.yaml", true, nil); err != nil {
		t.Fatal(err)
	}
}

func TestConfigMissingExplicitFile(t *testing.T) {
	if _, err := loadConfig(filepath.Join(t.TempDir(), "absent.yaml"), true, nil); err == nil {
		t.Fatal("a missing --config file was accepted")
	}
}

func TestConfigEnvOverrides(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "dsn")
	os.WriteFile(secret, []byte("paysvc:s3cret@tcp(db:3306)/pay\n"), 0o600)
	path := writeConfig(t, "amqp:\n  workers: 2\nretry:\n  delays: [1s]\n")
	c, err := loadConfig(path, true, map[string]string{
		"PAYSVC_AMQP_URL":                 "amqp://u:p@rabbit:5672/pay",
		"PAYSVC_AMQP_WORKERS":             "7",
		"PAYSVC_AMQP_PREFETCH":            "70",
		"PAYSVC_MYSQL_DSN_FILE":           secret,
		"PAYSVC_REDIS_ADDR":               "cache:6380",
		"PAYSVC_REDIS_DB":                 "3",
		"PAYSVC_RETRY_DELAYS":             "1s, 2s,3s",
		"PAYSVC_RETRY_MAXATTEMPTS":        "9",
		"PAYSVC_IDEMPOTENT_REDISFALLBACK": "open",
		"PAYSVC_HTTP_ADDR":                "",
		"PAYSVC_TEST_ANYTHING":            "ignored",
		"HOME":                            "/root",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.AMQP.URL != "amqp://u:p@rabbit:5672/pay" || c.AMQP.Workers != 7 || c.AMQP.Prefetch != 70 ||
		c.MySQL.DSN != "paysvc:s3cret@tcp(db:3306)/pay" || c.Redis.Addr != "cache:6380" || c.Redis.DB != 3 ||
		c.Retry.MaxAttempts != 9 || c.Idempotent.RedisFallback != "OPEN" || c.HTTP.Addr != "" ||
		!reflect.DeepEqual(c.Retry.Delays, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}) {
		t.Fatalf("overrides not applied: %+v", c)
	}
	if logged := fmt.Sprint(c.redacted()); strings.Contains(logged, "s3cret") || strings.Contains(logged, "u:p@") {
		t.Fatalf("secret in the logged config: %s", logged)
	}
}

// Every bad key is named, all at once.
func TestConfigInvalidNamesEveryKey(t *testing.T) {
	path := writeConfig(t, `
amqp:
  url: http://nope
  prefetch: 0
  workers: many
  surprise: 1
mysql:
  dsn: "not a dsn"
  maxOpenConns: 0
redis:
  addr: nocolon
idempotent:
  ttl: forever
  redisFallback: MAYBE
retry:
  delays: [10ms, 1s, 1s]
  maxAttempts: -1
http:
  addr: ":::"
log:
  level: loud
  format: xml
extra: true
`)
	_, err := loadConfig(path, true, map[string]string{"PAYSVC_AMQP_URLL": "typo", "PAYSVC_REDIS_DB": "x"})
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, key := range []string{
		"amqp.url", "amqp.prefetch", "amqp.workers", "amqp.surprise: unknown key", "mysql.dsn",
		"mysql.maxopenconns: unknown", "mysql.maxOpenConns", "redis.addr", "redis.db", "idempotent.ttl",
		"idempotent.redisFallback", "retry.delays: want whole milliseconds", "retry.delays: 1s appears twice",
		"retry.maxAttempts", "http.addr", "log.level", "log.format", "extra: unknown key",
		"PAYSVC_AMQP_URLL: unknown environment variable",
	} {
		if key == "mysql.maxopenconns: unknown" {
			if strings.Contains(err.Error(), key) {
				t.Errorf("a known key was reported unknown: %v", err)
			}
			continue
		}
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error does not name %q:\n%v", key, err)
		}
	}
}

func TestConfigTable(t *testing.T) {
	tests := []struct {
		yaml string
		env  map[string]string
		bad  string // "" = valid
	}{
		{"amqp:\n  url: amqps://h:5671/v\n", nil, ""},
		{"", map[string]string{"PAYSVC_AMQP_PREFETCH": "12x"}, "amqp.prefetch: want an integer"},
		{"", map[string]string{"PAYSVC_RETRY_DELAYS": "1s,,2s"}, "retry.delays"},
		{"", map[string]string{"PAYSVC_RETRY_DELAYS": "500ms"}, ""},
		{"retry:\n  delays: 30s\n", nil, ""},
		{"retry:\n  delays: [30]\n", nil, "retry.delays: want a duration"},
		{"idempotent:\n  lease: 1s\n", nil, "idempotent.lease"},
		{"amqp: 5\n", nil, "amqp: unknown key"},
		{"", map[string]string{"PAYSVC_MYSQL_DSN": "a", "PAYSVC_MYSQL_DSN_FILE": "/x"}, "set both"},
		{"", map[string]string{"PAYSVC_REDIS_PASSWORD_FILE": "/nonexistent/secret"}, "redis.password: PAYSVC_REDIS_PASSWORD_FILE"},
		{"redis:\n  password: 0123\n", nil, "redis.password: want a string (quote it)"},
		{"redis:\n  password: \"0123\"\n", nil, ""},
		{"amqp:\n  workers: 1001\n", nil, "amqp.workers"},
		{"mysql:\n  groupSize: 0\n", nil, "mysql.groupSize: want 1 to 100"},
		{"mysql:\n  groupSize: 1\n", nil, ""},
		{"mysql:\n  maxOpenConns: 4\n  groupConns: 5\n", nil, "mysql.groupConns: want 1 to mysql.maxOpenConns (4)"},
		{"", map[string]string{"PAYSVC_MYSQL_GROUPCONNS": "4", "PAYSVC_MYSQL_MAXOPENCONNS": "4"}, ""},
		{"reconcile:\n  fix: maybe\n", nil, "reconcile.fix: want true or false"},
		{"", map[string]string{"PAYSVC_RECONCILE_FIX": "true", "PAYSVC_RECONCILE_INTERVAL": "1h"}, ""},
		{"admin:\n  token: short\n", nil, "admin.token"},
		{"admin:\n  token: CHANGE-ME-to-16-or-more-characters\n", nil, "admin.token: is a placeholder"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:CHANGE-ME-to-16-or-more-characters"}, "admin.operators: operator \"alice\": the token is a placeholder"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:0123456789abcdef0123,alice:x"}, "admin.operators: operator \"alice\" is listed twice"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:short"}, "admin.operators: operator \"alice\": the token is shorter"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:sha256:abcd"}, "admin.operators: operator \"alice\": sha256"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:0123456789abcdef0123,\nbob:sha256:" + strings.Repeat("ab", 32)}, ""},
		{"admin:\n  sessionTtl: 10s\n", nil, "admin.sessionTtl"},
		{"alert:\n  webhookUrl: ftp://x\n", nil, "alert.webhookUrl"},
		{"trace:\n  otlpEndpoint: otel:4318\n", nil, "trace.otlpEndpoint"},
		{"trace:\n  otlpEndpoint: http://otel:4318/\n", nil, ""},
		{"", map[string]string{"PAYSVC_MYSQL_DSN": "root@tcp(127.0.0.1:3306)/paysvc?interpolateParams=false"},
			"mysql.dsn: interpolateParams=false is not supported"},
		{"", map[string]string{"PAYSVC_MYSQL_DSN": "root@tcp(127.0.0.1:3306)/paysvc?multiStatements=false&parseTime=false"},
			"mysql.dsn: parseTime=false"},
		{"", map[string]string{"PAYSVC_MYSQL_DSN": "root@tcp(127.0.0.1:3306)/paysvc?innodb_lock_wait_timeout=50"},
			"configure mysql.lockWaitTimeout"},
		{"", map[string]string{"PAYSVC_MYSQL_DSN": "root@tcp(127.0.0.1:3306)/paysvc?interpolateParams=true&parseTime=true"}, ""},
		{"mysql:\n  lockWaitTimeout: 30s\n", nil, "mysql.lockWaitTimeout: want less than the handling timeout (idempotent.lease/2 = 30s)"},
		{"mysql:\n  lockWaitTimeout: 1500ms\n", nil, "mysql.lockWaitTimeout: want whole seconds"},
		{"mysql:\n  lockWaitTimeout: 29s\n  idleTransactionTimeout: 2s\n", nil, ""},
		{"mysql:\n  idleTransactionTimeout: 0s\n", nil, "mysql.idleTransactionTimeout"},
	}
	for _, tt := range tests {
		_, err := loadConfig(writeConfig(t, tt.yaml), true, tt.env)
		switch {
		case tt.bad == "" && err != nil:
			t.Errorf("%q %v: unexpected error %v", tt.yaml, tt.env, err)
		case tt.bad != "" && (err == nil || !strings.Contains(err.Error(), tt.bad)):
			t.Errorf("%q %v: error %v, want one containing %q", tt.yaml, tt.env, err, tt.bad)
		}
	}
}
