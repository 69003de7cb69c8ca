package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/viper"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/tlsca"
)

// Config is paysvc's whole configuration: config.yaml, then environment
// variables PAYSVC_<SECTION>_<KEY> (or PAYSVC_<SECTION>_<KEY>_FILE naming a
// file that holds the value), over the defaults below.
type Config struct {
	AMQP struct {
		URL           string
		Prefetch      int
		Workers       int
		DrainTimeout  time.Duration
		QueueType     string
		DeliveryLimit int
		CAFile        string
	}
	MySQL struct {
		DSN                    string
		MaxOpenConns           int
		GroupSize              int
		GroupConns             int
		CAFile                 string
		LockWaitTimeout        time.Duration
		IdleTransactionTimeout time.Duration
	}
	Redis struct {
		Addr       string
		Username   string
		Password   string
		DB         int
		MasterName string
		TLS        bool
		CAFile     string
	}
	Idempotent struct {
		KeyPrefix     string
		TTL           time.Duration
		Lease         time.Duration
		RedisFallback string
	}
	Retry struct {
		Delays      []time.Duration
		MaxAttempts int
	}
	HTTP struct{ Addr string }
	Log  struct {
		Level, Format  string
		FirstPerSecond int
	}
	Admin struct {
		Token      string
		Operators  string
		SessionTTL time.Duration
	}
	Alert     struct{ WebhookURL string }
	Metrics   struct{ QueueInterval time.Duration }
	Reconcile struct {
		Interval time.Duration
		Window   time.Duration
		Fix      bool
	}
	Trace struct{ OTLPEndpoint string }
}

// defaults holds every key, spelled as in config.yaml, with its default.
var defaults = []struct {
	key string
	val any
}{
	{"amqp.url", "amqp://127.0.0.1:5672/"},
	{"amqp.prefetch", 64},
	{"amqp.workers", 32},
	{"amqp.drainTimeout", "30s"},
	{"amqp.queueType", "quorum"},
	{"amqp.deliveryLimit", 20},
	{"amqp.caFile", ""},
	{"mysql.dsn", "root@tcp(127.0.0.1:3306)/paysvc"},
	{"mysql.maxOpenConns", 20},
	{"mysql.groupSize", 16},
	{"mysql.groupConns", 2},
	{"mysql.caFile", ""},
	{"mysql.lockWaitTimeout", "5s"},
	{"mysql.idleTransactionTimeout", "30s"},
	{"redis.addr", "127.0.0.1:6379"},
	{"redis.username", ""},
	{"redis.password", ""},
	{"redis.db", 0},
	{"redis.masterName", ""},
	{"redis.tls", false},
	{"redis.caFile", ""},
	{"idempotent.keyPrefix", "mq:consumed:pay_success:"},
	{"idempotent.ttl", "24h"},
	{"idempotent.lease", "60s"},
	{"idempotent.redisFallback", "CLOSED"},
	{"retry.delays", []any{"30s", "1m", "5m"}},
	{"retry.maxAttempts", 5},
	{"http.addr", "127.0.0.1:8080"},
	{"log.level", "info"},
	{"log.format", "json"},
	{"log.firstPerSecond", 0},
	{"admin.token", ""},
	{"admin.operators", ""},
	{"admin.sessionTtl", "8h"},
	{"alert.webhookUrl", ""},
	{"metrics.queueInterval", "15s"},
	{"reconcile.interval", "0s"},
	{"reconcile.window", "24h"},
	{"reconcile.fix", false},
	{"trace.otlpEndpoint", ""},
}

