package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/migrations"
)

const usage = `usage: paysvc [--config FILE] <command>

commands:
  migrate   apply the embedded schema migrations (safe to re-run)
  run       consume q.pay.success until SIGTERM or SIGINT
  version   print the version

--config defaults to ./config.yaml (optional unless given). Every key can be
overridden by PAYSVC_<SECTION>_<KEY>, or PAYSVC_<SECTION>_<KEY>_FILE.
`

// run parses args and runs one command. env is the process environment
// (KEY=VALUE); logs go to out.
func run(ctx context.Context, args, env []string, out io.Writer) error {
	configPath, mustExist := "config.yaml", false
	parse := func(args []string) ([]string, error) {
		fs := flag.NewFlagSet("paysvc", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		path := fs.String("config", "", "config file")
		if err := fs.Parse(args); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, usage)
		}
		if *path != "" {
			configPath, mustExist = *path, true
		}
		return fs.Args(), nil
	}
	rest, err := parse(args)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return errors.New(usage)
	}
	cmd := rest[0]
	if rest, err = parse(rest[1:]); err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("%s: unexpected arguments %q\n%s", cmd, rest, usage)
	}
	if cmd == "version" {
		fmt.Fprintln(out, versionString())
		return nil
	}
	if cmd != "run" && cmd != "migrate" {
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}

	envMap := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			envMap[k] = v
		}
	}
	cfg, err := loadConfig(configPath, mustExist, envMap)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, out)
	if err != nil {
		return err
	}
	defer log.Sync()
	log.Info("paysvc starting", zap.String("command", cmd), zap.String("version", version),
		zap.Any("config", cfg.redacted()))

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if cmd == "migrate" {
		return migrate(ctx, cfg, log)
	}
	return daemon(ctx, cfg, log)
}

func versionString() string {
	rev := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " " + s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("paysvc %s%s %s", version, rev, runtime.Version())
}

func newLogger(cfg *Config, out io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(cfg.Log.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey, ec.EncodeTime = "ts", zapcore.ISO8601TimeEncoder
	enc := zapcore.NewJSONEncoder(ec)
	if cfg.Log.Format == "console" {
		enc = zapcore.NewConsoleEncoder(ec)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(out), level)), nil
}

// migrate creates the database if it is missing, then applies migrations.
func migrate(ctx context.Context, cfg *Config, log *zap.Logger) error {
	if err := sqldb.CreateDatabase(ctx, cfg.MySQL.DSN); err != nil {
		return err
	}
	db, err := sqldb.Open(ctx, cfg.MySQL.DSN, 2)
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

// daemon wires config → MySQL → Redis → consumer → admin HTTP, and runs until
// ctx ends.
func daemon(ctx context.Context, cfg *Config, log *zap.Logger) error {
	db, err := openMySQL(ctx, cfg, log)
	if err != nil {
		return err
	}
	if db == nil {
		return nil // stopped while waiting
	}
	defer db.Close()

	rdb := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:        []string{cfg.Redis.Addr},
		Password:     cfg.Redis.Password,
		DB:           cfg.Redis.DB,
		DialTimeout:  2 * time.Second,
		ReadTimeout:  time.Second,
		WriteTimeout: time.Second,
		PoolSize:     cfg.AMQP.Workers + 4,
	})
	defer rdb.Close()
	guard := idem.New(rdb, idem.Config{
		KeyPrefix: cfg.Idempotent.KeyPrefix,
		TTL:       cfg.Idempotent.TTL,
		Lease:     cfg.Idempotent.Lease,
	})

	host, _ := os.Hostname()
	consumer := listener.New(listener.Config{
		URL:            cfg.AMQP.URL,
		ConnectionName: fmt.Sprintf("paysvc %s %s/%d", version, host, os.Getpid()),
		Prefetch:       cfg.AMQP.Prefetch,
		Workers:        cfg.AMQP.Workers,
		Retry:          listener.RetryPolicy{Delays: cfg.Retry.Delays, MaxAttempts: cfg.Retry.MaxAttempts},
		RedisFallback:  listener.Fallback(cfg.Idempotent.RedisFallback),
		HandleTimeout:  cfg.Idempotent.Lease / 2,
		DrainTimeout:   cfg.AMQP.DrainTimeout,
		PublishTimeout: 10 * time.Second,
		MaxBackoff:     15 * time.Second,
	}, order.NewStore(db), guard, log)

	if cfg.HTTP.Addr != "" {
		srv := &http.Server{Addr: cfg.HTTP.Addr, Handler: adminHandler(consumer), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin http server", zap.Error(err))
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(sctx)
		}()
	}
	err = consumer.Run(ctx)
	log.Info("paysvc stopped", zap.Error(err))
	return err
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
	for {
		db, err := sqldb.Open(ctx, cfg.MySQL.DSN, cfg.MySQL.MaxOpenConns)
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

func adminHandler(c *listener.Consumer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !c.Ready() {
			http.Error(w, "not consuming", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	return mux
}
