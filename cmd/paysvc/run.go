package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/logging"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/migrations"
)

const usage = `usage: paysvc [--config FILE] <command> [arguments]

commands:
  migrate                 apply the embedded schema migrations (safe to re-run)
  run                     consume q.pay.success until SIGTERM or SIGINT
  dlq list [--order ORDER_NO] [--class C] [--since T] [--status S]
  dlq show ORDER_NO... | --order ORDER_NO... | --id N...
  dlq replay (ORDER_NO... | --order ORDER_NO... | --id N... | --class C | --all) [--all-of-order]
             [--dry-run] --reason "..." [--operator NAME] [--rate N]
  dlq discard (ORDER_NO | --order ORDER_NO | --id N)... [--all-of-order] --reason "..." [--operator NAME]
  reconcile [--from T] [--to T] [--fix]   exit status 2 when it finds problems
  trace ORDER_NO [--log FILE]
  healthcheck             exit 0 if this host's paysvc answers GET /healthz on http.addr, else 1
                          (for a container HEALTHCHECK: the image has no shell or curl)
  version                 print the version and the VCS revision it was built from

--config defaults to ./config.yaml (optional unless given). Every key can be
overridden by PAYSVC_<SECTION>_<KEY>, or PAYSVC_<SECTION>_<KEY>_FILE.
`

// exitError carries a process exit status other than 1, or an error the
// daemon's log already reported (logged): main then prints nothing more.
type exitError struct {
	code   int
	err    error
	logged bool
}

func (e *exitError) Error() string { return e.err.Error() }

// command is one parsed command line.
type command struct {
	name       string   // migrate, run, dlq, reconcile, trace, version
	sub        string   // dlq's list, show, replay, discard
	args       []string // positional arguments
	configPath string
	mustExist  bool
	flags      *flag.FlagSet
}

// parseCommand reads [--config FILE] NAME [SUB] and the command's flags,
// which may come before or after its positional arguments.
func parseCommand(args []string, define func(name, sub string, fs *flag.FlagSet)) (*command, error) {
	c := &command{configPath: "config.yaml"}
	global := flag.NewFlagSet("paysvc", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	cfgFlag := global.String("config", "", "config file")
	if err := global.Parse(args); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, usage)
	}
	rest := global.Args()
	if len(rest) == 0 {
		return nil, errors.New(usage)
	}
	c.name, rest = rest[0], rest[1:]
	if c.name == "dlq" {
		if len(rest) == 0 {
			return nil, fmt.Errorf("dlq: want list, show, replay or discard\n%s", usage)
		}
		c.sub, rest = rest[0], rest[1:]
	}
	c.flags = flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.flags.SetOutput(io.Discard)
	cmdCfg := c.flags.String("config", "", "config file")
	define(c.name, c.sub, c.flags)
	for {
		if err := c.flags.Parse(rest); err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", c.name, err, usage)
		}
		rest = c.flags.Args()
		if len(rest) == 0 {
			break
		}
		c.args, rest = append(c.args, rest[0]), rest[1:]
	}
	for _, p := range []string{*cfgFlag, *cmdCfg} {
		if p != "" {
			c.configPath, c.mustExist = p, true
		}
	}
	return c, nil
}