// envName is the environment variable for a key: amqp.url → PAYSVC_AMQP_URL.
func envName(key string) string {
	return "PAYSVC_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// loadConfig reads path (required only if mustExist), applies the
// environment, and validates. Every problem is reported, naming its key.
func loadConfig(path string, mustExist bool, env map[string]string) (*Config, error) {
	v := viper.New()
	for _, d := range defaults {
		v.SetDefault(d.key, d.val)
	}
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		var notFound viper.ConfigFileNotFoundError
		if mustExist || !(errors.As(err, &notFound) || errors.Is(err, os.ErrNotExist)) {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
	}

	var errs []error
	known := map[string]bool{}
	knownEnv := map[string]bool{}
	for _, d := range defaults {
		known[strings.ToLower(d.key)] = true
		name := envName(d.key)
		knownEnv[name], knownEnv[name+"_FILE"] = true, true
		val, ok := env[name]
		if file, fok := env[name+"_FILE"]; fok {
			if ok {
				errs = append(errs, fmt.Errorf("%s: set both %s and %s_FILE", d.key, name, name))
			}
			b, err := os.ReadFile(file)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %s_FILE: %w", d.key, name, err))
				continue
			}
			val, ok = strings.TrimRight(string(b), "\r\n"), true
		}
		if ok {
			v.Set(d.key, val)
		}
	}
	for _, k := range v.AllKeys() {
		if !known[k] {
			errs = append(errs, fmt.Errorf("%s: unknown key", k))
		}
	}
	for name := range env {
		if strings.HasPrefix(name, "PAYSVC_") && !knownEnv[name] &&
			!strings.HasPrefix(name, "PAYSVC_TEST_") && !strings.HasPrefix(name, "PAYSVC_FAULT_") {
			errs = append(errs, fmt.Errorf("%s: unknown environment variable", name))
		}
	}

	d := decoder{v: v}
	var c Config
	c.AMQP.URL = d.str("amqp.url")
	c.AMQP.Prefetch = d.int("amqp.prefetch")
	c.AMQP.Workers = d.int("amqp.workers")
	c.AMQP.DrainTimeout = d.duration("amqp.drainTimeout")
	c.AMQP.QueueType = strings.ToLower(d.str("amqp.queueType"))
	c.AMQP.DeliveryLimit = d.int("amqp.deliveryLimit")
	c.AMQP.CAFile = d.str("amqp.caFile")
	c.MySQL.DSN = d.str("mysql.dsn")
	c.MySQL.MaxOpenConns = d.int("mysql.maxOpenConns")
	c.MySQL.GroupSize = d.int("mysql.groupSize")
	c.MySQL.GroupConns = d.int("mysql.groupConns")
	c.MySQL.CAFile = d.str("mysql.caFile")
	c.MySQL.LockWaitTimeout = d.duration("mysql.lockWaitTimeout")
	c.MySQL.IdleTransactionTimeout = d.duration("mysql.idleTransactionTimeout")
	c.Redis.Addr = d.str("redis.addr")
	c.Redis.Username = d.str("redis.username")
	c.Redis.Password = d.str("redis.password")
	c.Redis.DB = d.int("redis.db")
	c.Redis.MasterName = d.str("redis.masterName")
	c.Redis.TLS = d.bool("redis.tls")
	c.Redis.CAFile = d.str("redis.caFile")
	c.Idempotent.KeyPrefix = d.str("idempotent.keyPrefix")
	c.Idempotent.TTL = d.duration("idempotent.ttl")
	c.Idempotent.Lease = d.duration("idempotent.lease")
	c.Idempotent.RedisFallback = strings.ToUpper(d.str("idempotent.redisFallback"))
	c.Retry.Delays = d.durations("retry.delays")
	c.Retry.MaxAttempts = d.int("retry.maxAttempts")
	c.HTTP.Addr = d.str("http.addr")
	c.Log.Level = strings.ToLower(d.str("log.level"))
	c.Log.Format = strings.ToLower(d.str("log.format"))
	c.Log.FirstPerSecond = d.int("log.firstPerSecond")
	c.Admin.Token = d.str("admin.token")
	c.Admin.Operators = d.str("admin.operators")
	c.Admin.SessionTTL = d.duration("admin.sessionTtl")
	c.Alert.WebhookURL = d.str("alert.webhookUrl")
	c.Metrics.QueueInterval = d.duration("metrics.queueInterval")
	c.Reconcile.Interval = d.duration("reconcile.interval")
	c.Reconcile.Window = d.duration("reconcile.window")
	c.Reconcile.Fix = d.bool("reconcile.fix")
	c.Trace.OTLPEndpoint = strings.TrimSuffix(d.str("trace.otlpEndpoint"), "/")
	errs = append(errs, d.errs...)
	errs = append(errs, c.validate()...)
	if len(errs) > 0 {
		slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		return nil, fmt.Errorf("invalid configuration:\n%w", errors.Join(errs...))
	}
	return &c, nil
}

