package listener_test

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/testenv"
)

// outage is how long the dependencies stay down in TestOutagesSpendNoDeliveryCount.
const outage = 2 * time.Minute

// On a quorum main queue with a delivery limit of 3, every return of a
// message counts. Long and flapping outages of Redis (CLOSED) and MySQL
// must cost nothing: the messages are held through the outage, none is
// returned, none reaches the terminal queue, every payment applies once.
func TestOutagesSpendNoDeliveryCount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// publish(k) publishes the next k of the test's 30 payments
		// (on the test's goroutine: a failed publish fails the test).
		fault func(e *env, redis, mysql *testenv.Proxy, publish func(k int))
	}{
		{"redis-down-2m", func(e *env, redis, _ *testenv.Proxy, publish func(int)) {
			redis.Down()
			publish(30)
			time.Sleep(outage)
			redis.Up()
		}},
		{"mysql-down-2m", func(e *env, _, mysql *testenv.Proxy, publish func(int)) {
			mysql.Down()
			publish(30)
			time.Sleep(outage)
			mysql.Up()
		}},
		{"redis-flaps-10x", func(e *env, redis, _ *testenv.Proxy, publish func(int)) {
			// Three payments arrive in each outage.
			for range 10 {
				redis.Down()
				publish(3)
				time.Sleep(time.Second)
				redis.Up()
				time.Sleep(time.Second)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			redisProxy := testenv.NewProxy(t, e.redisAddr)
			mysqlProxy, dsn := testenv.MySQLProxy(t, e.dsn)
			e.seedAccount(91, "100.00")
			const n = 30
			msgs := e.seedOrders("OUT%02d", 91, n)
			c := e.start(redisProxy.Addr(), dsn, func(cfg *setup) {
				cfg.MainQueueType, cfg.DeliveryLimit = "quorum", 3
			})
			testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
			tc.fault(e, redisProxy, mysqlProxy, func(k int) {
				for range k {
					e.publish(msgs[0])
					msgs = msgs[1:]
					time.Sleep(50 * time.Millisecond)
				}
			})
			testenv.Eventually(t, 60*time.Second, func() bool { return e.totalFlows() == n && e.depth(listener.MainQueue) == 0 },
				"not every payment applied after the outage")
			if e.depth(listener.TerminalQueue) != 0 || e.balance(91) != 10000-n*100 {
				t.Fatalf("terminal queue %d, balance %s: a payable payment was dead-lettered or charged twice",
					e.depth(listener.TerminalQueue), e.balance(91))
			}
			for i := range n {
				if no := fmt.Sprintf("OUT%02d", i); e.status(no) != order.Paid || e.flows(no) != 1 {
					t.Fatalf("%s: %s with %d flows", no, e.status(no), e.flows(no))
				}
			}
			if r := e.results(); r["TERMINAL"] != 0 || r["RETRY"] != 0 {
				t.Fatalf("outcomes %v: an outage spent attempts", r)
			}
		})
	}
}

// A message held through an outage when its consumer stops goes back to
// the queue once: the consumer is cancelled before the holding workers let
// go, so their nacks cannot bring it straight back to this consumer, to be
// returned a second time at the session's end (on a quorum queue each
// return can count toward the delivery limit). The race this ordering
// closes is forced here: the proxy holds the consumer's basic.cancel for
// two seconds and lets what it sends meanwhile overtake it. With the
// workers let go first, their nacks reach the broker before the cancel,
// and the broker delivers those messages to this consumer again; with the
// cancel first, it delivers each message to it once. The deliveries are
// what tells: RabbitMQ 3.10 dead-letters none of the messages returned
// twice at a delivery limit of 2, and the terminal queue stays empty
// either way.
func TestStopWhileHoldingReturnsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	redisProxy := testenv.NewProxy(t, e.redisAddr)
	amqpProxy, proxied := testenv.AMQPProxy(t, e.amqpURL)
	var mu sync.Mutex
	fromBroker := map[int]*testenv.AMQPStream{} // by proxied connection
	delivered := 0                              // basic.deliver frames to the consumer
	amqpProxy.Watch(func(conn int, toServer bool, chunk []byte) {
		if toServer {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if fromBroker[conn] == nil {
			fromBroker[conn] = &testenv.AMQPStream{}
		}
		for _, m := range fromBroker[conn].Feed(chunk) {
			if m == testenv.BasicDeliver {
				delivered++
			}
		}
	})
	e.seedAccount(92, "100.00")
	const n = 8
	for i := range n {
		e.seedOrder(fmt.Sprintf("HS%d", i), 92, "1.00")
	}
	quorum := func(cfg *setup) { cfg.MainQueueType, cfg.DeliveryLimit = "quorum", 2 }
	c := e.start(redisProxy.Addr(), e.dsn, quorum, func(cfg *setup) { cfg.URL = proxied })
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
	redisProxy.Down()
	for i := range n {
		e.publish(body(fmt.Sprintf("HS%d", i), 92, "1.00"))
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.Held(t, e.amqpURL, listener.MainQueue) == n },
		"the payments were not held through the Redis outage")
	held := holdCancels(amqpProxy)
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	if h := held.Load(); h != 1 {
		t.Fatalf("the proxy held %d basic.cancel frames, want the consumer's 1: the test proves nothing", h)
	}
	mu.Lock()
	for conn, s := range fromBroker {
		if s.Lost() {
			t.Fatalf("connection %d: the broker's frames could not be followed", conn)
		}
	}
	if delivered != n {
		t.Fatalf("the broker made %d deliveries to the stopped consumer, want %d: a held message was let go "+
			"before the consumer's cancel and came straight back to it", delivered, n)
	}
	mu.Unlock()
	redisProxy.Up()
	e.start(redisProxy.Addr(), e.dsn, quorum)
	for end := time.Now().Add(30 * time.Second); e.totalFlows() < n; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after 30s, %d of %d held payments applied after the restart (main queue %d, terminal %d)",
				e.totalFlows(), n, e.depth(listener.MainQueue), e.depth(listener.TerminalQueue))
		}
	}
	if d := e.depth(listener.TerminalQueue); d != 0 {
		t.Fatalf("%d payments dead-lettered: returned twice by one stop", d)
	}
}

