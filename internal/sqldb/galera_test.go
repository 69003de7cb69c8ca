package sqldb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// galeraNode starts a one-node Galera cluster of the test's own and returns
// its address once the node is Synced.
func galeraNode(t *testing.T) string {
	t.Helper()
	gcomm := testenv.FreeAddr(t)
	addr := testenv.MariaDB(t, "--wsrep-on=ON", "--wsrep-provider=/usr/lib/galera/libgalera_smm.so",
		"--wsrep-cluster-address=gcomm://", "--wsrep-node-address="+gcomm,
		"--wsrep-provider-options=gmcast.listen_addr=tcp://"+gcomm,
		"--binlog-format=ROW", "--innodb-autoinc-lock-mode=2", "--skip-log-bin")
	admin := sqlx.MustOpen("mysql", "root@tcp("+addr+")/")
	defer admin.Close()
	testenv.Eventually(t, 30*time.Second, func() bool {
		var name, state string
		return admin.QueryRow("SHOW GLOBAL STATUS WHERE Variable_name = 'wsrep_local_state'").Scan(&name, &state) == nil && state == "4"
	}, "the Galera node on %s is not Synced", addr)
	return addr
}

// A Galera node that is not Synced (here desynced, as a donor is) gets no
// connection and no statement from the pool: the pooled connection is
// dropped when taken again, a new one is refused with ErrNodeNotReady (an
// outage, IsConnection), and work goes through once the node is Synced.
func TestGaleraNodeNotSyncedIsNotUsed(t *testing.T) {
	t.Parallel()
	addr := galeraNode(t)
	ctx := context.Background()
	admin := sqlx.MustOpen("mysql", "root@tcp("+addr+")/")
	defer admin.Close()
	admin.MustExec("CREATE DATABASE g")
	admin.MustExec("CREATE TABLE g.t (id INT PRIMARY KEY)")
	db, err := sqldb.Open(ctx, "root@tcp("+addr+")/g", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.MustExec("INSERT INTO t VALUES (1)")

	admin.MustExec("SET GLOBAL wsrep_desync = ON")
	defer admin.Exec("SET GLOBAL wsrep_desync = OFF")
	time.Sleep(1100 * time.Millisecond) // past the pooled connection's last look (nodeRecheck)
	_, err = db.ExecContext(ctx, "INSERT INTO t VALUES (2)")
	if !sqldb.IsNodeNotReady(err) || !sqldb.IsConnection(err) || !errors.Is(err, sqldb.ErrNodeNotReady) {
		t.Fatalf("insert on a desynced node: %v; want ErrNodeNotReady (an outage)", err)
	}
	admin.MustExec("SET GLOBAL wsrep_desync = OFF")
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, err := db.ExecContext(ctx, "INSERT INTO t VALUES (2)")
		return err == nil
	}, "no insert once the node is Synced again")
}

// A statement the node refuses as not ready (1047: a joiner, a node cut
// off from the primary component) is an outage, and its connection is not
// pooled again: the next statement runs on a new connection, which a
// proxy may send to another node.
func TestGaleraRefusedConnectionIsRetired(t *testing.T) {
	t.Parallel()
	addr := galeraNode(t)
	ctx := context.Background()
	admin := sqlx.MustOpen("mysql", "root@tcp("+addr+")/")
	defer admin.Close()
	admin.MustExec("CREATE DATABASE g")
	admin.MustExec("CREATE TABLE g.t (id INT PRIMARY KEY)")
	db, err := sqldb.Open(ctx, "root@tcp("+addr+")/g", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var before, after int64
	if err := db.GetContext(ctx, &before, "SELECT CONNECTION_ID()"); err != nil {
		t.Fatal(err)
	}
	admin.MustExec("SET GLOBAL wsrep_reject_queries = ALL")
	defer admin.Exec("SET GLOBAL wsrep_reject_queries = NONE")
	_, err = db.ExecContext(ctx, "INSERT INTO t VALUES (1)")
	if !sqldb.IsNodeNotReady(err) || !sqldb.IsConnection(err) {
		t.Fatalf("insert refused by the node: %v; want IsNodeNotReady and IsConnection", err)
	}
	admin.MustExec("SET GLOBAL wsrep_reject_queries = NONE")
	if err := db.GetContext(ctx, &after, "SELECT CONNECTION_ID()"); err != nil {
		t.Fatal(err)
	}
	if after == before {
		t.Errorf("connection %d pooled again after its node refused a statement", before)
	}
	db.MustExec("INSERT INTO t VALUES (1)")
}

// A server without wsrep (the MariaDB the other tests use, whose
// wsrep_ready is OFF) is never taken for a Galera node that is not ready.
func TestNoGaleraNoNodeCheck(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	var ready string
	if err := db.QueryRow("SHOW GLOBAL STATUS WHERE Variable_name = 'wsrep_ready'").Scan(new(string), &ready); err == nil && ready == "ON" {
		t.Skip("the shared server is a ready Galera node")
	}
	time.Sleep(1100 * time.Millisecond)
	for range 3 {
		if _, err := db.Exec("INSERT INTO t_write_probe (instance, probed_at) VALUES ('x', NOW(3)) ON DUPLICATE KEY UPDATE probed_at = NOW(3)"); err != nil {
			t.Fatal(err)
		}
	}
}

// NodeReady reads the node's state now, not as the pooled connection last
// saw it: right after the node is desynced (well within nodeRecheck of the
// connection's last look) it says not ready, and ready again once the node
// is Synced. On a server without wsrep it says ready.
func TestNodeReadyReadsTheNodeNow(t *testing.T) {
	t.Parallel()
	addr := galeraNode(t)
	ctx := context.Background()
	admin := sqlx.MustOpen("mysql", "root@tcp("+addr+")/")
	defer admin.Close()
	db, err := sqldb.Open(ctx, "root@tcp("+addr+")/", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqldb.NodeReady(ctx, db.DB); err != nil {
		t.Fatalf("NodeReady on a Synced node: %v", err)
	}
	admin.MustExec("SET GLOBAL wsrep_desync = ON")
	defer admin.Exec("SET GLOBAL wsrep_desync = OFF")
	if err := sqldb.NodeReady(ctx, db.DB); !sqldb.IsNodeNotReady(err) {
		t.Fatalf("NodeReady on a desynced node: %v; want ErrNodeNotReady", err)
	}
	admin.MustExec("SET GLOBAL wsrep_desync = OFF")
	testenv.Eventually(t, 10*time.Second, func() bool { return sqldb.NodeReady(ctx, db.DB) == nil },
		"NodeReady never nil once the node is Synced again")

	_, plain := testenv.MySQL(t)
	if err := sqldb.NodeReady(ctx, plain.DB); err != nil {
		t.Fatalf("NodeReady on a server without wsrep: %v", err)
	}
}
