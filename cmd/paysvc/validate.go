package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// badFunc reports one problem of a key; the key's name is prefixed.
type badFunc func(format string, args ...any)

// validate checks values; each problem names its key. Each key's own check
// is declared with it (keys); the checks across keys follow.
func (c *Config) validate() []error {
	var errs []error
	reporter := func(name string) badFunc {
		return func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: "+format, append([]any{name}, args...)...))
		}
	}
	for i := range keys {
		if k := &keys[i]; k.check != nil {
			k.check(k.value(c), reporter(k.name))
		}
	}
	c.validateAcross(reporter)
	return errs
}

// validateAcross holds the checks that read more than one key.
func (c *Config) validateAcross(reporter func(name string) badFunc) {
	if w := c.MySQL.LockWaitTimeout; w >= time.Second && w%time.Second == 0 { // else wholeSeconds said so
		if handle := c.handleTimeout(); w >= handle {
			reporter("mysql.lockWaitTimeout")("want less than the handling timeout (idempotent.lease/2 = %s), got %s", handle, w)
		}
	}
	if held := c.handleTimeout() + c.AMQP.DrainTimeout; c.AMQP.ConsumerTimeout >= minConsumerTimeout && c.AMQP.ConsumerTimeout <= held {
		// A delivery handled to its bound as the shutdown begins would be
		// taken back by the broker while paysvc still works on it.
		reporter("amqp.consumerTimeout")("want more than the handling timeout (idempotent.lease/2 = %s) plus amqp.drainTimeout (%s), got %s",
			c.handleTimeout(), c.AMQP.DrainTimeout, c.AMQP.ConsumerTimeout)
	}
	if c.MySQL.GroupConns < 1 || c.MySQL.GroupConns > c.MySQL.MaxOpenConns {
		reporter("mysql.groupConns")("want 1 to mysql.maxOpenConns (%d), got %d", c.MySQL.MaxOpenConns, c.MySQL.GroupConns)
	}
	if c.Redis.MasterName == "" && c.Redis.SentinelUsername != "" {
		reporter("redis.sentinelUsername")("is for the sentinels: set redis.masterName too")
	}
	if c.Redis.MasterName == "" && c.Redis.SentinelPassword != "" {
		reporter("redis.sentinelPassword")("is for the sentinels: set redis.masterName too")
	}
	if c.Redis.CAFile != "" && !c.Redis.TLS {
		reporter("redis.caFile")("set redis.tls: true too")
	}
	if c.AMQP.CAFile != "" {
		// amqp091 uses TLS for amqps:// only: an amqp:// node would be
		// reached in clear, the CA unused, without a word.
		urls := broker.URLs(c.AMQP.URL)
		for i, raw := range urls {
			if u, err := url.Parse(raw); err == nil && u.Scheme == "amqp" {
				reporter("amqp.caFile")("is used for amqps:// only: amqp.url's URL %d of %d is amqp:// (in clear)", i+1, len(urls))
			}
		}
	}
	if c.Redis.DB != 0 && c.Redis.MasterName == "" && len(c.RedisAddrs()) > 1 {
		// Several addresses without a master's name are a Cluster, which has
		// database 0 only: the setting would be ignored without a word.
		reporter("redis.db")("want 0 with a Redis Cluster (several redis.addr and no redis.masterName), got %d", c.Redis.DB)
	}
	if c.Admin.Addr != "" && c.Admin.Addr == c.HTTP.Addr {
		reporter("admin.addr")("is http.addr (%s): give the operator pages another address, or leave it empty to serve them on http.addr", c.HTTP.Addr)
	}
	if _, err := c.adminOperators(); err != nil && c.Admin.Operators != "" {
		reporter("admin.operators")("%v", err)
	}
}

// checkOf adapts a check of one type to key.check (the key's bound type).
func checkOf[T any](f func(v T, bad badFunc)) func(any, badFunc) {
	return func(v any, bad badFunc) { f(v.(T), bad) }
}