// RedisAddrs splits redis.addr: one address, or several for Sentinel
// (with redis.masterName) or Cluster.
func (c *Config) RedisAddrs() []string {
	var out []string
	for _, a := range strings.Split(c.Redis.Addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// validate checks values; each problem names its key.
func (c *Config) validate() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, args...)...))
	}
	urls := broker.URLs(c.AMQP.URL)
	if len(urls) == 0 {
		bad("amqp.url", "must not be empty")
	}
	for i, raw := range urls {
		if u, err := url.Parse(raw); err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
			bad("amqp.url", "URL %d of %d: want amqp://[user:password@]host:port/vhost or amqps://..., comma-separated for several nodes", i+1, len(urls))
		}
	}
	if c.AMQP.Prefetch < 1 || c.AMQP.Prefetch > 65535 {
		bad("amqp.prefetch", "want 1 to 65535, got %d", c.AMQP.Prefetch)
	}
	if c.AMQP.Workers < 1 || c.AMQP.Workers > 1000 {
		// each worker holds a publisher channel; RabbitMQ allows 2047 per connection
		bad("amqp.workers", "want 1 to 1000, got %d", c.AMQP.Workers)
	}
	if c.AMQP.DrainTimeout <= 0 {
		bad("amqp.drainTimeout", "want a positive duration")
	}
	if c.AMQP.QueueType != "classic" && c.AMQP.QueueType != "quorum" {
		bad("amqp.queueType", "want classic or quorum, got %q", c.AMQP.QueueType)
	}
	if c.AMQP.DeliveryLimit < 1 {
		bad("amqp.deliveryLimit", "want at least 1, got %d", c.AMQP.DeliveryLimit)
	}
	if _, err := mysql.ParseDSN(c.MySQL.DSN); err != nil {
		bad("mysql.dsn", "%v", err)
	} else if err := sqldb.CheckDSN(c.MySQL.DSN); err != nil {
		for _, e := range unjoin(err) {
			bad("mysql.dsn", "%v", e)
		}
	}
	if w := c.MySQL.LockWaitTimeout; w < time.Second || w%time.Second != 0 {
		bad("mysql.lockWaitTimeout", "want whole seconds of at least 1s, got %s", w)
	} else if handle := c.handleTimeout(); w >= handle {
		bad("mysql.lockWaitTimeout", "want less than the handling timeout (idempotent.lease/2 = %s), got %s", handle, w)
	}
	if w := c.MySQL.IdleTransactionTimeout; w < time.Second || w%time.Second != 0 {
		bad("mysql.idleTransactionTimeout", "want whole seconds of at least 1s, got %s", w)
	}
	if c.MySQL.MaxOpenConns < 1 {
		bad("mysql.maxOpenConns", "want at least 1, got %d", c.MySQL.MaxOpenConns)
	}
	if c.MySQL.GroupSize < 1 || c.MySQL.GroupSize > 100 {
		bad("mysql.groupSize", "want 1 to 100, got %d", c.MySQL.GroupSize)
	}
	if c.MySQL.GroupConns < 1 || c.MySQL.GroupConns > c.MySQL.MaxOpenConns {
		bad("mysql.groupConns", "want 1 to mysql.maxOpenConns (%d), got %d", c.MySQL.MaxOpenConns, c.MySQL.GroupConns)
	}
	if len(c.RedisAddrs()) == 0 {
		bad("redis.addr", "must not be empty")
	}
	for _, a := range c.RedisAddrs() {
		if _, _, err := net.SplitHostPort(a); err != nil {
			bad("redis.addr", "want host:port, or a comma-separated list (Sentinel, Cluster): %v", err)
		}
	}
	for key, file := range map[string]string{"amqp.caFile": c.AMQP.CAFile, "mysql.caFile": c.MySQL.CAFile, "redis.caFile": c.Redis.CAFile} {
		if file != "" {
			if _, err := os.Stat(file); err != nil {
				bad(key, "%v", err)
			}
		}
	}
	if c.Redis.CAFile != "" && !c.Redis.TLS {
		bad("redis.caFile", "set redis.tls: true too")
	}
	if c.Redis.DB < 0 {
		bad("redis.db", "want 0 or more, got %d", c.Redis.DB)
	}
	if c.Idempotent.KeyPrefix == "" {
		bad("idempotent.keyPrefix", "must not be empty")
	}
	if c.Idempotent.TTL < time.Minute {
		bad("idempotent.ttl", "want at least 1m, got %s", c.Idempotent.TTL)
	}
	if c.Idempotent.Lease < 2*time.Second {
		bad("idempotent.lease", "want at least 2s, got %s", c.Idempotent.Lease)
	}
	if f := c.Idempotent.RedisFallback; f != "CLOSED" && f != "OPEN" {
		bad("idempotent.redisFallback", "want CLOSED or OPEN, got %q", f)
	}
	if len(c.Retry.Delays) == 0 {
		bad("retry.delays", "want at least one delay")
	}
	seen := map[time.Duration]bool{}
	for _, d := range c.Retry.Delays {
		if d < 100*time.Millisecond || d%time.Millisecond != 0 {
			bad("retry.delays", "want whole milliseconds of at least 100ms, got %s", d)
		}
		if seen[d] {
			bad("retry.delays", "%s appears twice (one wait queue per delay)", d)
		}
		seen[d] = true
	}
	if c.Retry.MaxAttempts < 0 {
		bad("retry.maxAttempts", "want 0 or more, got %d", c.Retry.MaxAttempts)
	}
	if c.HTTP.Addr != "" {
		if _, _, err := net.SplitHostPort(c.HTTP.Addr); err != nil {
			bad("http.addr", "want host:port or empty: %v", err)
		}
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		bad("log.level", "want debug, info, warn or error, got %q", c.Log.Level)
	}
	if c.Log.Format != "json" && c.Log.Format != "console" {
		bad("log.format", "want json or console, got %q", c.Log.Format)
	}
	if c.Log.FirstPerSecond < 0 {
		bad("log.firstPerSecond", "want 0 (every applied payment logged) or more, got %d", c.Log.FirstPerSecond)
	}
	if t := c.Admin.Token; t != "" && len(t) < admin.MinToken {
		bad("admin.token", "want at least %d characters", admin.MinToken)
	} else if admin.Placeholder(t) {
		bad("admin.token", "is a placeholder from an example (secret.example.yaml): set a real token")
	}
	if _, err := c.adminOperators(); err != nil && c.Admin.Operators != "" {
		bad("admin.operators", "%v", err)
	}
	if c.Admin.SessionTTL < time.Minute || c.Admin.SessionTTL > 7*24*time.Hour {
		bad("admin.sessionTtl", "want 1m to 168h, got %s", c.Admin.SessionTTL)
	}
	if u := c.Alert.WebhookURL; u != "" {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			bad("alert.webhookUrl", "want an http:// or https:// URL")
		}
	}
	if u := c.Trace.OTLPEndpoint; u != "" {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			bad("trace.otlpEndpoint", "want an http:// or https:// URL of an OTLP/HTTP collector (e.g. http://otel-collector:4318)")
		}
	}
	if c.Metrics.QueueInterval < 100*time.Millisecond {
		bad("metrics.queueInterval", "want at least 100ms, got %s", c.Metrics.QueueInterval)
	}
	if c.Reconcile.Interval < 0 || (c.Reconcile.Interval > 0 && c.Reconcile.Interval < time.Second) {
		bad("reconcile.interval", "want 0 (off) or at least 1s, got %s", c.Reconcile.Interval)
	}
	if c.Reconcile.Window <= 0 {
		bad("reconcile.window", "want a positive duration, got %s", c.Reconcile.Window)
	}
	return errs
}

