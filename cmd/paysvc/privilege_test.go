package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// paysvc runs with the users scripts/least-privilege.sh makes, and those
// users cannot do what they must not: delete or rewrite money rows, touch
// other queues, or write other Redis keys.
func TestLeastPrivilegeUsers(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	id := testenv.Name(t)[len(testenv.Name(t))-8:]
	appUser, migUser, rmqUser, redisUser := "pa_"+id, "pm_"+id, "pr_"+id, "pk_"+id
	const pw = "Pw-0f-test'\"$x"
	cfg, _ := mysql.ParseDSN(w.dsn)
	vhost := w.amqpURL[strings.LastIndex(w.amqpURL, "/")+1:]
	cmd := exec.Command("scripts/least-privilege.sh", "all")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "MYSQL_DATABASE="+cfg.DBName, "APP_USER="+appUser, "MIGRATE_USER="+migUser,
		"APP_PASSWORD="+pw, "MIGRATE_PASSWORD="+pw, "RABBITMQ_VHOST="+vhost, "RABBITMQ_USER="+rmqUser,
		"RABBITMQ_PASSWORD="+pw, "REDIS_USER="+redisUser, "REDIS_PASSWORD="+pw, "REDIS_KEY_PREFIX="+w.prefix)
	out, err := cmd.CombinedOutput()
	t.Cleanup(func() {
		w.db.Exec("DROP USER IF EXISTS '" + appUser + "'@'%', '" + migUser + "'@'%'")
		exec.Command("rabbitmqctl", "-q", "delete_user", rmqUser).Run()
		w.rdb.Do(context.Background(), "ACL", "DELUSER", redisUser)
	})
	if err != nil {
		t.Fatalf("least-privilege.sh: %v\n%s", err, out)
	}
	if strings.Contains(string(out), pw) {
		t.Fatal("the script printed a password")
	}

	app := *cfg
	app.User, app.Passwd = appUser, pw
	mig := *cfg
	mig.User, mig.Passwd = migUser, pw
	amqpURL := strings.Replace(w.amqpURL, "guest:guest@", rmqUser+":"+pw+"@", 1)
	amqpURL = strings.Replace(amqpURL, pw, urlEscape(pw), 1)

	var migOut strings.Builder
	if err := run(context.Background(), []string{"migrate"}, []string{"PAYSVC_MYSQL_DSN=" + mig.FormatDSN()}, &migOut); err != nil {
		t.Fatalf("migrate as %s: %v\n%s", migUser, err, migOut.String())
	}

	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (71, 50.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('LP1', 71, 20.00)")
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	env := w.env("PAYSVC_MYSQL_DSN="+app.FormatDSN(), "PAYSVC_AMQP_URL="+amqpURL,
		"PAYSVC_REDIS_USERNAME="+redisUser, "PAYSVC_REDIS_PASSWORD="+pw, "PAYSVC_METRICS_QUEUEINTERVAL=1s",
		"PAYSVC_RECONCILE_LOSTSWEEPRATE=1000000") // walks of the shared Redis's keys that end within the test's deadline
	go func() { done <- run(ctx, []string{"run"}, env, &logs) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		if t.Failed() {
			t.Logf("daemon output:\n%s", logs.String())
		}
	}()
	testenv.Eventually(t, 20*time.Second, func() bool { return testenv.QueueExists(t, w.amqpURL, listener.MainQueue) },
		"topology never declared")
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("LP1", 71, "20.00"), []byte("poison"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'LP1' AND status = 'PAID'") == 1 &&
			w.count("SELECT COUNT(*) FROM t_dead_letter WHERE error_class = 'bad_message'") == 1 &&
			// attempts 1: born leased and handed to the daemon's own
			// dispatcher, never polled and leased again.
			w.count("SELECT COUNT(*) FROM t_outbox WHERE status = 'SENT' AND attempts = 1") == 1
	}, "the least-privileged daemon did not pay, park and notify")
	// A claim that finds its key taken: the order's own "done" (a
	// duplicate), a hand-written consumer's "1", a key of another type.
	// The claim script runs only the commands the ACL user has.
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('LP2', 71, 1.00), ('LP3', 71, 1.00)")
	w.rdb.Set(context.Background(), w.prefix+"LP2", "1", time.Hour)
	w.rdb.HSet(context.Background(), w.prefix+"LP3", "a", "b")
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("LP1", 71, "20.00"), payment("LP2", 71, "1.00"), payment("LP3", 71, "1.00"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no IN ('LP2', 'LP3') AND status = 'PAID'") == 2 &&
			strings.Contains(logs.String(), `"order_no":"LP1","idem_key":"`+w.prefix+`LP1","result":"DUPLICATE"`)
	}, "the least-privileged daemon did not answer the duplicate and pay past the foreign keys")
	// A payment the database lost (a done key, the order INIT): the
	// daemon's walk of the keys (SCAN) finds it as the ACL user.
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('LP4', 71, 2.00)")
	w.rdb.Set(context.Background(), w.prefix+"LP4", "done", time.Hour)
	testenv.Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(logs.String(), `"order_no":"LP4","user_id":71,"amount":"2.00","order_status":"INIT"`)
	}, "the least-privileged daemon did not find the lost payment")
	if n := w.count("SELECT COUNT(*) FROM t_account_flow WHERE biz_no = 'LP1'"); n != 1 {
		t.Fatalf("LP1 has %d flows, want 1", n)
	}
	if strings.Contains(logs.String(), "NOPERM") || strings.Contains(logs.String(), "can't run this command") {
		t.Fatal("a Redis command the ACL user may not run was sent")
	}
	if strings.Contains(logs.String(), pw) {
		t.Fatal("a password reached the log")
	}

	// What the users must not do.
	appDB, err := sqldb.Open(context.Background(), app.FormatDSN(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer appDB.Close()
	for _, q := range []string{"DELETE FROM t_account_flow", "UPDATE t_account_flow SET amount = 0", "DELETE FROM t_order",
		"DROP TABLE t_outbox", "DELETE FROM t_dead_letter"} {
		if _, err := appDB.Exec(q); err == nil || !strings.Contains(err.Error(), "denied") {
			t.Errorf("as %s, %q: %v; want denied", appUser, q, err)
		}
	}
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	if _, err := ch.QueueDeclare("other.queue", true, false, false, false, nil); err == nil || !strings.Contains(err.Error(), "ACCESS_REFUSED") {
		t.Errorf("declaring other.queue: %v; want ACCESS_REFUSED", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(), Username: redisUser, Password: pw})
	defer rdb.Close()
	if err := rdb.Set(context.Background(), "other:key", "1", time.Minute).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("SET other:key: %v; want NOPERM", err)
	}
	if err := rdb.Set(context.Background(), w.prefix+"x", "1", time.Minute).Err(); err != nil {
		t.Errorf("SET in its prefix: %v", err)
	}
}

