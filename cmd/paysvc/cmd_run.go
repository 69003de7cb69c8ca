package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/logging"
)

// runCommands: the daemon.
var runCommands = []*cmdSpec{{
	name:    "run",
	summary: "consume q.pay.success until SIGTERM or SIGINT",
	details: "Logs go to stdout; a failure is the last log entry, with its exit_code.",
	flags:   noFlags(func(ctx context.Context, c *cmdLine) error { return c.daemon(ctx, daemon) }),
}}

// hostCommands: for the container and the operator.
var hostCommands = []*cmdSpec{{
	name:    "healthcheck",
	summary: "exit 0 if this host's paysvc answers GET /healthz on http.addr, else 1",
	details: "For a container HEALTHCHECK: the image has no shell or curl.",
	flags:   noFlags(runHealthcheck),
}, {
	name:    "version",
	summary: "print the version and the VCS revision it was built from",
	flags: noFlags(func(_ context.Context, c *cmdLine) error {
		_, err := fmt.Fprintln(c.out, versionString())
		return err
	}),
}}

// daemon runs run or migrate: configuration, logger, then fn; a failure is
// reported as the last log entry (logFailure).
func (c *cmdLine) daemon(ctx context.Context, fn func(context.Context, *Config, *zap.Logger) error) error {
	cfg, err := c.config()
	if err != nil {
		return logFailure(nil, c.out, err)
	}
	log, err := logging.New(logging.Config{Level: cfg.Log.Level, Format: cfg.Log.Format}, c.out)
	if err != nil {
		return logFailure(nil, c.out, err)
	}
	defer log.Sync()
	logging.RouteLibraries(log)
	defer logging.Unroute(log)
	log.Info("paysvc starting", zap.String("command", c.spec.name), zap.String("version", version),
		zap.Any("config", cfg.redacted()))
	if err := fn(ctx, cfg, log); err != nil {
		return logFailure(log, c.out, err)
	}
	return nil
}

// logFailure reports why the daemon (run or migrate) stops as its last log
// entry, with the exit code, so that a log pipeline sees it as a structured
// line like every other; before the configuration is read, log is nil and
// the entry is JSON.
func logFailure(log *zap.Logger, out io.Writer, err error) error {
	code := exitFailure
	var exit *exitError
	if errors.As(err, &exit) {
		code = exit.code
	}
	if log == nil {
		log, _ = logging.New(logging.Config{Level: "info", Format: "json"}, out)
	}
	log.Error("paysvc failed", zap.Error(err), zap.Int("exit_code", code))
	log.Sync()
	return &exitError{code: code, err: err, logged: true}
}

// versionString is the version, the VCS revision the binary was built from
// (its commit shortened, -dirty when built with uncommitted changes) and the
// Go version.
func versionString() string {
	rev, dirty := strings.CutSuffix(buildRevision(), "-dirty")
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return fmt.Sprintf("paysvc %s revision %s %s", version, cmp.Or(rev, "unknown"), runtime.Version())
}

// buildRevision is the VCS revision the binary was built from: set by make
// and the image build (-X main.revision), or read from the Go build info
// of a build inside a checkout; -dirty when the checkout had uncommitted
// changes; empty when unknown.
func buildRevision() string {
	if revision != "" {
		return revision
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" && modified == "true" {
		rev += "-dirty"
	}
	return rev
}

// runHealthcheck reads http.addr alone, not the whole configuration: a
// secret file the daemon read at start and that is briefly unreadable now
// (a rotation) must not make a healthy container unhealthy.
func runHealthcheck(ctx context.Context, c *cmdLine) error {
	addr, err := httpAddr(c.configPath, c.mustExist, c.env)
	if err != nil {
		return err
	}
	return healthcheck(ctx, addr, c.out)
}

// healthcheck asks the paysvc on this host for GET /healthz at addr (the
// http.addr; a wildcard host means loopback) and fails unless it answers
// 200 within 3 s.
func healthcheck(ctx context.Context, addr string, out io.Writer) error {
	if addr == "" {
		return errors.New("healthcheck: http.addr is empty: paysvc serves no /healthz")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("healthcheck: http.addr %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	url := "http://" + net.JoinHostPort(host, port) + "/healthz"
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s", url, resp.Status)
	}
	fmt.Fprintf(out, "healthy: %s\n", url)
	return nil
}
