package sqldb

import (
	"context"
	"database/sql/driver"
	"fmt"
	"sync/atomic"
	"time"
)

// A cancelled context makes the driver drop its connection, but the server
// goes on running the statement (a lock wait, say) and keeps every lock the
// transaction took until it ends. killingConnector's connections have the
// server end them, with KILL CONNECTION from a side connection, as soon as
// a statement's context ends: the statement stops, the transaction rolls
// back and the locks are free. KILL CONNECTION rather than KILL QUERY: the
// client side is gone anyway, and a KILL QUERY that overtakes its statement
// (the server has not started it yet) does nothing, while a killed
// connection refuses whatever it was about to run.
type killingConnector struct {
	driver.Connector
}

// killTimeout bounds the side connection that sends the KILL.
const killTimeout = 15 * time.Second

func (k killingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := k.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	id, err := connectionID(ctx, c)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &killingConn{inner: c, id: id, connector: k.Connector}, nil
}

func connectionID(ctx context.Context, c driver.Conn) (uint64, error) {
	rows, err := c.(driver.QueryerContext).QueryContext(ctx, "SELECT CONNECTION_ID()", nil)
	if err != nil {
		return 0, fmt.Errorf("connection id: %w", err)
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		return 0, fmt.Errorf("connection id: %w", err)
	}
	switch id := v[0].(type) {
	case int64:
		return uint64(id), nil
	case uint64:
		return id, nil
	case []byte:
		var n uint64
		_, err := fmt.Sscan(string(id), &n)
		return n, err
	}
	return 0, fmt.Errorf("connection id: unexpected %T", v[0])
}

// killingConn is a driver connection that kills its running statement on
// the server when the statement's context ends. After that the connection
// is never reused: it reports itself bad, so a late KILL cannot hit another
// caller's statement.
type killingConn struct {
	inner     driver.Conn
	id        uint64
	connector driver.Connector
	killed    atomic.Bool
}

// watch arranges the kill for ctx; the returned func disarms it.
func (c *killingConn) watch(ctx context.Context) func() {
	if ctx.Done() == nil {
		return func() {}
	}
	kill := func() {
		c.killed.Store(true)
		kctx, cancel := context.WithTimeout(context.Background(), killTimeout)
		defer cancel()
		// Kill until the server has let go of the thread: a KILL that
		// overtakes its statement under load has been seen to leave it
		// running. A side connection refused for the moment (too many
		// connections under load) is tried again; a server that stays
		// unreachable ends the statement with the connection anyway.
		var side driver.Conn
		defer func() {
			if side != nil {
				side.Close()
			}
		}()
		for kctx.Err() == nil {
			if side == nil {
				side, _ = c.connector.Connect(kctx)
			}
			if side != nil {
				_, kerr := side.(driver.ExecerContext).ExecContext(kctx, fmt.Sprintf("KILL CONNECTION %d", c.id), nil)
				done, qerr := gone(kctx, side, c.id)
				if done {
					return
				}
				if kerr != nil || qerr != nil {
					// The side connection itself may be broken (seen under
					// load: unexpected EOF): dial a new one next time.
					side.Close()
					side = nil
				}
			}
			select {
			case <-kctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	stop := context.AfterFunc(ctx, kill)
	return func() {
		switch {
		case !stop():
			c.killed.Store(true) // the kill is under way or done
		case ctx.Err() != nil:
			// ctx ended and the driver returned before ctx got round to
			// starting kill (it closes Done first, then starts its
			// AfterFuncs): stopping it here would leave the statement
			// running on the server. Seen under load in CI.
			c.killed.Store(true)
			go kill()
		}
	}
}

// gone reports whether the server no longer runs thread id; err says the
// question could not be asked.
func gone(ctx context.Context, side driver.Conn, id uint64) (bool, error) {
	rows, err := side.(driver.QueryerContext).QueryContext(ctx,
		fmt.Sprintf("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %d", id), nil)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		return false, err
	}
	switch n := v[0].(type) {
	case []byte:
		return string(n) == "0", nil
	case int64:
		return n == 0, nil
	}
	return false, fmt.Errorf("processlist count: unexpected %T", v[0])
}

func (c *killingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	defer c.watch(ctx)()
	return c.inner.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *killingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	defer c.watch(ctx)()
	return c.inner.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *killingConn) Prepare(query string) (driver.Stmt, error) { return c.inner.Prepare(query) }
func (c *killingConn) Close() error                              { return c.inner.Close() }
func (c *killingConn) Begin() (driver.Tx, error) {
	return c.inner.Begin() //nolint:staticcheck // required by driver.Conn
}

func (c *killingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.inner.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c *killingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.inner.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *killingConn) Ping(ctx context.Context) error {
	return c.inner.(driver.Pinger).Ping(ctx)
}

func (c *killingConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.inner.(driver.NamedValueChecker).CheckNamedValue(nv)
}

func (c *killingConn) ResetSession(ctx context.Context) error {
	if c.killed.Load() {
		return driver.ErrBadConn
	}
	return c.inner.(driver.SessionResetter).ResetSession(ctx)
}

func (c *killingConn) IsValid() bool {
	return !c.killed.Load() && c.inner.(driver.Validator).IsValid()
}
