package producer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/testenv"
	"github.com/paysvc/paysvc/internal/tracing"
	"github.com/paysvc/paysvc/pkg/producer"
)

// declare declares paysvc's topology in the vhost of url and waits until
// the quorum main queue has a leader (until then it nacks).
func declare(t *testing.T, url string) {
	t.Helper()
	if err := declareTopology(url); err != nil {
		t.Fatal(err)
	}
	testenv.Publish(t, url, listener.MainQueue, []byte(`{}`))
	if n := len(testenv.GetAll(t, url, listener.MainQueue)); n != 1 {
		t.Fatalf("probe: %d messages", n)
	}
}

// filler is what capQueue leaves in the main queue.
const filler = "filler"

// capQueue caps the main queue at 0 messages, reject-publish, and waits
// until the broker refuses a publish: a quorum queue applies the policy
// a moment later, and may take one message first.
func capQueue(t *testing.T, url string) {
	t.Helper()
	testenv.SetPolicy(t, url, "cap", `^q\.pay\.success$`, `{"max-length":0,"overflow":"reject-publish"}`)
	if !testenv.Nacked(t, url, listener.MainQueue, []byte(filler), 15*time.Second) {
		t.Fatal("the broker never refused a publish to the capped queue")
	}
}

func payments(prefix string, n int) []producer.Payment {
	out := make([]producer.Payment, n)
	for i := range out {
		out[i] = producer.Payment{OrderNo: fmt.Sprintf("%s%05d", prefix, i), UserID: int64(1 + i), Amount: "1.00"}
	}
	return out
}

func newProducer(t *testing.T, cfg producer.Config) *producer.Producer {
	t.Helper()
	if cfg.Backoff == 0 {
		cfg.Backoff = 20 * time.Millisecond
	}
	p, err := producer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// queued counts messages by order number, checking each is a payment as
// the contract says.
func queued(t *testing.T, ds []amqp.Delivery) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for _, d := range ds {
		if string(d.Body) == filler {
			continue
		}
		p, err := listener.DecodePayment(d.Body)
		if err != nil {
			t.Fatalf("queued %s: %v", d.Body, err)
		}
		seen[p.OrderNo]++
	}
	return seen
}

// outcomes takes the main queue's messages and checks that every payment
// got exactly one outcome, that every confirmed one is in the queue (at
// least once; exactly once when exact), and that no failed one is there
// unless its outcome is unknown. It returns the confirmed and the failed
// count.
func outcomes(t *testing.T, url string, pays []producer.Payment, errs []error, exact bool) (confirmed, failed int) {
	t.Helper()
	return outcomesOf(t, testenv.GetAll(t, url, listener.MainQueue), pays, errs, exact)
}

func outcomesOf(t *testing.T, ds []amqp.Delivery, pays []producer.Payment, errs []error, exact bool) (confirmed, failed int) {
	t.Helper()
	if len(errs) != len(pays) {
		t.Fatalf("%d outcomes for %d payments", len(errs), len(pays))
	}
	seen := queued(t, ds)
	for i, p := range pays {
		n := seen[p.OrderNo]
		delete(seen, p.OrderNo)
		switch {
		case errs[i] == nil && n == 0:
			t.Errorf("%s confirmed, not in the queue: lost", p.OrderNo)
		case errs[i] == nil && exact && n != 1:
			t.Errorf("%s confirmed, %d times in the queue", p.OrderNo, n)
		case errs[i] != nil && n > 0 && !errors.Is(errs[i], producer.ErrUnconfirmed):
			t.Errorf("%s reported %v, yet %d times in the queue", p.OrderNo, errs[i], n)
		}
		if errs[i] == nil {
			confirmed++
		} else {
			failed++
		}
	}
	if len(seen) > 0 {
		t.Errorf("messages nobody published: %v", seen)
	}
	return confirmed, failed
}

// Each payment goes out persistent, as JSON, with a traceparent (the
// caller's, or a new one), a timestamp and a message id of its own; more
// than one confirm window's worth are all confirmed, each once.
func TestPublishConfirmsEachPaymentOnce(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	declare(t, url)
	p := newProducer(t, producer.Config{URLs: []string{url}})
	pays := payments("OK", 600)
	parent := producer.NewTraceparent()
	pays[0].Traceparent = parent
	before := time.Now().Truncate(time.Second)
	errs := p.PublishBatch(context.Background(), pays)
	ds := testenv.GetAll(t, url, listener.MainQueue)
	if c, f := outcomesOf(t, ds, pays, errs, true); c != len(pays) || f != 0 {
		t.Fatalf("%d confirmed, %d failed: %v", c, f, errors.Join(errs...))
	}
	ids := map[string]bool{}
	for i, d := range ds {
		tp, _ := d.Headers["traceparent"].(string)
		if _, ok := tracing.Parse(tp); !ok {
			t.Fatalf("traceparent %q", tp)
		}
		if i == 0 && tp != parent {
			t.Errorf("traceparent %q, the caller gave %q", tp, parent)
		}
		if d.DeliveryMode != amqp.Persistent || d.ContentType != "application/json" || ids[d.MessageId] || d.MessageId == "" ||
			d.Timestamp.Before(before) || d.Timestamp.After(time.Now()) {
			t.Fatalf("message %d: mode %d, type %q, id %q (seen %v), timestamp %s", i, d.DeliveryMode, d.ContentType, d.MessageId, ids[d.MessageId], d.Timestamp)
		}
		ids[d.MessageId] = true
	}
}

