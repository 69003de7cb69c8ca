package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/migrations"
)

// bed is one measurement's isolated database, vhost and key prefix.
type bed struct {
	name    string
	dsn     string
	db      *sqlx.DB
	admin   *sqlx.DB
	dbName  string
	vhost   string
	amqpURL string
	rdb     *redis.Client
	prefix  string
}

var delays = []time.Duration{30 * time.Second, time.Minute, 5 * time.Minute}

func newBed(ctx context.Context, o *options, name string) (*bed, error) {
	b := &bed{name: name}
	id := fmt.Sprintf("bench_%s_%x", name, rand.Uint32())
	b.dbName, b.vhost, b.prefix = id, id, id+":"
	cfg, err := mysql.ParseDSN(o.mysqlDSN)
	if err != nil {
		return nil, err
	}
	if b.admin, err = sqldb.Open(ctx, cfg.FormatDSN(), 2); err != nil {
		return nil, err
	}
	if _, err := b.admin.ExecContext(ctx, "CREATE DATABASE `"+b.dbName+"`"); err != nil {
		return nil, err
	}
	cfg.DBName = b.dbName
	b.dsn = cfg.FormatDSN()
	if b.db, err = sqldb.Open(ctx, b.dsn, 8); err != nil {
		return nil, err
	}
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		return nil, err
	}
	if _, err := sqldb.Migrate(ctx, b.db, ms); err != nil {
		return nil, err
	}
	if err := rabbitmqctl("add_vhost", b.vhost); err != nil {
		return nil, err
	}
	if err := rabbitmqctl("set_permissions", "-p", b.vhost, "guest", ".*", ".*", ".*"); err != nil {
		return nil, err
	}
	b.amqpURL = strings.TrimSuffix(o.amqpURL, "/") + "/" + b.vhost
	b.rdb = redis.NewClient(&redis.Options{Addr: o.redisAddr, PoolSize: 128})
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	return b, listener.Declare(ch, delays)
}

func (b *bed) close() {
	if b.db != nil {
		b.db.Close()
	}
	if b.admin != nil {
		b.admin.Exec("DROP DATABASE IF EXISTS `" + b.dbName + "`")
		b.admin.Close()
	}
	rabbitmqctl("delete_vhost", b.vhost)
	if b.rdb != nil {
		ctx := context.Background()
		iter := b.rdb.Scan(ctx, 0, b.prefix+"*", 10000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 1000 {
				b.rdb.Del(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			b.rdb.Del(ctx, keys...)
		}
		b.rdb.Close()
	}
}

func rabbitmqctl(args ...string) error {
	argv := append([]string{"rabbitmqctl", "-q"}, args...)
	if os.Geteuid() != 0 {
		argv = append([]string{"sudo", "-n"}, argv...)
	}
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// payment is one order and its message body.
type payment struct {
	orderNo string
	user    int64
	amount  money.Cents
}

func (p payment) body() []byte {
	return []byte(fmt.Sprintf(`{"orderNo":%q,"userId":%d,"amount":"%s"}`, p.orderNo, p.user, p.amount))
}

// seed creates users accounts (rich enough for everything) and n orders;
// hot > 0 puts that share of the orders on the first hotUsers users.
func (b *bed) seed(ctx context.Context, n, users int, hot float64, hotUsers int) ([]payment, error) {
	for lo := 1; lo <= users; lo += 1000 {
		var sb strings.Builder
		sb.WriteString("INSERT INTO t_account (user_id, balance) VALUES ")
		for u := lo; u < lo+1000 && u <= users; u++ {
			if u > lo {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, "(%d, 100000000.00)", u)
		}
		if _, err := b.db.ExecContext(ctx, sb.String()); err != nil {
			return nil, err
		}
	}
	pays := make([]payment, n)
	for i := range pays {
		u := int64(rand.IntN(users) + 1)
		if hot > 0 && rand.Float64() < hot {
			u = int64(rand.IntN(hotUsers) + 1)
		}
		pays[i] = payment{orderNo: fmt.Sprintf("B%08d", i), user: u, amount: money.Cents(rand.IntN(99999) + 1)}
	}
	for lo := 0; lo < n; lo += 1000 {
		var sb strings.Builder
		sb.WriteString("INSERT INTO t_order (order_no, user_id, amount) VALUES ")
		for i := lo; i < lo+1000 && i < n; i++ {
			if i > lo {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, "('%s', %d, %s)", pays[i].orderNo, pays[i].user, pays[i].amount)
		}
		if _, err := b.db.ExecContext(ctx, sb.String()); err != nil {
			return nil, err
		}
	}
	return pays, nil
}

// preload publishes bodies persistent with confirms, pipelined.
func (b *bed) preload(bodies [][]byte) error {
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	const window = 500
	var pending []*amqp.DeferredConfirmation
	for _, body := range bodies {
		c, err := ch.PublishWithDeferredConfirm("", listener.MainQueue, false, false,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			return err
		}
		pending = append(pending, c)
		if len(pending) == window {
			for _, p := range pending {
				if !p.Wait() {
					return fmt.Errorf("publish nacked")
				}
			}
			pending = pending[:0]
		}
	}
	for _, p := range pending {
		if !p.Wait() {
			return fmt.Errorf("publish nacked")
		}
	}
	return nil
}

func (b *bed) depth() int {
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		return -1
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return -1
	}
	q, err := ch.QueueDeclarePassive(listener.MainQueue, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return q.Messages
}
