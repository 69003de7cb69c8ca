package replay_test

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/replay"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// Replays go to q.pay.success with a fresh retry count and the producer's own
// headers, no faster than the rate limit, each with an audit row.
func TestReplayRateAndHeaders(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	url := testenv.AMQP(t)
	testenv.Declare(t, url, func(ch *amqp.Channel) error { return listener.Declare(ch, []time.Duration{time.Second}) })
	store := deadletter.NewStore(db)
	ctx := context.Background()
	for _, no := range []string{"R1", "R2", "R3"} {
		_, _, err := store.Park(ctx, deadletter.Parked{OrderNo: no, Body: []byte(`{"orderNo":"` + no + `"}`),
			Headers:    `{"trace-id":"t-` + no + `","x-retry-count":5,"x-error-class":"balance_not_enough"}`,
			ErrorClass: "balance_not_enough", LastError: "x", RetryCount: 5, FirstFailedAt: time.Now(), LastFailedAt: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
	}
	pub := &broker.DialingPublisher{URL: url, Name: t.Name(), Timeout: 5 * time.Second}
	defer pub.Close()
	r := &replay.Replayer{Store: store, Orders: order.NewStore(db), DB: db, Publish: pub, Every: 150 * time.Millisecond}
	rows, err := r.Select(ctx, replay.Selection{All: true})
	if err != nil || len(rows) != 3 {
		t.Fatalf("select: %d rows, %v", len(rows), err)
	}
	if _, err := r.Replay(ctx, rows, "op", "", false); err == nil {
		t.Fatal("replay without a reason was accepted")
	}
	start := time.Now()
	results, err := r.Replay(ctx, rows, "op", "test", false)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("3 replays took %s: the 150ms rate limit was not applied", took)
	}
	for _, res := range results {
		if res.Err != nil || !strings.Contains(res.Outcome, "replayed") {
			t.Fatalf("result %+v", res)
		}
	}
	got := testenv.GetAll(t, url, listener.MainQueue)
	if len(got) != 3 {
		t.Fatalf("%d messages in the main queue, want 3", len(got))
	}
	for _, d := range got {
		if _, ok := d.Headers["x-retry-count"]; ok || d.Headers["x-error-class"] != nil ||
			!strings.HasPrefix(d.Headers["trace-id"].(string), "t-R") || d.Headers["x-replay-by"] != "op" ||
			d.DeliveryMode != amqp.Persistent {
			t.Fatalf("replayed message headers %v", d.Headers)
		}
	}
	if n, _, _ := store.Stats(ctx); n != 0 {
		t.Fatalf("%d rows still NEW after replay", n)
	}
}

// A replay whose REPLAYED mark the database refuses (here a trigger on the
// row's update) publishes nothing: the mark is written before the publish,
// in the transaction that holds the row, so no copy goes out that the
// row's history could not record. The row keeps its status.
func TestReplayWhoseMarkIsRefusedPublishesNothing(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	store := deadletter.NewStore(db)
	id, _, err := store.Park(context.Background(), deadletter.Parked{OrderNo: "PM1", Body: []byte(`{"orderNo":"PM1"}`),
		Headers: "{}", ErrorClass: "timeout", LastError: "x", FirstFailedAt: time.Now(), LastFailedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := store.List(context.Background(), deadletter.Filter{Status: deadletter.New, Limit: 10})
	if err != nil || len(rows) != 1 {
		t.Fatalf("list: %d rows, %v", len(rows), err)
	}
	db.MustExec(`CREATE TRIGGER refuse_mark BEFORE UPDATE ON t_dead_letter FOR EACH ROW
		SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the mark fails'`)
	published := 0
	pub := publishThen(func() { published++ })
	r := &replay.Replayer{Store: store, Orders: order.NewStore(db), DB: db, Publish: pub}
	res, err := r.Replay(context.Background(), rows, "op", "test", false)
	if err != nil || len(res) != 1 || res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "the mark fails") {
		t.Fatalf("replay: %+v, %v; want the row's mark to fail", res, err)
	}
	if published != 0 {
		t.Fatalf("%d copies published for a mark the database refused", published)
	}
	d, _, err := store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != deadletter.New {
		t.Fatalf("status %s, want NEW kept (the mark rolled back)", d.Status)
	}
}

// publishThen publishes nothing and reports success, then calls after.
type publishThen func()

func (after publishThen) Publish(context.Context, string, string, amqp.Publishing) error {
	after()
	return nil
}

// A copy the broker took whose confirm never came (the reply path
// black-holed after the publish, as under a resource alarm or a lost
// connection) is not reported as failed: it is in the queue and would be
// paid. The outcome and the row's history say it is unknown, and the row
// stays replayable.
func TestReplayUnconfirmedIsUnknownNotFailed(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	amqpURL := testenv.AMQP(t)
	testenv.Declare(t, amqpURL, func(ch *amqp.Channel) error { return listener.Declare(ch, []time.Duration{time.Second}) })
	store := deadletter.NewStore(db)
	ctx := context.Background()
	id, _, err := store.Park(ctx, deadletter.Parked{OrderNo: "UNK1", Body: []byte(`{"orderNo":"UNK1"}`),
		Headers: "{}", ErrorClass: "timeout", LastError: "x", FirstFailedAt: time.Now(), LastFailedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)
	proxy.BlackholeAfter(func(b []byte) bool { return bytes.Contains(b, []byte{0, 60, 0, 40}) }) // basic.publish
	u.Host = proxy.Addr()
	pub := &broker.DialingPublisher{URL: u.String(), Name: t.Name(), Timeout: time.Second}
	defer pub.Close()
	r := &replay.Replayer{Store: store, Orders: order.NewStore(db), DB: db, Publish: pub}
	rows, err := store.List(ctx, deadletter.Filter{Status: deadletter.New, Limit: 10})
	if err != nil || len(rows) != 1 {
		t.Fatalf("list: %d rows, %v", len(rows), err)
	}
	res, err := r.Replay(ctx, rows, "op", "test", false)
	if err != nil || len(res) != 1 || !errors.Is(res[0].Err, broker.ErrUnconfirmed) ||
		!strings.HasPrefix(res[0].Outcome, "outcome unknown") {
		t.Fatalf("replay: %+v, %v; want the outcome unknown", res, err)
	}
	if got := testenv.GetAll(t, amqpURL, listener.MainQueue); len(got) != 1 {
		t.Fatalf("%d copies in the main queue, want the 1 the broker took: the test proves nothing", len(got))
	}
	d, events, err := store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != deadletter.New {
		t.Fatalf("status %s, want NEW (replayable)", d.Status)
	}
	found := false
	for _, e := range events {
		found = found || (e.Event == deadletter.EventReplayFailed && strings.Contains(e.Result, "may be in "+listener.MainQueue))
	}
	if !found {
		t.Fatalf("history %+v: no event says the copy may be in the queue", events)
	}
}

// A caller's context that ends between a copy's publish and its mark (a
// browser closed on the admin page, a signal) does not cut the replay in
// between: the row is marked REPLAYED. The pacing between replays still
// stops on it.
func TestReplayOnceBegunRunsToItsMark(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	store := deadletter.NewStore(db)
	for _, no := range []string{"CUT1", "CUT2"} {
		if _, _, err := store.Park(context.Background(), deadletter.Parked{OrderNo: no, Body: []byte(`{"orderNo":"` + no + `"}`),
			Headers: "{}", ErrorClass: "timeout", LastError: "x", FirstFailedAt: time.Now(), LastFailedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := store.List(context.Background(), deadletter.Filter{Status: deadletter.New, Limit: 10})
	if err != nil || len(rows) != 2 {
		t.Fatalf("list: %d rows, %v", len(rows), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &replay.Replayer{Store: store, Orders: order.NewStore(db), DB: db, Publish: publishThen(cancel), Every: time.Hour}
	res, err := r.Replay(ctx, rows, "op", "test", false)
	if len(res) != 1 || res[0].Err != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("replay: %+v, %v; want the first replayed, then the pacing stopped by the cancel", res, err)
	}
	d, _, err := store.Get(context.Background(), res[0].ID)
	if err != nil || d.Status != deadletter.Replayed {
		t.Fatalf("status %s, %v: want REPLAYED (the replay ran to its mark)", d.Status, err)
	}
}

// A replay whose mark meets a database that stops answering (every byte
// black-holed from the statement on, no reset: a dead network path) ends
// within its bound, whatever the caller's context, instead of waiting for
// the kernel's TCP timeout. Black-holed before the publish (the row's
// lock), nothing goes out. Black-holed at the COMMIT, after the publish,
// the server rolls the mark back once the statement is killed: the copy is
// in the queue, the row stays replayable, and its history has a line that
// says a copy went out. With the whole path silent after the publish, the
// history line cannot be written either: that too ends within its bound,
// and the replay's error says the line is missing.
func TestReplayMarkOnASilentDatabaseIsBounded(t *testing.T) {
	t.Parallel()
	everything := func([]byte) bool { return true }
	for _, tc := range []struct {
		name          string
		before, after func(toServer []byte) bool // black-holed from the start, from the publish on
		copies        int                        // in the main queue
		recorded      int                        // history lines saying a copy went out
		wantErr       string
	}{
		{name: "the row's lock", before: func(b []byte) bool { return bytes.Contains(b, []byte("FOR UPDATE")) },
			wantErr: "deadline exceeded"},
		{name: "the commit", before: testenv.IsCommit, copies: 1, recorded: 1, wantErr: "published to " + listener.MainQueue},
		{name: "everything after the publish", after: everything, copies: 1, wantErr: "the row's history could not record it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn, db := testenv.MySQL(t)
			amqpURL := testenv.AMQP(t)
			testenv.Declare(t, amqpURL, func(ch *amqp.Channel) error { return listener.Declare(ch, []time.Duration{time.Second}) })
			ctx := context.Background()
			id, _, err := deadletter.NewStore(db).Park(ctx, deadletter.Parked{OrderNo: "SIL1", Body: []byte(`{"orderNo":"SIL1"}`),
				Headers: "{}", ErrorClass: "timeout", LastError: "x", FirstFailedAt: time.Now(), LastFailedAt: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
			proxy, proxied := testenv.MySQLProxy(t, dsn)
			pdb, err := sqldb.Open(ctx, proxied, 4)
			if err != nil {
				t.Fatal(err)
			}
			defer pdb.Close()
			store := deadletter.NewStore(pdb)
			rows, err := store.List(ctx, deadletter.Filter{Status: deadletter.New, Limit: 10})
			if err != nil || len(rows) != 1 {
				t.Fatalf("list: %d rows, %v", len(rows), err)
			}
			pub := &broker.DialingPublisher{URL: amqpURL, Name: t.Name(), Timeout: 5 * time.Second}
			defer pub.Close()
			published := 0
			then := publishAndThen{pub, func() {
				published++
				if tc.after != nil {
					proxy.BlackholeWhen(tc.after)
				}
			}}
			const bound = 2 * time.Second
			r := &replay.Replayer{Store: store, Orders: order.NewStore(pdb), DB: pdb, Publish: then, Timeout: bound}
			if tc.before != nil {
				proxy.BlackholeWhen(tc.before)
			}
			type replayed struct {
				res []replay.Result
				err error
			}
			done := make(chan replayed, 1)
			start := time.Now()
			go func() {
				res, err := r.Replay(ctx, rows, "op", "test", false)
				done <- replayed{res, err}
			}()
			var got replayed
			select {
			case got = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("replay still waiting after %s on a database that does not answer", time.Since(start).Round(time.Second))
			}
			if got.err != nil || len(got.res) != 1 || got.res[0].Err == nil || !strings.Contains(got.res[0].Err.Error(), tc.wantErr) {
				t.Fatalf("replay: %+v, %v; want the row's replay to fail with %q", got.res, got.err, tc.wantErr)
			}
			if n := len(testenv.GetAll(t, amqpURL, listener.MainQueue)); n != published || n != tc.copies {
				t.Fatalf("%d copies in the main queue, %d published, want %d", n, published, tc.copies)
			}
			d, events, err := deadletter.NewStore(db).Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if d.Status != deadletter.New {
				t.Fatalf("status %s, want NEW kept (the mark rolled back)", d.Status)
			}
			said := 0
			for _, e := range events {
				if e.Event == deadletter.EventReplayFailed && strings.Contains(e.Result, "published to "+listener.MainQueue) {
					said++
				}
			}
			if said != tc.recorded {
				t.Fatalf("history %+v: %d lines say a copy went out, want %d (outcome %q)", events, said, tc.recorded, got.res[0].Outcome)
			}
		})
	}
}

// publishAndThen publishes with pub, then calls then if the publish succeeded.
type publishAndThen struct {
	pub  replay.Publisher
	then func()
}

func (p publishAndThen) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	err := p.pub.Publish(ctx, exchange, key, msg)
	if err == nil {
		p.then()
	}
	return err
}

// A lost payment is parked as a lost_commit dead letter whose body decodes
// to the payment, then replayed to q.pay.success with the operator and
// reason; a payment whose dead letter says more (NEW of another class,
// DISCARDED) is left to it; and one re-driven moments ago is not re-driven
// again.
func TestRedriveParksAndReplaysOnlyWhatNoRowCoversAlready(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	url := testenv.AMQP(t)
	testenv.Declare(t, url, func(ch *amqp.Channel) error { return listener.Declare(ch, []time.Duration{time.Second}) })
	store := deadletter.NewStore(db)
	ctx := context.Background()
	lost := []order.Payment{{OrderNo: "RD1", UserID: 5, Amount: 1234}, {OrderNo: "RD2", UserID: 5, Amount: 100},
		{OrderNo: "RD3", UserID: 6, Amount: 200}}
	park := func(p order.Payment, class string) int64 {
		id, _, err := store.Park(ctx, deadletter.Parked{OrderNo: p.OrderNo, UserID: &p.UserID, Amount: &p.Amount,
			Body: []byte(`{}`), Headers: "{}", ErrorClass: class, LastError: "x", FirstFailedAt: time.Now(), LastFailedAt: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	park(lost[1], "balance_not_enough")
	discarded := park(lost[2], "mismatch")
	d, _, _ := store.Get(ctx, discarded)
	if err := store.MarkDiscarded(ctx, d, "alice", "refunded by hand"); err != nil {
		t.Fatal(err)
	}
	// Another message for RD1 (another amount) has a row of its own: not
	// the lost payment's.
	park(order.Payment{OrderNo: "RD1", UserID: 5, Amount: 1}, "mismatch")

	pub := &broker.DialingPublisher{URL: url, Name: t.Name(), Timeout: 5 * time.Second}
	defer pub.Close()
	r := &replay.Replayer{Store: store, Orders: order.NewStore(db), DB: db, Publish: pub}
	results, err := r.Redrive(ctx, lost, "bob", "failover of db1")
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 3 || results[0].Err != nil || !strings.Contains(results[0].Outcome, "replayed to q.pay.success") ||
		!strings.Contains(results[1].Outcome, "skipped: dead letter") || !strings.Contains(results[1].Outcome, "NEW (balance_not_enough)") ||
		!strings.Contains(results[2].Outcome, "DISCARDED by alice") {
		t.Fatalf("results %+v", results)
	}
	rows, err := store.List(ctx, deadletter.Filter{Class: replay.ClassLostCommit})
	if err != nil || len(rows) != 1 || rows[0].Order() != "RD1" || rows[0].Status != deadletter.Replayed || rows[0].UpdatedBy != "bob" {
		t.Fatalf("lost_commit rows %+v, %v", rows, err)
	}
	p, err := listener.DecodePayment(rows[0].Body)
	if err != nil || p != lost[0] {
		t.Fatalf("body %s decodes to %+v, %v; want %+v", rows[0].Body, p, err, lost[0])
	}
	got := testenv.GetAll(t, url, listener.MainQueue)
	if len(got) != 1 || !bytes.Equal(got[0].Body, rows[0].Body) || got[0].Headers["x-replay-by"] != "bob" ||
		got[0].Headers["x-replay-reason"] != "failover of db1" {
		t.Fatalf("published %+v", got)
	}
	_, events, _ := store.Get(ctx, rows[0].ID)
	if len(events) != 2 || events[0].Event != deadletter.EventParked || events[1].Event != deadletter.EventReplayed {
		t.Fatalf("history %+v", events)
	}

	// Again at once: the copy may still be in the queue.
	results, err = r.Redrive(ctx, lost[:1], "bob", "again")
	if err != nil || !strings.Contains(results[0].Outcome, "skipped: dead letter") || !strings.Contains(results[0].Outcome, "replayed by bob") {
		t.Fatalf("second re-drive %+v, %v", results, err)
	}
	if n := testenv.Depth(t, url, listener.MainQueue); n != 0 {
		t.Fatalf("%d copies published by the second re-drive", n)
	}
	if _, err := r.Redrive(ctx, lost[:1], "bob", strings.Repeat("r", 300)); !errors.Is(err, deadletter.ErrBadInput) {
		t.Fatalf("a reason the audit cannot hold: %v", err)
	}
}
