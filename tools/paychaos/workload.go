package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/money"
)

// workload is what a scenario publishes and what it expects to become of it.
type workload struct {
	payable  []string // orders that must end PAID (incl. late ones)
	terminal []string // orders of the poor user: must end as dead letters
	late     map[string]order
	orders   map[string]order
	poison   [][]byte
	messages [][]byte              // every body to publish, duplicates included
	dups     int                   // duplicate copies among messages
	headers  map[string]amqp.Table // by body: headers to publish it with
}

type order struct {
	no     string
	user   int64
	amount money.Cents
}

const (
	users    = 20
	poorUser = 999
)

// poisonBodies are malformed messages of every kind; none has a usable
// order number, so each is one dead letter.
func poisonBodies(tag string) [][]byte {
	return [][]byte{
		[]byte("not json " + tag),
		[]byte(`{"orderNo":"x y ` + tag + `","userId":1,"amount":1}`),
		[]byte(`["` + tag + `"]`),
		[]byte(`{"orderNo":"` + tag + `-","userId":1,"amount":1} trailing`),
		[]byte(`{"orderNo":"` + tag + `-d","orderNo":"` + tag + `-e","userId":1,"amount":1}`),
		[]byte(`{"orderno":"` + tag + `-c","userId":1,"amount":1}`),
		[]byte(`{"orderNo":"` + tag + `-z","userId":1,"amount":0}`),
		[]byte(`{"orderNo":"` + tag + `-n","userId":-1,"amount":1.001}`),
	}
}

// newWorkload makes n orders for the rich users, a few for the poor one and
// a few created only after their payment arrives; dupShare of the orders are
// published dupCopies extra times.
func newWorkload(rng *rand.Rand, tag string, n int, dupShare float64, dupCopies int) *workload {
	wl := &workload{orders: map[string]order{}, late: map[string]order{}, poison: poisonBodies(tag)}
	add := func(o order, late bool) {
		wl.orders[o.no] = o
		if late {
			wl.late[o.no] = o
		}
		body := []byte(fmt.Sprintf(`{"orderNo":%q,"userId":%d,"amount":"%s"}`, o.no, o.user, o.amount))
		wl.messages = append(wl.messages, body)
		if rng.Float64() < dupShare {
			for range dupCopies {
				wl.messages = append(wl.messages, body)
				wl.dups++
			}
		}
	}
	for i := range n {
		o := order{no: fmt.Sprintf("%s%05d", tag, i), user: int64(rng.IntN(users) + 1), amount: money.Cents(rng.IntN(9999) + 1)}
		late := i%40 == 7
		add(o, late)
		wl.payable = append(wl.payable, o.no)
	}
	for i := range 3 {
		o := order{no: fmt.Sprintf("%sP%d", tag, i), user: poorUser, amount: 50000}
		add(o, false)
		wl.terminal = append(wl.terminal, o.no)
	}
	wl.messages = append(wl.messages, wl.poison...)
	rng.Shuffle(len(wl.messages), func(i, j int) { wl.messages[i], wl.messages[j] = wl.messages[j], wl.messages[i] })
	return wl
}

// seed writes accounts with known opening balances and the orders that exist
// before their payments.
func (w *world) seed(ctx context.Context, wl *workload) error {
	if !w.seeded {
		for u := int64(1); u <= users; u++ {
			if err := w.account(ctx, u, "1000000.00"); err != nil {
				return err
			}
		}
		if err := w.account(ctx, poorUser, "1.00"); err != nil {
			return err
		}
		w.seeded = true
	}
	for _, o := range wl.orders {
		if _, late := wl.late[o.no]; late {
			continue
		}
		if err := w.insertOrder(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

func (w *world) account(ctx context.Context, user int64, balance string) error {
	if _, err := w.db.ExecContext(ctx, "INSERT INTO t_account (user_id, balance) VALUES (?, ?)", user, balance); err != nil {
		return err
	}
	_, err := w.db.ExecContext(ctx, "INSERT INTO t_account_opening (user_id, balance, as_of) VALUES (?, ?, '2020-01-01')", user, balance)
	return err
}

func (w *world) insertOrder(ctx context.Context, o order) error {
	_, err := w.db.ExecContext(ctx, "INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, CAST(? AS DECIMAL(18,2)))", o.no, o.user, o.amount)
	return err
}

// publish sends bodies with publisher confirms from `publishers` goroutines,
// reconnecting through broker faults, until each is confirmed (or ctx ends);
// each publisher waits pace between two messages.
// A body whose confirm was lost may be sent twice: a duplicate, as a real
// producer's retry would make.
func (w *world) publish(ctx context.Context, bodies [][]byte, headers map[string]amqp.Table, publishers int, pace time.Duration) (int, error) {
	var mu sync.Mutex
	confirmed := 0
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			next := p
			for next < len(bodies) && ctx.Err() == nil {
				n, err := w.publishFrom(ctx, bodies, headers, next, publishers, pace)
				mu.Lock()
				confirmed += n
				mu.Unlock()
				next += n * publishers
				if err != nil {
					at(ctx, 500*time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	return confirmed, ctx.Err()
}

// publishFrom publishes bodies[i], bodies[i+step], ... on one connection and
// returns how many were confirmed (and routed) before an error.
func (w *world) publishFrom(ctx context.Context, bodies [][]byte, headers map[string]amqp.Table, i, step int, pace time.Duration) (int, error) {
	conn, err := broker.Dial(w.amqpURL, "paychaos", nil)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	pub := broker.NewPublisher(conn, 10*time.Second)
	defer pub.Close()
	n := 0
	for ; i < len(bodies); i += step {
		if err := pub.Publish(ctx, "", listener.MainQueue,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: bodies[i],
				Headers: headers[string(bodies[i])]}); err != nil {
			return n, err
		}
		n++
		if pace > 0 && !at(ctx, pace) {
			return n, ctx.Err()
		}
	}
	return n, nil
}