func urlEscape(s string) string {
	r := strings.NewReplacer("%", "%25", "'", "%27", "\"", "%22", "$", "%24", "@", "%40", ":", "%3A", "/", "%2F")
	return r.Replace(s)
}

// The documented order on a new server: the script before anything exists
// (it creates the database and both users, and names the tables it cannot
// grant on yet), migrate as the migration user, the script again; the
// daemon's user can then read and write its tables, and still not delete.
func TestLeastPrivilegeOnAnEmptyDatabase(t *testing.T) {
	t.Parallel()
	dsn, admin := testenv.MySQL(t)
	id := testenv.Name(t)[len(testenv.Name(t))-8:]
	dbName, appUser, migUser := "pe_"+id, "pea_"+id, "pem_"+id
	const pw = "Pw-empty-0f'x"
	t.Cleanup(func() {
		admin.Exec("DROP DATABASE IF EXISTS `" + dbName + "`")
		admin.Exec("DROP USER IF EXISTS '" + appUser + "'@'%', '" + migUser + "'@'%'")
	})
	script := func() string {
		t.Helper()
		cmd := exec.Command("scripts/least-privilege.sh", "mysql")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "MYSQL_DATABASE="+dbName, "APP_USER="+appUser, "MIGRATE_USER="+migUser,
			"APP_PASSWORD="+pw, "MIGRATE_PASSWORD="+pw)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("least-privilege.sh mysql: %v\n%s", err, out)
		}
		return string(out)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = dbName
	app, mig := *cfg, *cfg
	app.User, app.Passwd = appUser, pw
	mig.User, mig.Passwd = migUser, pw

	if out := script(); !strings.Contains(out, "not migrated yet") || !strings.Contains(out, "t_order") {
		t.Fatalf("on an empty database the script must say what it could not grant yet:\n%s", out)
	}
	var migOut strings.Builder
	if err := run(context.Background(), []string{"migrate"}, []string{"PAYSVC_MYSQL_DSN=" + mig.FormatDSN()}, &migOut); err != nil {
		t.Fatalf("migrate as %s: %v\n%s", migUser, err, migOut.String())
	}
	if out := script(); strings.Contains(out, "not migrated yet") {
		t.Fatalf("after the migration the script still misses tables:\n%s", out)
	}
	appDB, err := sqldb.Open(context.Background(), app.FormatDSN(), 1)
	if err != nil {
		t.Fatalf("the daemon's user after both runs: %v", err)
	}
	defer appDB.Close()
	var n int
	if err := appDB.Get(&n, "SELECT COUNT(*) FROM t_order"); err != nil {
		t.Fatalf("as %s, reading t_order: %v", appUser, err)
	}
	if _, err := appDB.Exec("DELETE FROM t_account_flow"); err == nil || !strings.Contains(err.Error(), "denied") {
		t.Errorf("as %s, DELETE FROM t_account_flow: %v; want denied", appUser, err)
	}
}

