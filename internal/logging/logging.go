// Package logging builds paysvc's zap logger and routes the client
// libraries' own loggers through it, so that in json mode every line paysvc
// writes is a JSON entry with level, ts and msg.
package logging

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Config says how to log.
type Config struct {
	Level  string // debug, info, warn, error
	Format string // json or console
}

// New returns a logger writing entries to out: JSON objects with ts (ISO
// 8601), level, msg and the fields, or console lines.
func New(cfg Config, out io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(cfg.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey, ec.EncodeTime = "ts", zapcore.ISO8601TimeEncoder
	enc := zapcore.NewJSONEncoder(ec)
	if cfg.Format == "console" {
		enc = zapcore.NewConsoleEncoder(ec)
	}
	// Lock: the daemon's goroutines and the client libraries' log at once.
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(out)), level)), nil
}

// Sampled returns log keeping, each second, the first perSecond entries of
// each message and level, then one in thereafter (zap's sampler). paysvc
// uses it for the line of each applied payment (FIRST), which at full
// speed is thousands a second; perSecond 0 returns log unchanged.
func Sampled(log *zap.Logger, perSecond, thereafter int) *zap.Logger {
	if perSecond <= 0 {
		return log
	}
	return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, perSecond, thereafter)
	}))
}

var (
	target atomic.Pointer[zap.Logger]
	// fallback receives the libraries' lines while no logger is routed
	// (the CLI commands, a daemon before its logger is built): JSON on
	// standard error, as paysvc's own lines.
	fallback = sync.OnceValue(func() *zap.Logger {
		log, _ := New(Config{Level: "warn", Format: "json"}, os.Stderr)
		return log
	})
)

// The libraries' loggers are process globals, which they read as they work
// (go-sql-driver reads its own when it parses a DSN): they are set here,
// before any goroutine runs, and never again. RouteLibraries only chooses
// where their lines go.
func init() {
	redis.SetLogger(redisLogger{})
	mysql.SetLogger(mysqlLogger{})
	amqp.SetLogger(amqpLogger{})
}

// RouteLibraries sends what go-redis, go-sql-driver/mysql and amqp091-go
// log on their own (dial failures, bad idle connections...) to log, at warn
// level, with the library in the "lib" field; the last logger given here
// receives. Until then, and after Unroute, they go to standard error as
// JSON lines.
func RouteLibraries(log *zap.Logger) { target.Store(log) }

// Unroute stops sending the libraries' lines to log, if it still receives
// them (a daemon that stops hands them back to standard error).
func Unroute(log *zap.Logger) { target.CompareAndSwap(log, nil) }

func library(lib, msg string) {
	log := target.Load()
	if log == nil {
		log = fallback()
	}
	log.Warn(strings.TrimSpace(msg), zap.String("lib", lib))
}

type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	library("go-redis", fmt.Sprintf(format, v...))
}

type mysqlLogger struct{}

func (mysqlLogger) Print(v ...any) { library("go-sql-driver/mysql", fmt.Sprint(v...)) }

type amqpLogger struct{}

func (amqpLogger) Printf(format string, v ...any) { library("amqp091-go", fmt.Sprintf(format, v...)) }
