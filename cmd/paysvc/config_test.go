package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
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
		{"prune:\n  outboxAfter: 30m\n", nil, "prune.outboxAfter: want 0 (off) or at least 1h, got 30m0s"},
		{"prune:\n  deadLettersAfter: 0s\n  eventsAfter: 1h\n", nil, ""},
		{"prune:\n  batch: 0\n", nil, "prune.batch: want 1 to 10000"},
		{"prune:\n  pause: -1s\n", nil, "prune.pause: want 0 or more"},
		{"prune:\n  interval: 500ms\n", nil, "prune.interval: want 0 (off) or at least 1s"},
		{"", map[string]string{"PAYSVC_PRUNE_DSN": "tcp(db"}, "prune.dsn"},
		{"admin:\n  token: short\n", nil, "admin.token"},
		{"admin:\n  token: CHANGE-ME-to-16-or-more-characters\n", nil, "admin.token: is a placeholder"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:CHANGE-ME-to-16-or-more-characters"}, "admin.operators: operator \"alice\": the token is a placeholder"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:0123456789abcdef0123,alice:x"}, "admin.operators: operator \"alice\" is listed twice"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:short"}, "admin.operators: operator \"alice\": the token is shorter"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:sha256:abcd"}, "admin.operators: operator \"alice\": sha256"},
		{"", map[string]string{"PAYSVC_ADMIN_OPERATORS": "alice:0123456789abcdef0123,\nbob:sha256:" + strings.Repeat("ab", 32)}, ""},
		{"admin:\n  sessionTtl: 10s\n", nil, "admin.sessionTtl"},
		{"http:\n  addr: 127.0.0.1:9000\nadmin:\n  addr: 127.0.0.1:9000\n", nil, "admin.addr: is http.addr"},
		{"admin:\n  addr: nowhere\n", nil, "admin.addr: want host:port"},
		{"admin:\n  addr: \":8081\"\n", nil, ""},
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
		{"amqp:\n  consumerTimeout: 1m\n", nil, "amqp.consumerTimeout: want at least 30m, got 1m0s"},
		{"amqp:\n  consumerTimeout: 29m59s\n", nil, "amqp.consumerTimeout: want at least 30m"},
		{"amqp:\n  consumerTimeout: 30m\n", nil, ""},
		{"amqp:\n  consumerTimeout: 30m\n  drainTimeout: 10m\nidempotent:\n  lease: 40m\n", nil,
			"amqp.consumerTimeout: want more than the handling timeout (idempotent.lease/2 = 20m0s) plus amqp.drainTimeout (10m0s), got 30m0s"},
		{"amqp:\n  consumerTimeout: 31m\n  drainTimeout: 10m\nidempotent:\n  lease: 40m\n", nil, ""},
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

// Every key is declared once, completely: a well-formed and unique name
// (and so environment variable), a description, a field of its own.
func TestConfigKeysDeclared(t *testing.T) {
	nameForm := regexp.MustCompile(`^[a-z]+\.[a-z][A-Za-z]*$`)
	names, envs := map[string]bool{}, map[string]string{}
	type field struct {
		addr uintptr
		typ  reflect.Type
	}
	var c Config
	bound := map[field]string{}
	for _, k := range keys {
		if !nameForm.MatchString(k.name) {
			t.Errorf("%q: want section.key (lower-case section, camelCase key)", k.name)
		}
		// viper folds case: two names differing only in case are one key.
		if names[strings.ToLower(k.name)] {
			t.Errorf("%s: declared twice", k.name)
		}
		names[strings.ToLower(k.name)] = true
		env := envName(k.name)
		if other, ok := envs[env]; ok {
			t.Errorf("%s and %s share the environment variable %s", k.name, other, env)
		}
		envs[env] = k.name
		if want := "PAYSVC_" + strings.ToUpper(strings.Replace(k.name, ".", "_", 1)); env != want {
			t.Errorf("%s: environment variable %s, want %s", k.name, env, want)
		}
		if strings.TrimSpace(k.doc) == "" {
			t.Errorf("%s: no description for the reference", k.name)
		}
		if k.secret && k.redact != nil {
			t.Errorf("%s: secret (never shown) and redact (shown without its password) both set", k.name)
		}
		p := reflect.ValueOf(k.bind(&c))
		switch p.Interface().(type) {
		case *string, *int, *bool, *float64, *time.Duration, *[]time.Duration:
		default:
			t.Errorf("%s: binds a %s, which the decoder does not know", k.name, p.Type())
			continue
		}
		if _, isString := p.Interface().(*string); !isString && (k.norm != nil || k.redact != nil || k.secret) {
			t.Errorf("%s: norm, redact and secret apply to strings only", k.name)
		}
		f := field{p.Pointer(), p.Type().Elem()}
		if other, ok := bound[f]; ok {
			t.Errorf("%s and %s bind the same field", k.name, other)
		}
		bound[f] = k.name
	}
	// Every field of Config is some key's.
	cv := reflect.ValueOf(&c).Elem()
	for i := range cv.NumField() {
		section := cv.Field(i)
		for j := range section.NumField() {
			f := section.Field(j)
			if _, ok := bound[field{f.Addr().Pointer(), f.Type()}]; !ok {
				t.Errorf("Config.%s.%s: no key declares it (config_keys.go)", cv.Type().Field(i).Name, section.Type().Field(j).Name)
			}
		}
	}
}

