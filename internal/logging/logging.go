// Package logging builds paysvc's zap logger and routes the client
// libraries' own loggers through it, so that in json mode every line paysvc
// writes is a JSON entry with level, ts and msg.
package logging

import (
	"context"
	"fmt"
	"io"
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
	libraries sync.Once
	target    atomic.Pointer[zap.Logger]
)

// RouteLibraries sends what go-redis, go-sql-driver/mysql and amqp091-go
// log on their own (dial failures, bad idle connections...) to log, at warn
// level, with the library in the "lib" field. Their loggers are process
// globals: they are set once, and the last logger given here receives.
func RouteLibraries(log *zap.Logger) {
	target.Store(log)
	libraries.Do(func() {
		redis.SetLogger(redisLogger{})
		mysql.SetLogger(mysqlLogger{})
		amqp.SetLogger(amqpLogger{})
	})
}

// Unroute stops sending the libraries' lines to log, if it still receives
// them (a daemon that stops hands them on to nobody).
func Unroute(log *zap.Logger) { target.CompareAndSwap(log, nil) }

func library(lib, msg string) {
	if log := target.Load(); log != nil {
		log.Warn(strings.TrimSpace(msg), zap.String("lib", lib))
	}
}

type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	library("go-redis", fmt.Sprintf(format, v...))
}

type mysqlLogger struct{}

func (mysqlLogger) Print(v ...any) { library("go-sql-driver/mysql", fmt.Sprint(v...)) }

type amqpLogger struct{}

func (amqpLogger) Printf(format string, v ...any) { library("amqp091-go", fmt.Sprintf(format, v...)) }