// A queue at its length limit nacks: the payments it refused are
// published again, and reported ErrNacked when it never takes them.
// (A quorum queue's limit is approximate: a burst beyond it may be taken
// before it starts refusing. A limit of 0 refuses every message.)
func TestNackedPaymentsAreRetriedThenReported(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	declare(t, url)
	capQueue(t, url)
	proxy, purl := testenv.AMQPProxy(t, url)
	var nacks atomic.Int32
	proxy.Watch(func(_ int, toServer bool, chunk []byte) {
		if !toServer {
			nacks.Add(int32(countMethod(chunk, testenv.BasicNack)))
		}
	})
	p := newProducer(t, producer.Config{URLs: []string{purl}, Attempts: 3})
	pays := payments("NK", 12)
	errs := p.PublishBatch(context.Background(), pays)
	for i, err := range errs {
		if !errors.Is(err, producer.ErrNacked) {
			t.Errorf("payment %d: %v, want ErrNacked", i, err)
		}
	}
	if n := nacks.Load(); n != 3*12 {
		t.Errorf("the broker sent %d nacks, want one per payment and attempt: %d", n, 3*12)
	}
	outcomes(t, url, pays, errs, true)
}

// Nacked payments go out once the queue takes them again.
func TestNackedPaymentsGoOutWhenTheQueueTakesThem(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	declare(t, url)
	capQueue(t, url)
	proxy, purl := testenv.AMQPProxy(t, url)
	nacked := seen(proxy, testenv.BasicNack)
	p := newProducer(t, producer.Config{URLs: []string{purl}, Attempts: 100, Backoff: 50 * time.Millisecond})
	pays := payments("NR", 50)
	errs := publishing(t, p, pays, func() {
		await(t, nacked, "a nack")
		testenv.ClearPolicy(t, url, "cap")
	})
	if c, _ := outcomes(t, url, pays, errs, true); c != len(pays) {
		t.Fatalf("%d of %d confirmed: %v", c, len(pays), errors.Join(errs...))
	}
}

// With no queue to take them (q.pay.success not declared yet, or
// deleted), mandatory payments come back: they are published again, and
// reported ErrReturned when no queue appears.
func TestReturnedPaymentsAreRetriedThenReported(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	p := newProducer(t, producer.Config{URLs: []string{url}, Attempts: 2})
	errs := p.PublishBatch(context.Background(), payments("RT", 10))
	for i, err := range errs {
		if !errors.Is(err, producer.ErrReturned) {
			t.Errorf("payment %d: %v, want ErrReturned", i, err)
		}
	}
}

// Returned payments go out once the queue exists. The queue appears in
// the middle of a batch: those of its payments routed are confirmed, and
// only once, and the returned ones go out again (a return is told apart by
// its message id).
func TestReturnedPaymentsGoOutOnceTheQueueExists(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	proxy, purl := testenv.AMQPProxy(t, url)
	var sent, returns atomic.Int32
	var declared atomic.Bool
	declaredErr := make(chan error, 1)
	proxy.Watch(func(_ int, toServer bool, chunk []byte) {
		if !toServer {
			returns.Add(int32(countMethod(chunk, basicReturn)))
			return
		}
		// The chunk carrying the 101st publish waits here until the
		// queue exists: the 100 before it find none.
		if sent.Add(int32(countMethod(chunk, basicPublish))) > 100 && declared.CompareAndSwap(false, true) {
			declaredErr <- declareTopology(url)
		}
	})
	p := newProducer(t, producer.Config{URLs: []string{purl}, Attempts: 100, Backoff: 50 * time.Millisecond})
	pays := payments("RO", 200)
	errs := p.PublishBatch(context.Background(), pays)
	if err := <-declaredErr; err != nil {
		t.Fatal(err)
	}
	if n := returns.Load(); n == 0 || n >= int32(len(pays)) {
		t.Fatalf("%d returns of %d payments: want some returned, some routed in the first attempt", n, len(pays))
	}
	if c, _ := outcomes(t, url, pays, errs, true); c != len(pays) {
		t.Fatalf("%d of %d confirmed: %v", c, len(pays), errors.Join(errs...))
	}
}