func between(lo, hi int) func(any, badFunc) {
	return checkOf(func(n int, bad badFunc) {
		if n < lo || n > hi {
			bad("want %d to %d, got %d", lo, hi, n)
		}
	})
}

// ratio wants a number from 0 to 1.
var ratio = checkOf(func(f float64, bad badFunc) {
	if !(f >= 0 && f <= 1) {
		bad("want a number from 0 to 1, got %g", f)
	}
})

func atLeast(lo int) func(any, badFunc) {
	return checkOf(func(n int, bad badFunc) {
		if n < lo {
			bad("want at least %d, got %d", lo, n)
		}
	})
}

// atLeast0 refuses a negative number with format (one %d: the value).
func atLeast0(format string) func(any, badFunc) {
	return checkOf(func(n int, bad badFunc) {
		if n < 0 {
			bad(format, n)
		}
	})
}

// oneOf wants one of vals: "want a, b or c, got %q".
func oneOf(vals ...string) func(any, badFunc) {
	want := strings.Join(vals[:len(vals)-1], ", ") + " or " + vals[len(vals)-1]
	return checkOf(func(s string, bad badFunc) {
		for _, v := range vals {
			if s == v {
				return
			}
		}
		bad("want %s, got %q", want, s)
	})
}

// positive refuses a duration of 0 or less with msg (with a %s: the value).
func positive(msg string) func(any, badFunc) {
	return checkOf(func(d time.Duration, bad badFunc) {
		switch {
		case d > 0:
		case strings.Contains(msg, "%"):
			bad(msg, d)
		default:
			bad(msg)
		}
	})
}

func minDuration(lo time.Duration) func(any, badFunc) {
	return checkOf(func(d time.Duration, bad badFunc) {
		if d < lo {
			bad("want at least %s, got %s", shortDuration(lo), d)
		}
	})
}

func durationBetween(lo, hi time.Duration) func(any, badFunc) {
	return checkOf(func(d time.Duration, bad badFunc) {
		if d < lo || d > hi {
			bad("want %s to %s, got %s", shortDuration(lo), shortDuration(hi), d)
		}
	})
}

// shortDuration spells d as a person would: 1m, not 1m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

var wholeSeconds = checkOf(func(d time.Duration, bad badFunc) {
	if d < time.Second || d%time.Second != 0 {
		bad("want whole seconds of at least 1s, got %s", d)
	}
})

var offOrAtLeastSecond = checkOf(func(d time.Duration, bad badFunc) {
	if d < 0 || (d > 0 && d < time.Second) {
		bad("want 0 (off) or at least 1s, got %s", d)
	}
})

// offOrAtLeast wants 0 (off) or at least lo.
func offOrAtLeast(lo time.Duration) func(any, badFunc) {
	return checkOf(func(d time.Duration, bad badFunc) {
		if d < 0 || (d > 0 && d < lo) {
			bad("want 0 (off) or at least %s, got %s", shortDuration(lo), d)
		}
	})
}

var atLeast0Duration = checkOf(func(d time.Duration, bad badFunc) {
	if d < 0 {
		bad("want 0 or more, got %s", d)
	}
})

var checkDSNOrEmpty = checkOf(func(dsn string, bad badFunc) {
	if dsn != "" {
		checkDSN(dsn, bad)
	}
})

var nonEmpty = checkOf(func(s string, bad badFunc) {
	if s == "" {
		bad("must not be empty")
	}
})

var existingFile = checkOf(func(file string, bad badFunc) {
	if file != "" {
		if _, err := os.Stat(file); err != nil {
			bad("%v", err)
		}
	}
})

var hostPortOrEmpty = checkOf(func(addr string, bad badFunc) {
	if addr != "" {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			bad("want host:port or empty: %v", err)
		}
	}
})