// envSamples is a valid value other than the default for every key, as
// given in the environment, with the value it must decode to.
func envSamples(t *testing.T) map[string]struct {
	val   string
	want  any
	extra map[string]string // other variables the value needs
} {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("not read at load"), 0o600); err != nil {
		t.Fatal(err)
	}
	type sample = struct {
		val   string
		want  any
		extra map[string]string
	}
	return map[string]sample{
		"amqp.url":                     {"amqp://u:p@rabbit:5672/pay", "amqp://u:p@rabbit:5672/pay", nil},
		"amqp.prefetch":                {"70", 70, nil},
		"amqp.workers":                 {" 7", 7, nil},
		"amqp.drainTimeout":            {"45s", 45 * time.Second, nil},
		"amqp.queueType":               {"Classic", "classic", nil},
		"amqp.deliveryLimit":           {"3", 3, nil},
		"amqp.consumerTimeout":         {"2h", 2 * time.Hour, nil},
		"amqp.caFile":                  {ca, ca, map[string]string{"PAYSVC_AMQP_URL": "amqps://guest:guest@127.0.0.1:5671/"}},
		"mysql.dsn":                    {"paysvc:pw@tcp(db:3306)/pay", "paysvc:pw@tcp(db:3306)/pay", nil},
		"mysql.maxOpenConns":           {"30", 30, nil},
		"mysql.groupSize":              {"4", 4, nil},
		"mysql.groupConns":             {"3", 3, nil},
		"mysql.lockWaitTimeout":        {"10s", 10 * time.Second, nil},
		"mysql.idleTransactionTimeout": {"1m", time.Minute, nil},
		"mysql.caFile":                 {ca, ca, nil},
		"redis.addr":                   {"cache:6380", "cache:6380", nil},
		"redis.username":               {"paysvc", "paysvc", nil},
		"redis.password":               {"pw", "pw", nil},
		"redis.db":                     {"3", 3, nil},
		"redis.masterName":             {"mymaster", "mymaster", nil},
		"redis.sentinelUsername":       {"watcher", "watcher", map[string]string{"PAYSVC_REDIS_MASTERNAME": "mymaster"}},
		"redis.sentinelPassword":       {"spw", "spw", map[string]string{"PAYSVC_REDIS_MASTERNAME": "mymaster"}},
		"redis.tls":                    {"TRUE", true, nil},
		"redis.caFile":                 {ca, ca, map[string]string{"PAYSVC_REDIS_TLS": "true"}},
		"idempotent.keyPrefix":         {"p:", "p:", nil},
		"idempotent.ttl":               {"48h", 48 * time.Hour, nil},
		"idempotent.lease":             {"90s", 90 * time.Second, nil},
		"idempotent.redisFallback":     {"open", "OPEN", nil},
		"retry.delays":                 {"1s, 2s", []time.Duration{time.Second, 2 * time.Second}, nil},
		"retry.maxAttempts":            {"9", 9, nil},
		"http.addr":                    {"", "", nil},
		"log.level":                    {"DEBUG", "debug", nil},
		"log.format":                   {"console", "console", nil},
		"log.firstPerSecond":           {"10", 10, nil},
		"admin.operators":              {"alice:0123456789abcdef0123", "alice:0123456789abcdef0123", nil},
		"admin.token":                  {"0123456789abcdef0123x", "0123456789abcdef0123x", nil},
		"admin.sessionTtl":             {"1h", time.Hour, nil},
		"admin.secureCookie":           {"false", false, nil},
		"admin.addr":                   {"127.0.0.1:8081", "127.0.0.1:8081", nil},
		"alert.webhookUrl":             {"https://hooks.example/x", "https://hooks.example/x", nil},
		"metrics.queueInterval":        {"1s", time.Second, nil},
		"reconcile.interval":           {"1h", time.Hour, nil},
		"reconcile.window":             {"48h", 48 * time.Hour, nil},
		"reconcile.fix":                {"true", true, nil},
		"reconcile.lostSweepRate":      {"500", 500, nil},
		"trace.otlpEndpoint":           {"http://otel:4318/", "http://otel:4318", nil},
		"prune.outboxAfter":            {"720h", 720 * time.Hour, nil},
		"prune.eventsAfter":            {"0s", time.Duration(0), nil},
		"prune.sessionsAfter":          {"24h", 24 * time.Hour, nil},
		"prune.deadLettersAfter":       {"8760h", 8760 * time.Hour, nil},
		"prune.batch":                  {"500", 500, nil},
		"prune.pause":                  {"0s", time.Duration(0), nil},
		"prune.interval":               {"1h", time.Hour, nil},
		"prune.dsn":                    {"pr:pw@tcp(db:3306)/paysvc", "pr:pw@tcp(db:3306)/paysvc", nil},
		"trace.sampleRatio":            {"0.01", 0.01, nil},
	}
}