// The upgrade of a least-privilege deployment from a paysvc that recorded
// its versions in schema_migrations: the new daemon refuses the database
// until `paysvc migrate` (as the migration user) has moved the table, then
// waits, naming the grant, until scripts/least-privilege.sh mysql has given
// the daemon's user SELECT on paysvc_schema_migrations, and starts.
func TestLeastPrivilegeUpgradeMovesTheVersionsTable(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	id := testenv.Name(t)[len(testenv.Name(t))-8:]
	appUser, migUser := "pua_"+id, "pum_"+id
	const pw = "Pw-upgrade-0f'x"
	cfg, _ := mysql.ParseDSN(w.dsn)
	t.Cleanup(func() { w.db.Exec("DROP USER IF EXISTS '" + appUser + "'@'%', '" + migUser + "'@'%'") })
	script := func() {
		t.Helper()
		cmd := exec.Command("scripts/least-privilege.sh", "mysql")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "MYSQL_DATABASE="+cfg.DBName, "APP_USER="+appUser, "MIGRATE_USER="+migUser,
			"APP_PASSWORD="+pw, "MIGRATE_PASSWORD="+pw)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("least-privilege.sh mysql: %v\n%s", err, out)
		}
	}
	// The database and grants an earlier paysvc left.
	w.db.MustExec("RENAME TABLE paysvc_schema_migrations TO schema_migrations")
	script()
	w.db.MustExec("GRANT SELECT ON `" + cfg.DBName + "`.schema_migrations TO '" + appUser + "'@'%'")
	app, mig := *cfg, *cfg
	app.User, app.Passwd = appUser, pw
	mig.User, mig.Passwd = migUser, pw
	env := w.env("PAYSVC_MYSQL_DSN=" + app.FormatDSN())

	var early strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, []string{"run"}, env, &early); err == nil || !strings.Contains(early.String(), "run `paysvc migrate`") {
		t.Fatalf("run before the migration: %v, want a refusal naming paysvc migrate:\n%s", err, early.String())
	}
	var migOut strings.Builder
	if err := run(context.Background(), []string{"migrate"}, []string{"PAYSVC_MYSQL_DSN=" + mig.FormatDSN()}, &migOut); err != nil {
		t.Fatalf("migrate as %s: %v\n%s", migUser, err, migOut.String())
	}

	var logs lockedBuffer
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"run"}, env, &logs) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		if t.Failed() {
			t.Logf("daemon output:\n%s", logs.String())
		}
	}()
	testenv.Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(logs.String(), "a grant is missing; waiting") &&
			strings.Contains(logs.String(), "needs SELECT on paysvc_schema_migrations")
	}, "the daemon did not wait naming the grant")
	if testenv.QueueExists(t, w.amqpURL, listener.MainQueue) {
		t.Fatal("the daemon consumes without reading the schema's versions")
	}
	script()
	testenv.Eventually(t, 30*time.Second, func() bool { return testenv.QueueExists(t, w.amqpURL, listener.MainQueue) },
		"the daemon did not start once granted")
}

