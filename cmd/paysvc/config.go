package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/paysvc/paysvc/internal/broker"
)

// Config is paysvc's whole configuration: config.yaml, then environment
// variables PAYSVC_<SECTION>_<KEY> (or PAYSVC_<SECTION>_<KEY>_FILE naming a
// file that holds the value), over the defaults. Each key is declared once,
// in keys (config_keys.go): a field added here needs its line there.
type Config struct {
	AMQP struct {
		URL             string
		Prefetch        int
		Workers         int
		DrainTimeout    time.Duration
		QueueType       string
		DeliveryLimit   int
		ConsumerTimeout time.Duration
		CAFile          string
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
		// The sentinels' own credentials (requirepass, an ACL user), which
		// go-redis sends to the sentinels only; the data nodes get
		// Username and Password.
		SentinelUsername string
		SentinelPassword string
		TLS              bool
		CAFile           string
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
		Addr         string
		Token        string
		Operators    string
		SessionTTL   time.Duration
		SecureCookie bool
	}
	Alert     struct{ WebhookURL string }
	Metrics   struct{ QueueInterval time.Duration }
	Reconcile struct {
		Interval      time.Duration
		Window        time.Duration
		Fix           bool
		LostSweepRate int
	}
	Trace struct {
		OTLPEndpoint string
		SampleRatio  float64
	}
	Prune struct {
		OutboxAfter      time.Duration
		EventsAfter      time.Duration
		SessionsAfter    time.Duration
		DeadLettersAfter time.Duration
		Batch            int
		Pause            time.Duration
		Interval         time.Duration
		DSN              string
	}
}

// loadConfig reads path (required only if mustExist), applies the
// environment, and validates. Every problem is reported, naming its key.
func loadConfig(path string, mustExist bool, env map[string]string) (*Config, error) {
	v := viper.New()
	for _, k := range keys {
		v.SetDefault(k.name, k.def)
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
	for _, k := range keys {
		known[strings.ToLower(k.name)] = true
		name := envName(k.name)
		knownEnv[name], knownEnv[name+"_FILE"] = true, true
		val, ok := env[name]
		if file, fok := env[name+"_FILE"]; fok {
			if ok {
				errs = append(errs, fmt.Errorf("%s: set both %s and %s_FILE", k.name, name, name))
			}
			b, err := os.ReadFile(file)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %s_FILE: %w", k.name, name, err))
				continue
			}
			val, ok = strings.TrimRight(string(b), "\r\n"), true
		}
		if ok {
			v.Set(k.name, val)
		}
	}
	for _, k := range append(v.AllKeys(), emptySections(path)...) {
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
	for _, k := range keys {
		d.decode(k, &c)
	}
	errs = append(errs, d.errs...)
	errs = append(errs, c.validate()...)
	if len(errs) > 0 {
		slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		return nil, fmt.Errorf("invalid configuration:\n%w", errors.Join(errs...))
	}
	return &c, nil
}

// httpAddr is http.addr as loadConfig would read it (the environment, its
// _FILE, the config file, the default), reading nothing else.
func httpAddr(path string, mustExist bool, env map[string]string) (string, error) {
	const key = "http.addr"
	name := envName(key)
	if file, ok := env[name+"_FILE"]; ok {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s: %s_FILE: %w", key, name, err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	if v, ok := env[name]; ok {
		return v, nil
	}
	v := viper.New()
	for _, k := range keys {
		if k.name == key {
			v.SetDefault(key, k.def)
		}
	}
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		var notFound viper.ConfigFileNotFoundError
		if mustExist || !(errors.As(err, &notFound) || errors.Is(err, os.ErrNotExist)) {
			return "", fmt.Errorf("config %s: %w", path, err)
		}
	}
	return v.GetString(key), nil
}

// RedisAddrs splits redis.addr: one address, or several for Sentinel
// (with redis.masterName) or Cluster.
func (c *Config) RedisAddrs() []string { return splitAddrs(c.Redis.Addr) }