// run parses args and runs one command. env is the process environment
// (KEY=VALUE); output and logs go to out.
func run(ctx context.Context, args, env []string, out io.Writer) error {
	var opts cliOptions
	cmd, err := parseCommand(args, opts.define)
	if err != nil {
		return err
	}
	switch {
	case cmd.name == "version":
		fmt.Fprintln(out, versionString())
		return nil
	case cmd.name == "healthcheck":
		envMap := map[string]string{}
		for _, kv := range env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				envMap[k] = v
			}
		}
		cfg, err := loadConfig(cmd.configPath, cmd.mustExist, envMap)
		if err != nil {
			return err
		}
		return healthcheck(ctx, cfg.HTTP.Addr, out)
	case cmd.name == "dlq" && !slices.Contains([]string{"list", "show", "replay", "discard"}, cmd.sub):
		return fmt.Errorf("dlq: unknown subcommand %q\n%s", cmd.sub, usage)
	case !slices.Contains([]string{"run", "migrate", "dlq", "reconcile", "trace"}, cmd.name):
		return fmt.Errorf("unknown command %q\n%s", cmd.name, usage)
	}

	envMap := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			envMap[k] = v
		}
	}
	daemonCommand := cmd.name == "run" || cmd.name == "migrate"
	cfg, err := loadConfig(cmd.configPath, cmd.mustExist, envMap)
	if err != nil {
		if daemonCommand {
			return logFailure(nil, out, err)
		}
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if cmd.name == "dlq" || cmd.name == "reconcile" || cmd.name == "trace" {
		return runTool(ctx, cmd, &opts, cfg, envMap, out)
	}
	if len(cmd.args) > 0 {
		return fmt.Errorf("%s: unexpected arguments %q\n%s", cmd.name, cmd.args, usage)
	}
	log, err := logging.New(logging.Config{Level: cfg.Log.Level, Format: cfg.Log.Format}, out)
	if err != nil {
		return logFailure(nil, out, err)
	}
	defer log.Sync()
	logging.RouteLibraries(log)
	defer logging.Unroute(log)
	log.Info("paysvc starting", zap.String("command", cmd.name), zap.String("version", version),
		zap.Any("config", cfg.redacted()))
	if cmd.name == "migrate" {
		err = migrate(ctx, cfg, log)
	} else {
		err = daemon(ctx, cfg, log)
	}
	if err != nil {
		return logFailure(log, out, err)
	}
	return nil
}

// logFailure reports why the daemon (run or migrate) stops as its last log
// entry, with the exit code, so that a log pipeline sees it as a structured
// line like every other; before the configuration is read, log is nil and
// the entry is JSON.
func logFailure(log *zap.Logger, out io.Writer, err error) error {
	code := 1
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
// (set by the image build, -X main.revision, or read from the Go build
// info of a build inside a checkout) and the Go version.
func versionString() string {
	rev := revision
	if rev == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					rev = s.Value
				}
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return fmt.Sprintf("paysvc %s revision %s %s", version, cmp.Or(rev, "unknown"), runtime.Version())
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

// migrate creates the database if it is missing, then applies migrations.
func migrate(ctx context.Context, cfg *Config, log *zap.Logger) error {
	dsn, err := cfg.mysqlDSN()
	if err != nil {
		return err
	}
	if err := sqldb.CreateDatabase(ctx, dsn); err != nil {
		return err
	}
	db, err := sqldb.Open(ctx, dsn, 2)
	if err != nil {
		return err
	}
	defer db.Close()
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		return err
	}
	applied, err := sqldb.Migrate(ctx, db, ms)
	for _, name := range applied {
		log.Info("migration applied", zap.String("migration", name))
	}
	if err != nil {
		return err
	}
	log.Info("schema up to date", zap.Int("applied", len(applied)), zap.Int("migrations", len(ms)))
	return nil
}

// openMySQL waits for MySQL with capped backoff (a database that is still
// starting is no reason to crash-loop), then checks the schema: a missing
// migration or unique index stops start-up.
func openMySQL(ctx context.Context, cfg *Config, log *zap.Logger) (*sqldb.DB, error) {
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		return nil, err
	}
	wait := 200 * time.Millisecond
	dsn, err := cfg.mysqlDSN()
	if err != nil {
		return nil, err
	}
	opts := sqldb.Options{MaxOpen: cfg.MySQL.MaxOpenConns,
		LockWait: cfg.MySQL.LockWaitTimeout, IdleTransaction: cfg.MySQL.IdleTransactionTimeout}
	for {
		db, err := sqldb.OpenWith(ctx, dsn, opts)
		var settings *sqldb.SettingsError
		if errors.As(err, &settings) {
			return nil, err // waiting cannot fix it
		}
		if err == nil {
			if err := sqldb.CheckSchema(ctx, db, ms); err != nil {
				db.Close()
				return nil, err
			}
			return db, nil
		}
		log.Warn("mysql unavailable; waiting", zap.Error(err), zap.Duration("backoff", wait))
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 15*time.Second)
	}
}