// decoder converts viper's loosely typed values (YAML types, or strings from
// the environment), collecting an error per bad key.
type decoder struct {
	v    *viper.Viper
	errs []error
}

func (d *decoder) fail(key string, val any, want string) {
	d.errs = append(d.errs, fmt.Errorf("%s: want %s, got %v", key, want, val))
}

func (d *decoder) str(key string) string {
	switch val := d.v.Get(key).(type) {
	case string:
		return val
	case nil:
		return ""
	default:
		// YAML reads 0123 as 83 and 1.50 as 1.5: a password or an address
		// must be quoted to arrive as written.
		d.fail(key, val, "a string (quote it)")
		return ""
	}
}

func (d *decoder) int(key string) int {
	switch val := d.v.Get(key).(type) {
	case int:
		return val
	case int64:
		return int(val)
	case string:
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil {
			d.fail(key, strconv.Quote(val), "an integer")
		}
		return n
	default:
		d.fail(key, val, "an integer")
		return 0
	}
}

func (d *decoder) duration(key string) time.Duration {
	return d.parseDuration(key, d.v.Get(key))
}

func (d *decoder) parseDuration(key string, val any) time.Duration {
	s, ok := val.(string)
	if !ok {
		d.fail(key, val, "a duration such as 30s, 1m or 24h")
		return 0
	}
	t, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		d.fail(key, strconv.Quote(s), "a duration such as 30s, 1m or 24h")
	}
	return t
}