// Each key's environment variable, and its _FILE, reaches the key's field.
func TestConfigEnvRoundTrip(t *testing.T) {
	defaults, err := loadConfig(filepath.Join(t.TempDir(), "absent.yaml"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	samples := envSamples(t)
	for _, k := range keys {
		s, ok := samples[k.name]
		if !ok {
			t.Errorf("%s: no sample value in envSamples", k.name)
			continue
		}
		if reflect.DeepEqual(k.value(defaults), s.want) {
			t.Errorf("%s: the sample %q is the default: it proves nothing", k.name, s.val)
		}
		file := filepath.Join(t.TempDir(), "value")
		if err := os.WriteFile(file, []byte(s.val+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, env := range []map[string]string{{envName(k.name): s.val}, {envName(k.name) + "_FILE": file}} {
			maps.Copy(env, s.extra)
			c, err := loadConfig(filepath.Join(t.TempDir(), "absent.yaml"), false, env)
			if err != nil {
				t.Errorf("%s: %v: %v", k.name, env, err)
				continue
			}
			if got := k.value(c); !reflect.DeepEqual(got, s.want) {
				t.Errorf("%s: %v gave %#v, want %#v", k.name, env, got, s.want)
			}
		}
	}
	if len(samples) != len(keys) {
		t.Errorf("envSamples has %d keys, keys %d: a sample for a key no longer declared", len(samples), len(keys))
	}
}

// Whatever a secret holds stays out of the logged configuration; so does the
// password in a URL or a DSN. The list of secrets is fixed here: a key that
// stops being secret fails this test.
func TestConfigSecretsRedacted(t *testing.T) {
	const sentinel = "SeNtInEl-0123456789abcdef"
	secrets := map[string]string{ // key → a value holding the sentinel
		"redis.password":         sentinel,
		"redis.sentinelPassword": sentinel,
		"admin.token":            sentinel,
		"admin.operators":        "alice:" + sentinel,
		"alert.webhookUrl":       "https://hooks.example/" + sentinel,
		"trace.otlpEndpoint":     "http://" + sentinel + "@otel:4318",
		"amqp.url":               "amqp://u:" + sentinel + "@rabbit1:5672/pay,amqps://v:" + sentinel + "@rabbit2:5671/pay",
		"mysql.dsn":              "paysvc:" + sentinel + "@tcp(db:3306)/pay",
		"prune.dsn":              "paysvc_prune:" + sentinel + "@tcp(db:3306)/pay",
	}
	for _, k := range keys {
		_, listed := secrets[k.name]
		if (k.secret || k.redact != nil) != listed {
			t.Errorf("%s: declared secret %v, redacted %v; this test lists it: %v", k.name, k.secret, k.redact != nil, listed)
		}
	}
	for _, k := range keys {
		val, ok := secrets[k.name]
		if !ok {
			continue
		}
		env := map[string]string{envName(k.name): val}
		if k.name == "redis.sentinelPassword" {
			env["PAYSVC_REDIS_MASTERNAME"] = "mymaster" // it needs one
		}
		c, err := loadConfig(filepath.Join(t.TempDir(), "absent.yaml"), false, env)
		if err != nil {
			t.Fatalf("%s: %v", k.name, err)
		}
		if k.value(c) != val {
			t.Fatalf("%s: not set to %q", k.name, val)
		}
		red := c.redacted()
		if logged := fmt.Sprint(red); strings.Contains(logged, sentinel) {
			t.Errorf("%s: its secret is in the logged configuration: %s", k.name, logged)
		}
		shown, _ := red[k.name].(string)
		if !strings.Contains(shown, "xxxxx") {
			t.Errorf("%s: logged as %q, want xxxxx in place of the secret", k.name, shown)
		}
	}
	// Everything else is logged as it is: every key, once.
	c, err := loadConfig(filepath.Join(t.TempDir(), "absent.yaml"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	red := c.redacted()
	if len(red) != len(keys) {
		t.Errorf("the logged configuration has %d keys, want %d", len(red), len(keys))
	}
	if red["amqp.prefetch"] != 128 || red["retry.delays"] == nil || red["idempotent.ttl"] != "24h0m0s" ||
		red["redis.tls"] != false || red["redis.password"] != "" || red["mysql.dsn"] != "root@tcp(127.0.0.1:3306)/paysvc" {
		t.Errorf("logged configuration: %v", red)
	}
}

// config.yaml lists every declared key, in the declarations' order, with
// its default and a comment; nothing else.
func TestConfigFileMatchesDeclarations(t *testing.T) {
	b, err := os.ReadFile("../../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var inFile []string
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		section := root.Content[i].Value
		for j := 0; j+1 < len(root.Content[i+1].Content); j += 2 {
			name, val := section+"."+root.Content[i+1].Content[j].Value, root.Content[i+1].Content[j+1]
			inFile = append(inFile, name)
			if val.LineComment == "" {
				t.Errorf("config.yaml: %s has no comment saying what it is", name)
			}
		}
	}
	declared := make([]string, len(keys))
	for i, k := range keys {
		declared[i] = k.name
		if !slices.Contains(inFile, k.name) {
			t.Errorf("config.yaml lacks %s (default %q): add it, with a comment", k.name, k.def)
		}
	}
	for _, name := range inFile {
		if !slices.Contains(declared, name) {
			t.Errorf("config.yaml has %s, which no key declares", name)
		}
	}
	if !t.Failed() && !slices.Equal(inFile, declared) {
		t.Errorf("config.yaml's keys are not in the declarations' order:\n%v\nwant\n%v", inFile, declared)
	}

	file, err := loadConfig("../../config.yaml", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := loadConfig(filepath.Join(t.TempDir(), "absent.yaml"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if got, def := k.value(file), k.value(defaults); !reflect.DeepEqual(got, def) {
			t.Errorf("config.yaml sets %s to %v, the declared default is %v (%q)", k.name, got, def, k.def)
		}
	}
}

var updateDocs = flag.Bool("update", false, "TestConfigReferenceUpToDate: rewrite the files that are out of date")

// The configuration reference in docs/configuration.md (and README.md, if
// it has the markers) is the one the declarations render, and
// deploy/k8s/base/config.yaml (the ConfigMap's source) is config.yaml. make docs
// rewrites them.
func TestConfigReferenceUpToDate(t *testing.T) {
	const regenerate = "make docs (go test ./cmd/paysvc -run TestConfigReferenceUpToDate -args -update)"
	check := func(path, want string) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) == want {
			return
		}
		if *updateDocs {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s rewritten", path)
			return
		}
		t.Errorf("%s is out of date: run %s", path, regenerate)
	}
	for _, f := range []struct {
		path     string
		required bool
	}{{"../../docs/configuration.md", true}, {"../../README.md", false}} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		want, found, err := withConfigReference(string(b))
		switch {
		case err != nil:
			t.Errorf("%s: %v", f.path, err)
		case !found && f.required:
			t.Errorf("%s: no %s ... %s markers for the reference", f.path, referenceBegin, referenceEnd)
		case found:
			check(f.path, want)
		}
	}

	// The ConfigMap's source, generated by kustomize: config.yaml itself.
	repo, err := os.ReadFile("../../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	check("../../deploy/k8s/base/config.yaml", string(repo))
}

// The reference names every key, its default and its variable, and the
// markers' surroundings are kept.
func TestConfigReferenceRendering(t *testing.T) {
	ref := configReference()
	for _, k := range keys {
		if !strings.Contains(ref, "| `"+k.name+"` |") || !strings.Contains(ref, "`"+envName(k.name)+"`") {
			t.Errorf("reference lacks %s", k.name)
		}
	}
	if n := strings.Count(ref, "\n"); n != len(keys)+2 {
		t.Errorf("reference has %d lines, want a header, a rule and %d keys", n, len(keys))
	}
	text := "before\n" + referenceBegin + "\nstale\n" + referenceEnd + "\nafter\n"
	out, found, err := withConfigReference(text)
	if err != nil || !found || !strings.HasPrefix(out, "before\n"+referenceBegin+"\n") ||
		!strings.HasSuffix(out, "\n"+referenceEnd+"\nafter\n") || strings.Contains(out, "stale") || !strings.Contains(out, ref) {
		t.Errorf("rewrite: %v %v\n%s", found, err, out)
	}
	if again, _, _ := withConfigReference(out); again != out {
		t.Error("a second rewrite changed the text")
	}
	if out, found, err := withConfigReference("no markers"); out != "no markers" || found || err != nil {
		t.Errorf("no markers: %q %v %v", out, found, err)
	}
	if _, _, err := withConfigReference(referenceEnd + referenceBegin); err == nil {
		t.Error("markers in the wrong order accepted")
	}
}

// Start-up errors never echo a secret: a secret YAML reads as a number (an
// unquoted all-digit password), and a DSN whose password holds a '/' that
// the driver's parser takes for the end of the address.
func TestConfigErrorsNeverEchoASecret(t *testing.T) {
	for _, c := range []struct {
		name, yaml, secret string
	}{
		{"redis.password as a number", "redis:\n  password: 7319046628815523\n", "7319046628815523"},
		{"admin.token as a float", "admin:\n  token: 7319046628.815523\n", "815523"},
		{"mysql.dsn with a slash in its password", "mysql:\n  dsn: \"paysvc:Zm9vX2Jh/cl9zZWNyZXQ=@tcp(db:3306)\"\n", "Zm9vX2Jh"},
		{"redis.addr as a URL with its password", "redis:\n  addr: \"redis://:SeNtInEl@r:6379\"\n", "SeNtInEl"},
		{"redis.addr with a user and password", "redis:\n  addr: \"default:SeNtInEl@r:6379\"\n", "SeNtInEl"},
		{"redis.addr with a password", "redis:\n  addr: \"SeNtInEl@r:6379\"\n", "SeNtInEl"},
		// An unescaped '/', '?' or '#' ends the authority early: the URL
		// parses with no password to redact, and would be logged whole.
		{"amqp.url with a slash opening its password", "amqp:\n  url: \"amqp://u:/SeNtInEl@rabbit:5672/pay\"\n", "SeNtInEl"},
		{"amqp.url with digits then a slash", "amqp:\n  url: \"amqp://u:2024/SeNtInEl@rabbit/\"\n", "SeNtInEl"},
		{"amqp.url with a question mark", "amqp:\n  url: \"amqp://u:?SeNtInEl@rabbit/\"\n", "SeNtInEl"},
	} {
		_, err := loadConfig(writeConfig(t, c.yaml), true, nil)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if strings.Contains(err.Error(), c.secret) {
			t.Errorf("%s: the error shows the secret: %v", c.name, err)
		}
		if key, _, _ := strings.Cut(c.name, " "); !strings.Contains(err.Error(), key) {
			t.Errorf("%s: the error does not name the key: %v", c.name, err)
		}
	}
}

// A Redis Cluster (several addresses, no master's name) has database 0
// only: redis.db there is refused, naming the key, not ignored.
func TestConfigRefusesADatabaseNumberForACluster(t *testing.T) {
	_, err := loadConfig(writeConfig(t, "redis:\n  addr: \"r1:6379,r2:6379,r3:6379\"\n  db: 3\n"), true, nil)
	if err == nil || !strings.Contains(err.Error(), "redis.db") {
		t.Fatalf("redis.db 3 with a Cluster: %v, want an error naming redis.db", err)
	}
	for _, yaml := range []string{
		"redis:\n  addr: \"s1:26379,s2:26379\"\n  masterName: pay\n  db: 3\n", // Sentinel
		"redis:\n  addr: \"r1:6379\"\n  db: 3\n",                              // one server
	} {
		if _, err := loadConfig(writeConfig(t, yaml), true, nil); err != nil {
			t.Errorf("%q: %v", yaml, err)
		}
	}
}

// With TLS, the client options do not pin one certificate name: with
// Sentinel the client dials the sentinels and then the master they name,
// and each must be checked against its own host.
func TestRedisTLSNamesNoServer(t *testing.T) {
	for _, yaml := range []string{
		"redis:\n  addr: \"sentinel-0:26379\"\n  masterName: pay\n  tls: true\n",
		"redis:\n  addr: \"redis-0:6379\"\n  tls: true\n",
	} {
		c, err := loadConfig(writeConfig(t, yaml), true, nil)
		if err != nil {
			t.Fatal(err)
		}
		o, err := c.redisOptions(4)
		if err != nil {
			t.Fatal(err)
		}
		if o.TLSConfig == nil || o.TLSConfig.ServerName != "" {
			t.Errorf("%q: TLS config %+v, want TLS with no ServerName", yaml, o.TLSConfig)
		}
	}
}

// A misspelled section, empty, is an unknown key like any other (viper
// leaves empty maps out of its keys).
func TestConfigRefusesEmptyUnknownSections(t *testing.T) {
	_, err := loadConfig(writeConfig(t, "amqp:\n  bogus: {}\nbogus: {}\n"), true, nil)
	if err == nil || !strings.Contains(err.Error(), "amqp.bogus: unknown key") || !strings.Contains(err.Error(), "bogus: unknown key") {
		t.Fatalf("empty unknown sections: %v, want both named", err)
	}
}

// amqp.caFile with an amqp:// URL would leave the traffic in clear without
// a word (the CA is used for amqps:// only): refused, naming the key. An
// OTLP endpoint is a base URL: a query would swallow the path paysvc adds.
func TestConfigRefusesSettingsThatWouldBeIgnored(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("not read here"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, yaml, key string }{
		{"a CA with amqp://", "amqp:\n  caFile: " + ca + "\n  url: \"amqp://u:p@rabbit:5672/\"\n", "amqp.caFile"},
		{"a CA with one amqp:// node of two", "amqp:\n  caFile: " + ca + "\n  url: \"amqps://u:p@r1:5671/,amqp://u:p@r2:5672/\"\n", "amqp.caFile"},
		{"an OTLP endpoint with a query", "trace:\n  otlpEndpoint: \"http://otel:4318/?k=v\"\n", "trace.otlpEndpoint"},
	} {
		if _, err := loadConfig(writeConfig(t, c.yaml), true, nil); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.key)
		}
	}
	if _, err := loadConfig(writeConfig(t, "amqp:\n  caFile: "+ca+"\n  url: \"amqps://u:p@rabbit:5671/\"\n"), true, nil); err != nil {
		t.Errorf("a CA with amqps://: %v", err)
	}
}