// At a session's end the consumer is cancelled, and the broker has said
// so, before the workers holding messages through an outage let go: their
// nacks go out after the basic.cancel has reached the broker, even when
// the cancel is slow to get there (held two seconds by the proxy, which lets
// what the consumer sends meanwhile overtake it).
func TestStopIntakeCancelsBeforeReleasing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	redisProxy := testenv.NewProxy(t, e.redisAddr)
	amqpProxy, proxied := testenv.AMQPProxy(t, e.amqpURL)
	var mu sync.Mutex
	fromConsumer := map[int]*testenv.AMQPStream{}
	var sent []testenv.AMQPMethod // the cancels and nacks, as they reach the broker
	amqpProxy.Watch(func(conn int, toServer bool, chunk []byte) {
		if !toServer {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if fromConsumer[conn] == nil {
			fromConsumer[conn] = &testenv.AMQPStream{}
		}
		for _, m := range fromConsumer[conn].Feed(chunk) {
			if m == testenv.BasicCancel || m == testenv.BasicNack {
				sent = append(sent, m)
			}
		}
	})
	e.seedAccount(94, "100.00")
	e.seedOrder("SI1", 94, "1.00")
	c := e.start(redisProxy.Addr(), e.dsn, func(cfg *setup) { cfg.URL = proxied })
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
	redisProxy.Down()
	e.publish(body("SI1", 94, "1.00"))
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.Held(t, e.amqpURL, listener.MainQueue) == 1 },
		"the payment was not held through the Redis outage")
	held := holdCancels(amqpProxy)
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	if h := held.Load(); h != 1 {
		t.Fatalf("the proxy held %d basic.cancel frames, want the consumer's 1: the test proves nothing", h)
	}
	// The nack has gone out; the broker requeues the message as it
	// processes it, a moment later.
	testenv.Eventually(t, 10*time.Second, func() bool { return e.depth(listener.MainQueue) == 1 },
		"the held message not back in the queue")
	mu.Lock()
	defer mu.Unlock()
	for conn, s := range fromConsumer {
		if s.Lost() {
			t.Fatalf("connection %d: the consumer's frames could not be followed", conn)
		}
	}
	want := []testenv.AMQPMethod{testenv.BasicCancel, testenv.BasicNack} // the held worker's nack
	if !slices.Equal(sent, want) {
		t.Fatalf("cancels and nacks in the order the broker got them: %v, want %v (the cancel first)", sent, want)
	}
}

// holdCancels has proxy hold each basic.cancel the client sends for
// cancelHeld, letting what the client sends next overtake it, and returns
// the count of those held.
func holdCancels(proxy *testenv.Proxy) *atomic.Int32 {
	var held atomic.Int32
	split := testenv.HoldAMQP(testenv.BasicCancel)
	proxy.HoldWhen(func(b []byte) ([]byte, []byte) {
		h, rest := split(b)
		if h != nil {
			held.Add(1)
		}
		return h, rest
	}, cancelHeld)
	return &held
}

// cancelHeld is how long holdCancels holds a cancel: well past the time
// the held workers take to let go (at once: they wait on the session), and
// well within the consumer's bound on the cancel's reply (5 s).
const cancelHeld = 2 * time.Second

// At a stop, the messages prefetched behind a busy worker go back to the
// queue with one nack before the channel closes (on RabbitMQ 4.x the
// close would count each toward the delivery limit, the nack does not),
// and the next consumer pays each once.
func TestStopReturnsPrefetchedWithANack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	redisProxy := testenv.NewProxy(t, e.redisAddr)
	e.seedAccount(93, "100.00")
	const n = 6
	bodies := e.seedOrders("PF%d", 93, n)
	one := func(cfg *setup) { cfg.Workers, cfg.Prefetch = 1, 10 }
	c := e.start(redisProxy.Addr(), e.dsn, one)
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
	redisProxy.Down() // the one worker holds the first payment through it
	e.publish(bodies...)
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.Held(t, e.amqpURL, listener.MainQueue) == n },
		"the payments were never prefetched")
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	var returned []any
	for _, entry := range e.logs.FilterMessage("prefetched messages no worker started returned to the queue").All() {
		returned = append(returned, entry.ContextMap()["messages"])
		if err, ok := entry.ContextMap()["error"]; ok {
			t.Fatalf("the broker refused the nack: %v", err)
		}
	}
	if len(returned) != 1 || fmt.Sprint(returned[0]) != fmt.Sprint(n-1) {
		t.Fatalf("returned by a nack at the stop: %v, want one return of %d messages", returned, n-1)
	}
	redisProxy.Up()
	e.start(redisProxy.Addr(), e.dsn)
	e.waitResults(20*time.Second, func(map[string]int) bool { return e.totalFlows() == n }, "the returned payments were not paid")
	for i := range n {
		if f := e.flows(fmt.Sprintf("PF%d", i)); f != 1 {
			t.Fatalf("PF%d has %d flows, want 1", i, f)
		}
	}
}