func (d *decoder) bool(key string) bool {
	switch val := d.v.Get(key).(type) {
	case bool:
		return val
	case string:
		b, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			d.fail(key, strconv.Quote(val), "true or false")
		}
		return b
	default:
		d.fail(key, val, "true or false")
		return false
	}
}

// durations reads a YAML list, or a comma-separated string from the
// environment (PAYSVC_RETRY_DELAYS=1s,2s,3s).
func (d *decoder) durations(key string) []time.Duration {
	var items []any
	switch val := d.v.Get(key).(type) {
	case []any:
		items = val
	case string:
		for _, s := range strings.Split(val, ",") {
			items = append(items, s)
		}
	default:
		d.fail(key, val, "a list of durations")
		return nil
	}
	out := make([]time.Duration, 0, len(items))
	for _, it := range items {
		out = append(out, d.parseDuration(key, it))
	}
	return out
}

// redacted returns the configuration as log fields, without secrets.
func (c *Config) redacted() map[string]any {
	var shown []string
	for _, raw := range broker.URLs(c.AMQP.URL) {
		if u, err := url.Parse(raw); err == nil {
			raw = u.Redacted()
		} else {
			raw = "(invalid)"
		}
		shown = append(shown, raw)
	}
	amqpURL := strings.Join(shown, ",")
	dsn := "(invalid)"
	if cfg, err := mysql.ParseDSN(c.MySQL.DSN); err == nil {
		if cfg.Passwd != "" {
			cfg.Passwd = "xxxxx"
		}
		dsn = cfg.FormatDSN()
	}
	redisPassword := secret(c.Redis.Password)
	delays := make([]string, len(c.Retry.Delays))
	for i, d := range c.Retry.Delays {
		delays[i] = d.String()
	}
	return map[string]any{
		"amqp.url": amqpURL, "amqp.prefetch": c.AMQP.Prefetch, "amqp.workers": c.AMQP.Workers,
		"amqp.drainTimeout": c.AMQP.DrainTimeout.String(), "amqp.queueType": c.AMQP.QueueType,
		"amqp.deliveryLimit": c.AMQP.DeliveryLimit,
		"mysql.dsn":          dsn, "mysql.maxOpenConns": c.MySQL.MaxOpenConns,
		"mysql.groupSize": c.MySQL.GroupSize, "mysql.groupConns": c.MySQL.GroupConns,
		"mysql.lockWaitTimeout": c.MySQL.LockWaitTimeout.String(), "mysql.idleTransactionTimeout": c.MySQL.IdleTransactionTimeout.String(),
		"redis.addr": c.Redis.Addr, "redis.username": c.Redis.Username, "redis.password": redisPassword, "redis.db": c.Redis.DB,
		"redis.masterName": c.Redis.MasterName, "redis.tls": c.Redis.TLS, "redis.caFile": c.Redis.CAFile,
		"amqp.caFile": c.AMQP.CAFile, "mysql.caFile": c.MySQL.CAFile,
		"idempotent.keyPrefix": c.Idempotent.KeyPrefix, "idempotent.ttl": c.Idempotent.TTL.String(),
		"idempotent.lease": c.Idempotent.Lease.String(), "idempotent.redisFallback": c.Idempotent.RedisFallback,
		"retry.delays": delays, "retry.maxAttempts": c.Retry.MaxAttempts,
		"http.addr": c.HTTP.Addr, "log.level": c.Log.Level, "log.format": c.Log.Format,
		"log.firstPerSecond": c.Log.FirstPerSecond,
		"admin.token":        secret(c.Admin.Token), "alert.webhookUrl": secret(c.Alert.WebhookURL),
		"admin.operators": secret(c.Admin.Operators), "admin.sessionTtl": c.Admin.SessionTTL.String(),
		"metrics.queueInterval": c.Metrics.QueueInterval.String(),
		"reconcile.interval":    c.Reconcile.Interval.String(), "reconcile.window": c.Reconcile.Window.String(),
		"reconcile.fix": c.Reconcile.Fix, "trace.otlpEndpoint": secret(c.Trace.OTLPEndpoint),
	}
}

