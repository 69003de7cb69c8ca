package sqldb

import (
	"cmp"
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
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
//
// Behind a load balancer in front of several servers (HAProxy, a Galera
// balancer), the side connection may reach another server, where the same
// thread id is someone else's: the KILL is sent only over a side
// connection whose server is the statement's (same @@hostname, @@port and
// @@server_id). A side connection that reaches another is closed and
// dialled again; if none reaches the statement's server within
// killTimeout, nothing is killed and the pool's logger says so. The
// statement then runs until it ends by itself (a lock wait within the
// lock wait bound), and the server rolls its transaction back when it
// finds the client gone, or, on a silent network, after the
// idle-transaction bound (Options).
type killingConnector struct {
	driver.Connector
	log     *zap.Logger
	timeout time.Duration // killTimeout
}

// killTimeout bounds the side connection that sends the KILL.
const killTimeout = 15 * time.Second

func (k killingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := k.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	th, err := ownThread(ctx, c)
	if err != nil {
		c.Close()
		return nil, err
	}
	kc := &killingConn{inner: c, thread: th, connector: k}
	if kc.galera, err = isGalera(ctx, c); err == nil && kc.galera {
		err = kc.checkNode(ctx)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", th.server, err)
	}
	return kc, nil
}

// thread is a connection's thread id on its server, and the server: what
// tells apart the servers behind one address (MariaDB has no
// @@server_uuid, so these three, which MySQL has too).
type thread struct {
	id     uint64
	server string // @@hostname:@@port, server_id @@server_id
	// proxied: CONNECTION_ID() was answered by a proxy with an id of its
	// own (ProxySQL answers this exact statement, and takes KILL to mean
	// its own sessions), not the server's thread id.
	proxied bool
}

// identify reads the thread and the server that c reached.
func identify(ctx context.Context, c driver.Conn) (thread, error) {
	v, err := queryRow(ctx, c, "SELECT CONNECTION_ID(), @@hostname, @@port, @@server_id", 4)
	if err != nil {
		return thread{}, fmt.Errorf("connection id: %w", err)
	}
	id, err := strconv.ParseUint(text(v[0]), 10, 64)
	if err != nil {
		return thread{}, fmt.Errorf("connection id: %w", err)
	}
	return thread{id: id, server: fmt.Sprintf("%s:%s, server_id %s", text(v[1]), text(v[2]), text(v[3]))}, nil
}

// ownThread is identify for a connection whose statements may be killed:
// it also asks for SELECT CONNECTION_ID() alone, the statement a proxy
// that speaks for the server answers itself (one round trip more per
// connection, once). An answer that differs from the server's is a
// proxy's: the KILL would go to the proxy's own sessions, maybe another
// proxy's, so the connection is never killed (ProxySQL ends the server's
// thread itself when its client hangs up mid-statement).
func ownThread(ctx context.Context, c driver.Conn) (thread, error) {
	th, err := identify(ctx, c)
	if err != nil {
		return thread{}, err
	}
	v, err := queryRow(ctx, c, "SELECT CONNECTION_ID()", 1)
	if err != nil {
		return thread{}, fmt.Errorf("connection id: %w", err)
	}
	th.proxied = text(v[0]) != strconv.FormatUint(th.id, 10)
	return th, nil
}

// queryRow runs query on c and returns the n columns of its first row.
func queryRow(ctx context.Context, c driver.Conn, query string, n int) ([]driver.Value, error) {
	rows, err := c.(driver.QueryerContext).QueryContext(ctx, query, nil)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if got := len(rows.Columns()); got != n {
		return nil, fmt.Errorf("%d columns, want %d", got, n)
	}
	v := make([]driver.Value, n)
	if err := rows.Next(v); err != nil {
		return nil, err
	}
	return v, nil
}

// text is a column's value as the server wrote it.
func text(v driver.Value) string {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case nil:
		return "NULL"
	}
	return fmt.Sprint(v)
}

// killingConn is a driver connection that kills its running statement on
// the server when the statement's context ends. After that the connection
// is never reused: it reports itself bad, so a late KILL cannot hit another
// caller's statement.
//
// On a Galera node, a connection is opened only to a Synced node, and is
// not taken from the pool again once its node says it is not ready (1047)
// or, looked at again when taken after nodeRecheck, is not Synced: a
// redial lets a proxy in front of the cluster send it to a node that is.
type killingConn struct {
	inner     driver.Conn
	thread    thread
	connector killingConnector
	killed    atomic.Bool
	galera    bool        // the server is a Galera node
	checked   time.Time   // its state last read (ResetSession and Connect only)
	refused   atomic.Bool // its node answered 1047
}