// The pruning user scripts/least-privilege.sh makes (PRUNE_PASSWORD):
// paysvc prune runs as it, its DSN from PAYSVC_MYSQL_DSN_FILE as the
// CronJob gives it, and deletes what is past its windows; it cannot read,
// change or delete a money row, nor change what it prunes.
func TestLeastPrivilegePruneUser(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	id := testenv.Name(t)[len(testenv.Name(t))-8:]
	appUser, migUser, pruneUser := "ppa_"+id, "ppm_"+id, "ppp_"+id
	const pw = "Pw-prune-0f'\"$x"
	cfg, _ := mysql.ParseDSN(dsn)
	t.Cleanup(func() {
		db.Exec("DROP USER IF EXISTS '" + appUser + "'@'%', '" + migUser + "'@'%', '" + pruneUser + "'@'%'")
	})
	cmd := exec.Command("scripts/least-privilege.sh", "mysql")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "MYSQL_DATABASE="+cfg.DBName, "APP_USER="+appUser, "MIGRATE_USER="+migUser,
		"PRUNE_USER="+pruneUser, "APP_PASSWORD="+pw, "MIGRATE_PASSWORD="+pw, "PRUNE_PASSWORD="+pw)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("least-privilege.sh mysql: %v\n%s", err, out)
	}
	if strings.Contains(string(out), pw) || !strings.Contains(string(out), pruneUser+" (paysvc prune") {
		t.Fatalf("least-privilege.sh mysql: a password printed, or no word of the pruning user:\n%s", out)
	}
	seedPrunable(t, db)

	prn := *cfg
	prn.User, prn.Passwd = pruneUser, pw
	file := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(file, []byte(prn.FormatDSN()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	if err := run(context.Background(), []string{"prune"}, []string{"PAYSVC_MYSQL_DSN_FILE=" + file}, &logs); err != nil {
		t.Fatalf("prune as %s: %v\n%s", pruneUser, err, logs.String())
	}
	if got := prunableCounts(t, db); !equalInts(got, prunedCounts) {
		t.Fatalf("after prune as %s: %v, want %v", pruneUser, got, prunedCounts)
	}
	if strings.Contains(logs.String(), pw) {
		t.Fatal("a password reached the log")
	}

	pruneDB, err := sqldb.Open(context.Background(), prn.FormatDSN(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pruneDB.Close()
	for _, q := range []string{"SELECT COUNT(*) FROM t_order", "SELECT COUNT(*) FROM t_account", "SELECT COUNT(*) FROM t_account_flow",
		"DELETE FROM t_order", "DELETE FROM t_account", "DELETE FROM t_account_flow", "UPDATE t_account SET balance = 0",
		"UPDATE t_outbox SET status = 'SENT'", "UPDATE t_dead_letter SET status = 'DISCARDED'",
		"INSERT INTO t_outbox (event_type, biz_no, payload) VALUES ('x', 'x', 'x')", "DROP TABLE t_outbox",
		"DELETE FROM t_account_opening", "DELETE FROM t_lease"} {
		if _, err := pruneDB.Exec(q); err == nil || !strings.Contains(err.Error(), "denied") {
			t.Errorf("as %s, %q: %v; want denied", pruneUser, q, err)
		}
	}
}