// handleTimeout bounds one message's handling: half the claim's lease, so
// that a claim never expires under a worker still at work.
func (c *Config) handleTimeout() time.Duration { return c.Idempotent.Lease / 2 }

// unjoin splits an errors.Join into its errors.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// secret shows whether a secret is set, never its value.
func secret(s string) string {
	if s == "" {
		return ""
	}
	return "xxxxx"
}

// mysqlDSN is mysql.dsn, made to trust mysql.caFile when one is set.
func (c *Config) mysqlDSN() (string, error) {
	if c.MySQL.CAFile == "" {
		return c.MySQL.DSN, nil
	}
	t, err := tlsca.Config(c.MySQL.CAFile)
	if err != nil {
		return "", fmt.Errorf("mysql.caFile: %w", err)
	}
	return sqldb.WithCA(c.MySQL.DSN, c.MySQL.CAFile, t)
}

// amqpTLS trusts amqp.caFile (nil: the system roots, for amqps:// URLs).
func (c *Config) amqpTLS() (*tls.Config, error) {
	if c.AMQP.CAFile == "" {
		return nil, nil
	}
	t, err := tlsca.Config(c.AMQP.CAFile)
	if err != nil {
		return nil, fmt.Errorf("amqp.caFile: %w", err)
	}
	return t, nil
}

// redisOptions builds the go-redis client options: one address, Sentinel
// (redis.masterName) or Cluster (several addresses), with TLS if redis.tls.
func (c *Config) redisOptions(poolSize int) (*redis.UniversalOptions, error) {
	o := &redis.UniversalOptions{
		Addrs:        c.RedisAddrs(),
		MasterName:   c.Redis.MasterName,
		Username:     c.Redis.Username,
		Password:     c.Redis.Password,
		DB:           c.Redis.DB,
		DialTimeout:  2 * time.Second,
		ReadTimeout:  time.Second,
		WriteTimeout: time.Second,
		PoolSize:     poolSize,
	}
	if c.Redis.TLS {
		t, err := tlsca.Config(c.Redis.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis.caFile: %w", err)
		}
		if host, _, err := net.SplitHostPort(o.Addrs[0]); err == nil && len(o.Addrs) == 1 {
			t.ServerName = host
		}
		o.TLSConfig = t
	}
	return o, nil
}

// adminOperators is who may use the admin pages: admin.operators, and
// admin.token as the operator "admin" (the single-operator shorthand).
func (c *Config) adminOperators() ([]admin.Operator, error) {
	ops, err := admin.ParseOperators(c.Admin.Operators)
	if err != nil {
		return nil, err
	}
	if c.Admin.Token != "" {
		for _, op := range ops {
			if op.Name == "admin" {
				return nil, errors.New(`operator "admin" is also admin.token: name it differently`)
			}
		}
		ops = append(ops, admin.NewOperator("admin", c.Admin.Token))
	}
	return ops, nil
}