// declareTopology declares paysvc's topology, as paysvc does at start.
func declareTopology(url string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return listener.Declare(ch, []time.Duration{time.Second})
}

// A connection lost in the middle of a batch: what was confirmed stays
// confirmed, the rest is published again on a new connection; every
// payment is confirmed, and in the queue (some twice: their confirm was
// lost with the connection).
func TestConnectionLostMidBatch(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	declare(t, url)
	proxy, purl := testenv.AMQPProxy(t, url)
	var sent atomic.Int32
	var cut atomic.Bool
	proxy.CutWhen(func(chunk []byte) bool {
		return sent.Add(int32(countMethod(chunk, basicPublish))) > 300 && cut.CompareAndSwap(false, true)
	})
	p := newProducer(t, producer.Config{URLs: []string{purl}})
	pays := payments("CL", 1000)
	errs := p.PublishBatch(context.Background(), pays)
	if !cut.Load() {
		t.Fatal("the connection was never cut: the test tests nothing")
	}
	if c, _ := outcomes(t, url, pays, errs, false); c != len(pays) {
		t.Fatalf("%d of %d confirmed: %v", c, len(pays), errors.Join(errs...))
	}
}

// The broker gone for good in the middle of a batch: each payment is
// either confirmed (and in the queue) or reported failed; none is
// confirmed and missing.
func TestBrokerGoneMidBatchReportsTheRest(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	declare(t, url)
	proxy, purl := testenv.AMQPProxy(t, url)
	var sent atomic.Int32
	var down atomic.Bool
	proxy.Watch(func(_ int, toServer bool, chunk []byte) {
		if toServer && sent.Add(int32(countMethod(chunk, basicPublish))) > 300 && down.CompareAndSwap(false, true) {
			go proxy.Down()
		}
	})
	p := newProducer(t, producer.Config{URLs: []string{purl}, Attempts: 3})
	pays := payments("GD", 1000)
	errs := p.PublishBatch(context.Background(), pays)
	c, f := outcomes(t, url, pays, errs, false)
	if c == 0 || f == 0 {
		t.Fatalf("%d confirmed, %d failed: want some of each", c, f)
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, producer.ErrUnconfirmed) && !errors.Is(err, producer.ErrNoConnection) {
			t.Fatalf("%v, want ErrUnconfirmed or ErrNoConnection", err)
		}
	}
}

// With several URLs, a dead node is skipped, and a node lost mid-batch is
// replaced by the next.
func TestFailsOverToTheNextURL(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	declare(t, url)
	dead := deadURL(t, url)
	a, aurl := testenv.AMQPProxy(t, url)
	_, burl := testenv.AMQPProxy(t, url)
	var sent atomic.Int32
	var down atomic.Bool
	a.Watch(func(_ int, toServer bool, chunk []byte) {
		if toServer && sent.Add(int32(countMethod(chunk, basicPublish))) > 100 && down.CompareAndSwap(false, true) {
			go a.Down()
		}
	})
	p := newProducer(t, producer.Config{URLs: []string{dead, aurl, burl}})
	pays := payments("FO", 500)
	errs := p.PublishBatch(context.Background(), pays)
	if !down.Load() {
		t.Fatal("node a was never taken down: the test tests nothing")
	}
	if c, _ := outcomes(t, url, pays, errs, false); c != len(pays) {
		t.Fatalf("%d of %d confirmed: %v", c, len(pays), errors.Join(errs...))
	}
}

// A payment outside the contract is refused before anything is sent.
func TestInvalidPaymentIsNotSent(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	declare(t, url)
	p := newProducer(t, producer.Config{URLs: []string{url}})
	pays := []producer.Payment{
		{OrderNo: "IV1", UserID: 1, Amount: "1.005"},
		{OrderNo: "IV2", UserID: 1, Amount: "1.05"},
	}
	errs := p.PublishBatch(context.Background(), pays)
	if !errors.Is(errs[0], producer.ErrInvalid) || errs[1] != nil {
		t.Fatalf("outcomes %v, want ErrInvalid and nil", errs)
	}
	if c, f := outcomes(t, url, pays, errs, true); c != 1 || f != 1 {
		t.Fatalf("%d confirmed, %d failed", c, f)
	}
}

