package sqldb

import (
	"context"
	"database/sql/driver"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
)

// ArmAndDisarm opens a connection through the killing connector, arms its
// kill for ctx and disarms it at once, as a statement that returned does;
// it returns the connection's id on the server (the connection stays open).
func ArmAndDisarm(ctx context.Context, c driver.Connector) (uint64, error) {
	conn, err := killingConnector{Connector: c, log: zap.NewNop(), timeout: killTimeout}.Connect(context.Background())
	if err != nil {
		return 0, err
	}
	kc := conn.(*killingConn)
	kc.watch(ctx)()
	return kc.thread.id, nil
}

// WithKillTimeout is opts with the kill of a cancelled statement given up
// after d instead of killTimeout.
func WithKillTimeout(opts Options, d time.Duration) Options {
	opts.killTimeout = d
	return opts
}

// LeaseFor is Lease with a term of d instead of LeaseTerm.
func LeaseFor(ctx context.Context, db *sqlx.DB, name string, wait, d time.Duration) (context.Context, func(), error) {
	return lease(ctx, db, name, wait, d)
}
