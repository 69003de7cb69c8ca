// Package scratch makes and removes throwaway resources on the real
// servers: a migrated database, a RabbitMQ vhost, the keys under a Redis
// prefix. It works for any program, and its caller decides when they go:
// the benchmark and the fault-injection suite call it directly, and
// internal/testenv wraps it for tests, bound to a testing.TB.
package scratch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/migrations"
)

// Database is a fresh, migrated database.
type Database struct {
	Name  string
	DSN   string
	DB    *sqlx.DB
	admin *sqlx.DB
}

// NewDatabase creates database name on the server of rootDSN (a DSN without
// database), applies the migrations, and opens a pool of maxOpen.
func NewDatabase(ctx context.Context, rootDSN, name string, maxOpen int) (*Database, error) {
	cfg, err := mysql.ParseDSN(rootDSN)
	if err != nil {
		return nil, err
	}
	d := &Database{Name: name}
	if d.admin, err = sqldb.Open(ctx, cfg.FormatDSN(), 2); err != nil {
		return nil, err
	}
	if _, err := d.admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		d.admin.Close()
		return nil, err
	}
	cfg.DBName = name
	d.DSN = cfg.FormatDSN()
	if d.DB, err = sqldb.Open(ctx, d.DSN, maxOpen); err != nil {
		d.Close()
		return nil, err
	}
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err == nil {
		_, err = sqldb.Migrate(ctx, d.DB, ms)
	}
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("migrate %s: %w", name, err)
	}
	return d, nil
}

// Admin is a connection without a database, for server-wide statements.
func (d *Database) Admin() *sqlx.DB { return d.admin }

// Close drops the database and closes the pools.
func (d *Database) Close() {
	if d.DB != nil {
		d.DB.Close()
	}
	if d.admin != nil {
		d.admin.Exec("DROP DATABASE IF EXISTS `" + d.Name + "`")
		d.admin.Close()
	}
}

// RabbitmqCtl runs rabbitmqctl (through sudo -n when not root: Debian's runs
// only as root or rabbitmq).
func RabbitmqCtl(args ...string) error {
	_, err := RabbitmqCtlOutput(args...)
	return err
}

// RabbitmqCtlOutput runs rabbitmqctl -q and returns what it printed.
func RabbitmqCtlOutput(args ...string) (string, error) {
	argv := append([]string{"rabbitmqctl", "-q"}, args...)
	if os.Geteuid() != 0 {
		argv = append([]string{"sudo", "-n"}, argv...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl %s: %v: %s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out), nil
}

// NewVhost creates vhost with every permission for user and returns baseURL
// (amqp://user:pass@host:port/) pointed at it.
func NewVhost(baseURL, vhost, user string) (string, error) {
	if err := RabbitmqCtl("add_vhost", vhost); err != nil {
		return "", err
	}
	if err := RabbitmqCtl("set_permissions", "-p", vhost, user, ".*", ".*", ".*"); err != nil {
		return "", err
	}
	return strings.TrimSuffix(baseURL, "/") + "/" + vhost, nil
}

// DeleteVhost deletes a vhost and everything in it.
func DeleteVhost(vhost string) error { return RabbitmqCtl("delete_vhost", vhost) }

// DeleteKeys deletes every key under prefix.
func DeleteKeys(ctx context.Context, rdb redis.UniversalClient, prefix string) {
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 500 {
			rdb.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
}