// Payments published from many goroutines at once share the producer's
// channel, each confirmed once.
func TestConcurrentPublishers(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	declare(t, url)
	p := newProducer(t, producer.Config{URLs: []string{url}})
	var all []producer.Payment
	errs := make([][]error, 8)
	done := make(chan int)
	for g := range errs {
		pays := payments(fmt.Sprintf("G%d-", g), 40)
		all = append(all, pays...)
		go func() {
			errs[g] = make([]error, len(pays))
			for i, pay := range pays[:20] { // one at a time
				errs[g][i] = p.Publish(context.Background(), pay)
			}
			copy(errs[g][20:], p.PublishBatch(context.Background(), pays[20:]))
			done <- g
		}()
	}
	for range errs {
		<-done
	}
	var flat []error
	for _, e := range errs {
		flat = append(flat, e...)
	}
	if c, _ := outcomes(t, url, all, flat, true); c != len(all) {
		t.Fatalf("%d of %d confirmed: %v", c, len(all), errors.Join(flat...))
	}
}

func TestConfigNeedsURLs(t *testing.T) {
	for _, urls := range [][]string{nil, {""}, {"amqp://a/", ""}} {
		if _, err := producer.New(producer.Config{URLs: urls}); err == nil {
			t.Errorf("New with URLs %q: no error", urls)
		}
	}
}

// During a resource alarm (on a node of the test's own: alarms are
// node-wide) the broker reads nothing more from a publishing connection:
// the attempts run out of time and every payment is reported, none hangs.
// Once the alarm clears, publishing them again confirms each; those sent
// during the alarm may be stored too (read once it cleared).
func TestResourceAlarmReportsAndRecovers(t *testing.T) {
	t.Parallel()
	node, _, addr := testenv.RabbitNode(t, "", nil)
	url := "amqp://guest:guest@" + addr + "/"
	declare(t, url)
	clearAlarm := testenv.MemoryAlarm(t, node)
	p := newProducer(t, producer.Config{URLs: []string{url}, Attempts: 2, Timeout: 2 * time.Second})
	pays := payments("AL", 50)
	start := time.Now()
	errs := p.PublishBatch(context.Background(), pays)
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("reported after %s", d)
	}
	for i, err := range errs {
		if !errors.Is(err, producer.ErrUnconfirmed) && !errors.Is(err, producer.ErrNoConnection) {
			t.Fatalf("payment %d during the alarm: %v, want ErrUnconfirmed or ErrNoConnection", i, err)
		}
	}
	clearAlarm()
	errs = p.PublishBatch(context.Background(), pays)
	if c, _ := outcomes(t, url, pays, errs, false); c != len(pays) {
		t.Fatalf("%d of %d confirmed after the alarm: %v", c, len(pays), errors.Join(errs...))
	}
}

// A cancelled context ends the retries: the payments are reported, with
// the cause.
func TestContextEndsTheRetries(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	p := newProducer(t, producer.Config{URLs: []string{url}, Attempts: 1000, Backoff: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.Publish(ctx, producer.Payment{OrderNo: "CX1", UserID: 1, Amount: "1.00"})
	if !errors.Is(err, producer.ErrReturned) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v, want ErrReturned and the deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("returned after %s", d)
	}
}

// publishing publishes pays in the background while during runs, and
// returns their outcomes.
func publishing(t *testing.T, p *producer.Producer, pays []producer.Payment, during func()) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() { done <- p.PublishBatch(context.Background(), pays) }()
	during()
	select {
	case errs := <-done:
		return errs
	case <-time.After(60 * time.Second):
		t.Fatal("PublishBatch did not return")
		return nil
	}
}

// seen reports on the channel it returns when the broker first sends the
// client a method frame of m through proxy.
func seen(proxy *testenv.Proxy, m testenv.AMQPMethod) <-chan struct{} {
	c := make(chan struct{}, 1)
	proxy.Watch(func(_ int, toServer bool, chunk []byte) {
		if !toServer && hasMethod(chunk, m) {
			select {
			case c <- struct{}{}:
			default:
			}
		}
	})
	return c
}

func await(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s within 30s: the test tests nothing", what)
	}
}

var (
	basicPublish = testenv.AMQPMethod{Class: 60, Method: 40}
	basicReturn  = testenv.AMQPMethod{Class: 60, Method: 50}
)

// countMethod counts the method frames of m in a chunk of the AMQP stream
// (a frame cut across chunks may be missed: the tests need only a rough
// count).
func countMethod(chunk []byte, m testenv.AMQPMethod) int {
	return bytes.Count(chunk, []byte{byte(m.Class >> 8), byte(m.Class), byte(m.Method >> 8), byte(m.Method)})
}

func hasMethod(chunk []byte, m testenv.AMQPMethod) bool { return countMethod(chunk, m) > 0 }

// deadURL is url pointed at a loopback port that refuses connections.
func deadURL(t *testing.T, url string) string {
	proxy, purl := testenv.AMQPProxy(t, url)
	proxy.Down()
	return purl
}