// watch arranges the kill for ctx; the returned func disarms it.
func (c *killingConn) watch(ctx context.Context) func() {
	if ctx.Done() == nil {
		return func() {}
	}
	stop := context.AfterFunc(ctx, c.kill)
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
			go c.kill()
		}
	}
}

// kill ends c's thread on its server, or says why it could not.
func (c *killingConn) kill() {
	c.killed.Store(true)
	log := c.connector.log.With(zap.Uint64("thread", c.thread.id), zap.String("server", c.thread.server))
	if c.thread.proxied {
		log.Warn("cancelled statement not killed: a proxy answers for the server's connection id; " +
			"the proxy, or the server's idle-transaction timeout, ends it")
		return
	}
	kctx, cancel := context.WithTimeout(context.Background(), c.connector.timeout)
	defer cancel()
	// Kill until the server has let go of the thread: a KILL that
	// overtakes its statement under load has been seen to leave it
	// running. A side connection refused for the moment (too many
	// connections under load) or sent to another server is tried again;
	// a server that stays unreachable ends the statement with the
	// connection anyway.
	var (
		side driver.Conn
		last error
		sent bool // a KILL went through
	)
	defer func() {
		if side != nil {
			side.Close()
		}
	}()
	for kctx.Err() == nil {
		if side == nil {
			side, last = c.dialSameServer(kctx)
		}
		if side != nil {
			_, kerr := side.(driver.ExecerContext).ExecContext(kctx, fmt.Sprintf("KILL CONNECTION %d", c.thread.id), nil)
			sent = sent || kerr == nil
			done, qerr := gone(kctx, side, c.thread.id)
			if done {
				return
			}
			if kerr != nil || qerr != nil {
				// The side connection itself may be broken (seen under
				// load: unexpected EOF): dial a new one next time.
				last = cmp.Or(kerr, qerr)
				side.Close()
				side = nil
			}
		}
		select {
		case <-kctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	fields := []zap.Field{zap.Duration("tried", c.connector.timeout), zap.Error(last)}
	if sent {
		log.Warn("cancelled statement killed, but its thread still runs on the server", fields...)
		return
	}
	log.Warn("cancelled statement not killed: it runs until it ends, then the server rolls its "+
		"transaction back (a silent network: after the idle-transaction timeout)", fields...)
}

// dialSameServer opens a side connection to the server that runs c's
// thread. One that reaches another server is closed: there the thread id
// is another connection's. A TCP connection stays on the server it
// reached, so the check holds for every KILL sent over it.
func (c *killingConn) dialSameServer(ctx context.Context) (driver.Conn, error) {
	side, err := c.connector.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	th, err := identify(ctx, side)
	if err == nil && th.server != c.thread.server {
		err = fmt.Errorf("side connection reached %s, not %s", th.server, c.thread.server)
	}
	if err != nil {
		side.Close()
		return nil, err
	}
	return side, nil
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
	res, err := c.inner.(driver.ExecerContext).ExecContext(ctx, query, args)
	c.noteRefusal(err)
	return res, err
}

func (c *killingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	defer c.watch(ctx)()
	rows, err := c.inner.(driver.QueryerContext).QueryContext(ctx, query, args)
	c.noteRefusal(err)
	return rows, err
}

// noteRefusal retires the connection once its node refused a statement as
// not ready (1047).
func (c *killingConn) noteRefusal(err error) {
	if err != nil && code(err) == errNodeNotReady {
		c.refused.Store(true)
	}
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
	if c.killed.Load() || c.refused.Load() {
		return driver.ErrBadConn
	}
	if err := c.inner.(driver.SessionResetter).ResetSession(ctx); err != nil {
		return err
	}
	if c.galera && time.Since(c.checked) >= nodeRecheck {
		if c.checkNode(ctx) != nil {
			return driver.ErrBadConn // closed; database/sql takes or dials another
		}
	}
	return nil
}

// checkNode reads the state of c's Galera node: nil, and the time noted,
// when it is Synced and ready; else why not (ErrNodeNotReady).
func (c *killingConn) checkNode(ctx context.Context) error {
	if err := nodeReady(ctx, c.inner); err != nil {
		return err
	}
	c.checked = time.Now()
	return nil
}

func (c *killingConn) IsValid() bool {
	return !c.killed.Load() && !c.refused.Load() && c.inner.(driver.Validator).IsValid()
}