func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// handleTimeout bounds one message's handling: half the claim's lease, so
// that a claim never expires under a worker still at work.
func (c *Config) handleTimeout() time.Duration { return c.Idempotent.Lease / 2 }

// decoder converts viper's loosely typed values (YAML types, or strings from
// the environment), collecting an error per bad key.
type decoder struct {
	v    *viper.Viper
	errs []error
	hide bool // the key being decoded holds a secret: never echo its value
}

func (d *decoder) fail(key string, val any, want string) {
	if d.hide {
		d.errs = append(d.errs, fmt.Errorf("%s: want %s, got a %T (the value is not shown: it may be a secret)", key, want, val))
		return
	}
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

func (d *decoder) float(key string) float64 {
	switch val := d.v.Get(key).(type) {
	case float64:
		return val
	case int:
		return float64(val)
	case int64:
		return float64(val)
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			d.fail(key, strconv.Quote(val), "a number")
		}
		return f
	default:
		d.fail(key, val, "a number")
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

// decode sets k's field in c from viper's value, by the field's type.
func (d *decoder) decode(k key, c *Config) {
	d.hide = k.secret || k.redact != nil
	defer func() { d.hide = false }()
	switch p := k.bind(c).(type) {
	case *string:
		*p = d.str(k.name)
		if k.norm != nil {
			*p = k.norm(*p)
		}
	case *int:
		*p = d.int(k.name)
	case *bool:
		*p = d.bool(k.name)
	case *float64:
		*p = d.float(k.name)
	case *time.Duration:
		*p = d.duration(k.name)
	case *[]time.Duration:
		*p = d.durations(k.name)
	default:
		panic(fmt.Sprintf("config key %s: no decoding for %T", k.name, p))
	}
}

// redacted returns the configuration as log fields, without secrets: every
// key, a secret as xxxxx when set, a URL's or DSN's password as xxxxx.
func (c *Config) redacted() map[string]any {
	out := make(map[string]any, len(keys))
	for i := range keys {
		k := &keys[i]
		switch v := k.value(c).(type) {
		case string:
			switch {
			case k.secret:
				out[k.name] = secret(v)
			case k.redact != nil:
				out[k.name] = k.redact(v)
			default:
				out[k.name] = v
			}
		case time.Duration:
			out[k.name] = v.String()
		case []time.Duration:
			shown := make([]string, len(v))
			for i, d := range v {
				shown[i] = d.String()
			}
			out[k.name] = shown
		default:
			out[k.name] = v
		}
	}
	return out
}

// secret shows whether a secret is set, never its value.
func secret(s string) string {
	if s == "" {
		return ""
	}
	return "xxxxx"
}

// redactURLs is amqp.url with each node's password as xxxxx.
func redactURLs(s string) string {
	var shown []string
	for _, raw := range broker.URLs(s) {
		if u, err := url.Parse(raw); err == nil {
			raw = u.Redacted()
		} else {
			raw = "(invalid)"
		}
		shown = append(shown, raw)
	}
	return strings.Join(shown, ",")
}

// redactDSN is mysql.dsn with its password as xxxxx.
func redactDSN(s string) string {
	if s == "" {
		return ""
	}
	cfg, err := mysql.ParseDSN(s)
	if err != nil {
		return "(invalid)"
	}
	if cfg.Passwd != "" {
		cfg.Passwd = "xxxxx"
	}
	return cfg.FormatDSN()
}

// emptySections lists the paths of the empty maps in the config file
// (`amqp: {bogus: {}}`), which viper's AllKeys leaves out: a misspelled
// section must not pass as nothing.
func emptySections(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil // reading it is ReadInConfig's to report
	}
	var root map[string]any
	if yaml.Unmarshal(b, &root) != nil {
		return nil
	}
	var out []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok {
				if p := strings.ToLower(prefix + k); len(sub) == 0 {
					out = append(out, p)
				} else {
					walk(p+".", sub)
				}
			}
		}
	}
	walk("", root)
	slices.Sort(out)
	return out
}