// httpURL wants an empty value or an http(s) URL with a host; msg otherwise.
// With noQuery, a query or fragment is refused too (a base URL paysvc
// appends a path to).
func httpURL(msg string, noQuery bool) func(any, badFunc) {
	return checkOf(func(u string, bad badFunc) {
		if u != "" {
			pu, err := url.Parse(u)
			if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" ||
				(noQuery && (pu.RawQuery != "" || pu.Fragment != "" || pu.ForceQuery)) {
				bad(msg)
			}
		}
	})
}

var checkAMQPURLs = checkOf(func(s string, bad badFunc) {
	urls := broker.URLs(s)
	if len(urls) == 0 {
		bad("must not be empty")
	}
	for i, raw := range urls {
		u, err := url.Parse(raw)
		switch {
		case err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "":
			bad("URL %d of %d: want amqp://[user:password@]host:port/vhost or amqps://..., comma-separated for several nodes", i+1, len(urls))
		case strings.HasSuffix(u.Host, ":") || strings.Contains(u.Path+u.RawQuery+u.Fragment, "@"):
			// A password with an unescaped '/', '?' or '#' ends the
			// authority early: the URL would parse with no password to
			// redact, dial the wrong host as guest, and log the password.
			bad("URL %d of %d: the user or password holds '/', '?' or '#' unescaped: percent-encode them (%%2F, %%3F, %%23)", i+1, len(urls))
		}
	}
})

var checkDSN = checkOf(func(dsn string, bad badFunc) {
	if _, err := mysql.ParseDSN(dsn); err != nil {
		// The driver's message can quote part of the DSN, password included
		// (a '/' in the password read as the end of the address): only its
		// fixed messages are shown.
		bad("%v", dsnError(err))
	} else if err := sqldb.CheckDSN(dsn); err != nil {
		for _, e := range unjoin(err) {
			bad("%v", e)
		}
	}
})

var checkRedisAddrs = checkOf(func(s string, bad badFunc) {
	addrs := splitAddrs(s)
	if len(addrs) == 0 {
		bad("must not be empty")
	}
	for i, a := range addrs {
		// The value is never echoed: an address written as a URL with its
		// password (redis://:pw@host:6379) would put the password in the log.
		switch _, _, err := net.SplitHostPort(a); {
		case strings.Contains(a, "@"):
			bad("address %d of %d: want host:port, no user or password (give them in redis.username and redis.password)", i+1, len(addrs))
		case err != nil:
			bad("address %d of %d: want host:port, or a comma-separated list of them (Sentinel, Cluster)", i+1, len(addrs))
		}
	}
})

var checkDelays = checkOf(func(delays []time.Duration, bad badFunc) {
	if len(delays) == 0 {
		bad("want at least one delay")
	}
	seen := map[time.Duration]bool{}
	for _, d := range delays {
		if d < 100*time.Millisecond || d%time.Millisecond != 0 {
			bad("want whole milliseconds of at least 100ms, got %s", d)
		}
		if seen[d] {
			bad("%s appears twice (one wait queue per delay)", d)
		}
		seen[d] = true
	}
})

var checkAdminToken = checkOf(func(t string, bad badFunc) {
	if t != "" && len(t) < admin.MinToken {
		bad("want at least %d characters", admin.MinToken)
	} else if admin.Placeholder(t) {
		bad("is a placeholder from an example (secret.example.yaml): set a real token")
	}
})

// unjoin splits an errors.Join into its errors.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// dsnError is err from mysql.ParseDSN when it is one of the driver's fixed
// messages (they quote nothing of the DSN), or a message of ours.
func dsnError(err error) error {
	switch err.Error() {
	case "invalid DSN: did you forget to escape a param value?",
		"invalid DSN: network address not terminated (missing closing brace)",
		"invalid DSN: missing the slash separating the database name",
		"invalid DSN: interpolateParams can not be used with unsafe collations":
		return err
	}
	return errors.New("not a valid DSN: want user:password@tcp(host:port)/dbname?params (the driver's message is not shown: it may quote the password)")
}
