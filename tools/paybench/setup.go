package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/scratch"
)

// bed is one measurement's isolated database, vhost and key prefix.
type bed struct {
	*scratch.Database // its Name is the vhost's too
	amqpURL           string
	rdb               *redis.Client
	prefix            string
}

var delays = []time.Duration{30 * time.Second, time.Minute, 5 * time.Minute}

func newBed(ctx context.Context, o *options, name string) (*bed, error) {
	id := fmt.Sprintf("bench_%s_%x", name, rand.Uint32())
	d, err := scratch.NewDatabase(ctx, o.mysqlDSN, id, 8)
	if err != nil {
		return nil, err
	}
	b := &bed{Database: d, prefix: id + ":"}
	if b.amqpURL, err = scratch.NewVhost(o.amqpURL, b.Name, "guest"); err != nil {
		b.close()
		return nil, err
	}
	b.rdb = redis.NewClient(&redis.Options{Addr: o.redisAddr, PoolSize: 128})
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		b.close()
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.close()
		return nil, err
	}
	return b, listener.Declare(ch, delays)
}

func (b *bed) close() {
	b.Database.Close()
	scratch.DeleteVhost(b.Name)
	if b.rdb != nil {
		scratch.DeleteKeys(context.Background(), b.rdb, b.prefix)
		b.rdb.Close()
	}
}

// payment is one order and its message body.
type payment struct {
	orderNo string
	user    int64
	amount  money.Cents
}

func (p payment) payment() order.Payment {
	return order.Payment{OrderNo: p.orderNo, UserID: p.user, Amount: p.amount}
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
		if _, err := b.DB.ExecContext(ctx, sb.String()); err != nil {
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
		if _, err := b.DB.ExecContext(ctx, sb.String()); err != nil {
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
