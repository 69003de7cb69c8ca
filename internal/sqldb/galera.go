package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// ErrNodeNotReady: the connection reached a node of a Galera or Percona
// XtraDB Cluster that is not Synced (a donor, a joiner, a desynced node,
// one cut off from the primary component). Such a node refuses
// statements (1047), or stalls writes behind a donor's global read lock,
// or answers reads from behind the cluster; paysvc waits for a Synced
// node instead.
var ErrNodeNotReady = errors.New("galera node not ready")

// IsNodeNotReady reports a Galera node that does not take work now: its
// refusal, 1047 (WSREP has not yet prepared node for application use), or
// a connection that found its node not Synced (ErrNodeNotReady). Nothing of
// the statement ran: the same work goes through on a Synced node.
func IsNodeNotReady(err error) bool {
	return code(err) == errNodeNotReady || errors.Is(err, ErrNodeNotReady)
}

// nodeRecheck is how old a pooled connection's last look at its Galera
// node may be when the connection is taken again: at most one SHOW per
// connection and interval, and none on a server without wsrep.
const nodeRecheck = time.Second

// wsrepSynced is wsrep_local_state for Synced.
const wsrepSynced = "4"

// isGalera reports whether c's server replicates with wsrep (a Galera or
// Percona XtraDB Cluster node). SHOW, not @@wsrep_on: MySQL has no such
// variable, and MariaDB without a cluster has it OFF (and wsrep_ready OFF
// too, so that alone would say nothing).
func isGalera(ctx context.Context, c driver.Conn) (bool, error) {
	vars, err := showPairs(ctx, c, "SHOW GLOBAL VARIABLES WHERE Variable_name = 'wsrep_on'")
	if err != nil {
		return false, fmt.Errorf("wsrep_on: %w", err)
	}
	return strings.EqualFold(vars["wsrep_on"], "ON"), nil
}

// NodeReady reads, now, the state of the Galera node a connection of db
// reaches: nil when it is Synced and ready, or when the server is not a
// Galera node; an error wrapping ErrNodeNotReady, with the state, when it
// is not; the connection's error when none is had. A connection that just
// came from the pool was last looked at up to nodeRecheck ago: a caller
// that saw a write fail asks here whether the node explains it.
func NodeReady(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err // a new connection to a node not ready fails with ErrNodeNotReady
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		kc, ok := dc.(*killingConn)
		if !ok || !kc.galera {
			return nil
		}
		if err := kc.checkNode(ctx); err != nil {
			kc.refused.Store(true) // not taken from the pool again: a redial may reach a Synced node
			return fmt.Errorf("%s: %w", kc.thread.server, err)
		}
		return nil
	})
}

// nodeReady returns nil when c's Galera node is Synced and ready, and an
// error wrapping ErrNodeNotReady, with its state, when it is not.
func nodeReady(ctx context.Context, c driver.Conn) error {
	st, err := showPairs(ctx, c, "SHOW GLOBAL STATUS WHERE Variable_name IN "+
		"('wsrep_ready', 'wsrep_local_state', 'wsrep_local_state_comment', 'wsrep_cluster_status')")
	if err != nil {
		return fmt.Errorf("wsrep status: %w", err)
	}
	if st["wsrep_ready"] == "ON" && st["wsrep_local_state"] == wsrepSynced {
		return nil
	}
	return fmt.Errorf("%w: wsrep_ready %s, wsrep_local_state %s (%s), cluster %s", ErrNodeNotReady,
		orNone(st["wsrep_ready"]), orNone(st["wsrep_local_state"]), orNone(st["wsrep_local_state_comment"]),
		orNone(st["wsrep_cluster_status"]))
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// showPairs runs a SHOW of name-value rows and returns them by lowercase
// name.
func showPairs(ctx context.Context, c driver.Conn, query string) (map[string]string, error) {
	rows, err := c.(driver.QueryerContext).QueryContext(ctx, query, nil)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	v := make([]driver.Value, len(rows.Columns()))
	if len(v) != 2 {
		return nil, fmt.Errorf("%d columns, want 2", len(v))
	}
	for {
		switch err := rows.Next(v); {
		case errors.Is(err, io.EOF):
			return out, nil
		case err != nil:
			return nil, err
		}
		out[strings.ToLower(text(v[0]))] = text(v[1])
	}
}
