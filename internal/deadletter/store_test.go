package deadletter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
	"github.com/paysvc/paysvc/migrations"
)

// newStore is a store on a database of the test's own.
func newStore(t *testing.T) (*deadletter.Store, *sqlx.DB) {
	_, db := testenv.MySQL(t)
	return deadletter.NewStore(db), db
}

func parked(orderNo string, at time.Time) deadletter.Parked {
	return deadletter.Parked{OrderNo: orderNo, Body: []byte(`{"orderNo":"` + orderNo + `"}`), Headers: "{}",
		ErrorClass: "balance_not_enough", LastError: "balance not enough", RetryCount: 5,
		FirstFailedAt: at.Add(-time.Minute), LastFailedAt: at}
}

// One row per payment: the same terminal message again changes nothing; parked
// again after a replay, the row is NEW again with its history kept.
func TestParkReplayPark(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

	id, isNew, err := s.Park(ctx, parked("D1", t0))
	if err != nil || !isNew {
		t.Fatalf("first park: %d, %v, %v", id, isNew, err)
	}
	again, isNew, err := s.Park(ctx, parked("D1", t0)) // the broker redelivered it
	if err != nil || isNew || again != id {
		t.Fatalf("redelivered park: %d, %v, %v", again, isNew, err)
	}
	// A second copy failing while the row is NEW: same row, no new alert.
	if _, isNew, _ := s.Park(ctx, parked("D1", t0.Add(time.Second))); isNew {
		t.Fatal("a second copy while NEW asked for a second alert")
	}
	read, _, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MarkAlerted(ctx, read); err != nil {
		t.Fatal(err)
	}
	if err := s.Replay(ctx, read, "alice", "topped up", "published", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDiscarded(ctx, read, "bob", "x"); !errors.Is(err, deadletter.ErrWrongStatus) {
		t.Fatal("discarded a REPLAYED row")
	}
	_, isNew, err = s.Park(ctx, parked("D1", t0.Add(time.Hour)))
	if err != nil || !isNew {
		t.Fatalf("park after replay: %v, %v; want a new alert", isNew, err)
	}
	d, events, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID != id || d.Status != deadletter.New || d.ParkedCount != 3 || d.AlertedAt != nil ||
		!d.FirstFailedAt.Equal(t0.Add(-time.Minute)) || !d.LastFailedAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("row after re-park: %+v", d)
	}
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Event)
	}
	if got := kinds; len(got) != 4 || got[0] != "PARKED" || got[1] != "PARKED" || got[2] != "REPLAYED" || got[3] != "PARKED" {
		t.Fatalf("history %v, want PARKED PARKED REPLAYED PARKED", got)
	}
	if n, _, _ := s.Stats(ctx); n != 1 {
		t.Fatalf("%d NEW rows, want 1", n)
	}
	// A message without an order number is filed by its body.
	noOrder := parked("", t0)
	noOrder.Body = []byte("not json")
	if _, isNew, _ := s.Park(ctx, noOrder); !isNew {
		t.Fatal("a body without order number was not filed")
	}
	rows, err := s.List(ctx, deadletter.Filter{Status: deadletter.New})
	if err != nil || len(rows) != 2 {
		t.Fatalf("list NEW: %d rows, %v", len(rows), err)
	}
}

func payment(orderNo string, user int64, amount money.Cents, class string, at time.Time) deadletter.Parked {
	p := parked(orderNo, at)
	p.UserID, p.Amount, p.ErrorClass, p.LastError = &user, &amount, class, class+": details"
	p.Body = []byte(fmt.Sprintf(`{"orderNo":%q,"userId":%d,"amount":"%s"}`, orderNo, user, amount))
	return p
}

// Two different messages for one order (a real payment that failed on its
// balance, and a copy with another amount, terminal as a mismatch) are two
// rows, each with its own body, class and history, whichever arrives
// first; another copy of the same payment joins its row.
func TestParkKeepsEveryDistinctMessage(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	for _, order := range [][2]string{{"X1", "real first"}, {"X2", "mismatch first"}} {
		real := payment(order[0], 7, 1000, "balance_not_enough", t0)
		other := payment(order[0], 7, 2000, "mismatch", t0.Add(time.Second))
		first, second := real, other
		if order[1] == "mismatch first" {
			first, second = other, real
		}
		id1, new1, err1 := s.Park(ctx, first)
		id2, new2, err2 := s.Park(ctx, second)
		if err1 != nil || err2 != nil || !new1 || !new2 || id1 == id2 {
			t.Fatalf("%s: parked %d (%v, %v) and %d (%v, %v): want two new rows", order[1], id1, new1, err1, id2, new2, err2)
		}
		rows, err := s.ByOrder(ctx, order[0])
		if err != nil || len(rows) != 2 {
			t.Fatalf("%s: %d rows for the order, %v; want 2", order[1], len(rows), err)
		}
		byClass := map[string]deadletter.DeadLetter{}
		for _, r := range rows {
			byClass[r.ErrorClass] = r
		}
		if got := byClass["balance_not_enough"]; string(got.Body) != string(real.Body) || *got.Amount != 1000 {
			t.Fatalf("%s: the real payment's row holds %s", order[1], got.Body)
		}
		if got := byClass["mismatch"]; string(got.Body) != string(other.Body) || *got.Amount != 2000 {
			t.Fatalf("%s: the mismatch's row holds %s", order[1], got.Body)
		}
		// The same payment written another way (amount as a number) joins its row.
		copyOf := real
		copyOf.Body = []byte(fmt.Sprintf(`{"amount":10.00,"orderNo":%q,"userId":7}`, order[0]))
		copyOf.LastFailedAt = t0.Add(time.Minute)
		id, isNew, err := s.Park(ctx, copyOf)
		want := byClass["balance_not_enough"].ID
		if err != nil || isNew || id != want {
			t.Fatalf("%s: a copy of the real payment went to %d (new %v, %v), want row %d", order[1], id, isNew, err, want)
		}
	}
}

// Headers larger than the column are cut to fit, still JSON, and the row
// says so; the message is stored, not refused (strict mode's 1406).
func TestParkFitsOversizedHeaders(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	p := payment("H1", 7, 100, "bad_message", time.Now())
	p.Headers = fmt.Sprintf(`{"big":%q,"small":"kept","x-error-class":"bad_message"}`, strings.Repeat("x", 70000))
	p.ErrorClass = strings.Repeat("c", 40)
	id, _, err := s.Park(ctx, p)
	if err != nil {
		t.Fatalf("park with 70 KB of headers: %v", err)
	}
	d, _, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(d.Headers), &h); err != nil || h["small"] != "kept" || !strings.Contains(h["big"], "dropped by paysvc: 70002 bytes") {
		t.Fatalf("stored headers %.200s (%v): want valid JSON with the small header kept and the big one noted", d.Headers, err)
	}
	if !strings.Contains(d.LastError, "headers cut from") || len(d.ErrorClass) != 32 {
		t.Fatalf("row %q / %q: want the cut said in last_error and the class cut to 32", d.LastError, d.ErrorClass)
	}
}

// All-digit order numbers are valid, and so are row ids: an argument that
// could be either is refused, never guessed.
func TestFindOrderRefusesAmbiguousDigits(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	id, _, err := s.Park(ctx, payment("ORD-A", 7, 100, "mismatch", time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	ref := strconv.FormatInt(id, 10)
	if _, err := s.FindOrder(ctx, ref, false); !errors.Is(err, deadletter.ErrAmbiguous) || !strings.Contains(err.Error(), "--id "+ref) {
		t.Fatalf("FindOrder(%s) = %v, want ambiguous, naming --id", ref, err)
	}
	// Now an order with that number exists too: still ambiguous.
	if _, _, err := s.Park(ctx, payment(ref, 7, 100, "mismatch", time.Now())); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FindOrder(ctx, ref, false); !errors.Is(err, deadletter.ErrAmbiguous) || !strings.Contains(err.Error(), "--order "+ref) {
		t.Fatalf("FindOrder(%s) with both = %v, want ambiguous, naming --order", ref, err)
	}
	rows, err := s.FindOrder(ctx, ref, true)
	if err != nil || len(rows) != 1 || rows[0].Order() != ref {
		t.Fatalf("FindOrder(%s, explicit) = %v, %v", ref, rows, err)
	}
	if _, err := s.FindOrder(ctx, "ORD-NONE", false); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("unknown order: %v", err)
	}
}

// Rows parked before migration 0004 (filed under the order number alone)
// move to the new keys: the next copy of the same payment joins them.
func TestMigrationMovesLegacyRows(t *testing.T) {
	t.Parallel()
	s, db := newStore(t)
	ctx := context.Background()
	p := payment("LEG1", 7, 12345, "balance_not_enough", time.Now())
	db.MustExec(`INSERT INTO t_dead_letter (dedup_key, order_no, user_id, amount, body, headers, error_class, last_error,
		fingerprint, first_failed_at, last_failed_at) VALUES ('LEG1', 'LEG1', 7, 123.45, ?, '{}', 'balance_not_enough', 'x',
		'legacy', NOW(3), NOW(3))`, p.Body)
	db.MustExec(`INSERT INTO t_dead_letter (dedup_key, order_no, body, headers, error_class, last_error,
		fingerprint, first_failed_at, last_failed_at) VALUES ('LEG2', 'LEG2', 'not json', '{}', 'bad_message', 'x',
		'legacy', NOW(3), NOW(3))`)
	db.MustExec("DELETE FROM paysvc_schema_migrations WHERE version = 4")
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqldb.Migrate(ctx, db, ms); err != nil {
		t.Fatal(err)
	}
	var legacy int64
	db.Get(&legacy, "SELECT id FROM t_dead_letter WHERE order_no = 'LEG1'")
	id, isNew, err := s.Park(ctx, p)
	if err != nil || isNew || id != legacy {
		t.Fatalf("park after migration: %d (new %v, %v), want the legacy row %d", id, isNew, err, legacy)
	}
	lenient := parked("LEG2", time.Now())
	lenient.Body = []byte("not json")
	var legacy2 int64
	db.Get(&legacy2, "SELECT id FROM t_dead_letter WHERE order_no = 'LEG2'")
	if id, _, err := s.Park(ctx, lenient); err != nil || id != legacy2 {
		t.Fatalf("body-filed park after migration: %d, %v; want %d", id, err, legacy2)
	}
}

// A replay acts on the row as the operator read it: a row discarded by
// another operator since, or parked again since, is refused and nothing is
// published.
func TestReplayRefusesARowChangedSinceItWasRead(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	published := 0
	publish := func(context.Context) error { published++; return nil }

	discarded, _, err := s.Park(ctx, parked("CH1", t0))
	if err != nil {
		t.Fatal(err)
	}
	read, _, err := s.Get(ctx, discarded)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDiscarded(ctx, read, "bob", "customer cancelled"); err != nil {
		t.Fatal(err)
	}
	if err := s.Replay(ctx, read, "alice", "topped up", "published", publish); !errors.Is(err, deadletter.ErrChanged) {
		t.Fatalf("replay of a row discarded since it was read: %v, want ErrChanged", err)
	}
	if d, _, _ := s.Get(ctx, discarded); d.Status != deadletter.Discarded {
		t.Fatalf("status %s, want DISCARDED kept", d.Status)
	}

	reparked, _, err := s.Park(ctx, parked("CH2", t0))
	if err != nil {
		t.Fatal(err)
	}
	if read, _, err = s.Get(ctx, reparked); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Park(ctx, parked("CH2", t0.Add(time.Second))); err != nil {
		t.Fatal(err)
	}
	if err := s.Replay(ctx, read, "alice", "topped up", "published", publish); !errors.Is(err, deadletter.ErrChanged) {
		t.Fatalf("replay of a row parked again since it was read: %v, want ErrChanged", err)
	}
	if published != 0 {
		t.Fatalf("published %d copies of rows that changed", published)
	}
	if err := s.MarkDiscarded(ctx, read, "bob", "customer cancelled"); !errors.Is(err, deadletter.ErrChanged) {
		t.Fatalf("discard of a row parked again since it was read: %v, want ErrChanged", err)
	}
	// Read afresh, the same row replays.
	if read, _, err = s.Get(ctx, reparked); err != nil {
		t.Fatal(err)
	}
	if err := s.Replay(ctx, read, "alice", "topped up", "published", publish); err != nil || published != 1 {
		t.Fatalf("replay of a fresh read: %v, %d published", err, published)
	}
}

// The row stays locked from the replay's check to its mark: the copy,
// failing again and parked while the replay waits for its confirm, is
// parked after the mark, so the row ends NEW with a new alert (not
// REPLAYED, which would hide a payment that failed again).
func TestReplayHoldsTheRowUntilItsMark(t *testing.T) {
	t.Parallel()
	s, db := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	id, _, err := s.Park(ctx, parked("HOLD1", t0))
	if err != nil {
		t.Fatal(err)
	}
	read, _, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	type parking struct {
		becameNew bool
		err       error
	}
	done := make(chan parking, 1)
	err = s.Replay(ctx, read, "alice", "retry", "published", func(context.Context) error {
		go func() {
			_, becameNew, err := s.Park(ctx, parked("HOLD1", t0.Add(time.Minute)))
			done <- parking{becameNew, err}
		}()
		// It waits on the row, as it must: seen by the server as a lock
		// wait, not guessed from a pause.
		deadline := time.After(10 * time.Second)
		for {
			select {
			case p := <-done:
				t.Errorf("the copy was parked (%+v) while the replay held the row", p)
				done <- p
				return nil
			case <-deadline:
				t.Error("the copy's park never waited on the row")
				return nil
			case <-time.After(20 * time.Millisecond):
			}
			var waiting int
			if err := db.Get(&waiting, `SELECT COUNT(*) FROM information_schema.innodb_trx t
				JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
				WHERE p.db = DATABASE() AND t.trx_state = 'LOCK WAIT'`); err != nil {
				t.Error(err)
				return nil
			}
			if waiting > 0 {
				return nil
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	var p parking
	select {
	case p = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the copy was never parked")
	}
	if p.err != nil || !p.becameNew {
		t.Fatalf("parking after the replay: becameNew %v, %v; want a new alert", p.becameNew, p.err)
	}
	if d, _, _ := s.Get(ctx, id); d.Status != deadletter.New || d.ParkedCount != 2 {
		t.Fatalf("row %s, parked %d times; want NEW, 2", d.Status, d.ParkedCount)
	}
}

// An alert read before its row was parked again (replayed meanwhile, and
// failed again: a new failure) is not marked sent: the new failure is
// alerted on the next round instead of never.
func TestMarkAlertedLeavesARowParkedAgain(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	id, _, err := s.Park(ctx, parked("AL1", t0))
	if err != nil {
		t.Fatal(err)
	}
	pending, err := s.PendingAlerts(ctx, 10)
	if err != nil || len(pending) != 1 || pending[0].ID != id {
		t.Fatalf("pending alerts %v, %v", pending, err)
	}
	// While the webhook is being posted: an operator replays, the copy
	// fails again and is parked.
	if err := s.Replay(ctx, pending[0], "alice", "topped up", "published", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, isNew, err := s.Park(ctx, parked("AL1", t0.Add(time.Hour))); err != nil || !isNew {
		t.Fatalf("park after replay: %v, %v", isNew, err)
	}
	if err := s.MarkAlerted(ctx, pending[0]); err != nil {
		t.Fatal(err)
	}
	again, err := s.PendingAlerts(ctx, 10)
	if err != nil || len(again) != 1 || again[0].ID != id || again[0].ParkedCount != pending[0].ParkedCount+1 {
		t.Fatalf("pending alerts after the re-park %+v, %v; want the row again, parked once more", again, err)
	}
	if err := s.MarkAlerted(ctx, again[0]); err != nil {
		t.Fatal(err)
	}
	if left, err := s.PendingAlerts(ctx, 10); err != nil || len(left) != 0 {
		t.Fatalf("pending alerts %v, %v; want none once the new failure was alerted", left, err)
	}
}

// A replay publishes only what the database has already agreed to mark: a
// reason or operator the audit columns cannot hold is refused before any
// publish, and a mark the database refuses (here a trigger) publishes
// nothing. A copy published and then never marked would be a charge with
// no line in the row's history.
func TestReplayMarksBeforeItPublishes(t *testing.T) {
	t.Parallel()
	s, db := newStore(t)
	ctx := context.Background()
	published := 0
	publish := func(context.Context) error { published++; return nil }
	id, _, err := s.Park(ctx, parked("AUD1", time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)))
	if err != nil {
		t.Fatal(err)
	}
	read, _, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ operator, reason string }{
		{"alice", strings.Repeat("x", 256)},
		{strings.Repeat("o", 65), "topped up"},
		{"alice", "caf\xe9 latin-1"},
	} {
		if err := s.Replay(ctx, read, c.operator, c.reason, "published", publish); !errors.Is(err, deadletter.ErrBadInput) {
			t.Fatalf("replay by %.10q… for %.10q…: %v, want ErrBadInput", c.operator, c.reason, err)
		}
	}
	if err := s.Replay(ctx, read, "alice", strings.Repeat("é", 255), "published", func(context.Context) error { return errors.New("stop here") }); err == nil || errors.Is(err, deadletter.ErrBadInput) {
		t.Fatalf("a reason of 255 characters (510 bytes): %v, want it accepted up to the publish", err)
	}

	db.MustExec(`CREATE TRIGGER refuse_mark BEFORE UPDATE ON t_dead_letter FOR EACH ROW
		SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'mark refused'`)
	if err := s.Replay(ctx, read, "alice", "topped up", "published", publish); err == nil || !strings.Contains(err.Error(), "mark refused") {
		t.Fatalf("replay whose mark the database refuses: %v, want its error", err)
	}
	if published != 0 {
		t.Fatalf("%d copies published for marks that were never written", published)
	}
	db.MustExec("DROP TRIGGER refuse_mark")
	if err := s.Replay(ctx, read, "alice", "topped up", "published", publish); err != nil || published != 1 {
		t.Fatalf("replay once the mark is allowed: %v, %d published", err, published)
	}
	if d, events, _ := s.Get(ctx, id); d.Status != deadletter.Replayed || events[len(events)-1].Operator != "alice" {
		t.Fatalf("row %s, last event %+v; want REPLAYED by alice", d.Status, events[len(events)-1])
	}
}

// Every replica runs an alerter on the same rows: a round holds them, so
// two rounds at once post each alert once, not once per replica. An alert
// the webhook refuses (an HTTP error) does not hold back the others.
func TestAlertsPostOncePerDeadLetterAcrossReplicas(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	refusedID, _, err := s.Park(ctx, parked("AL1", t0))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Park(ctx, parked("AL2", t0)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	posts := map[int64]int{}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a deadletter.Alert
		json.NewDecoder(r.Body).Decode(&a)
		mu.Lock()
		posts[a.DeadLetterID]++
		mu.Unlock()
		time.Sleep(300 * time.Millisecond) // a slow webhook: the rounds overlap
		if a.DeadLetterID == refusedID {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
		}
	}))
	defer hook.Close()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		a := &deadletter.Alerter{Store: s, URL: hook.URL, Client: hook.Client(), Log: zap.NewNop()}
		wg.Go(func() { errs[i] = a.SendPending(ctx) })
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for id, n := range posts {
		if n != 1 {
			t.Errorf("dead letter %d alerted %d times by two replicas' rounds, want once", id, n)
		}
	}
	if len(posts) != 2 {
		t.Errorf("alerts posted for %v, want both dead letters (a refused one holds no other back)", posts)
	}
	pending, _ := s.PendingAlerts(ctx, 10)
	if len(pending) != 1 || pending[0].ID != refusedID {
		t.Errorf("pending after the rounds: %v, want only the refused %d", pending, refusedID)
	}
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Errorf("round errors %v: want the refusal reported by the round that posted, none by the other", errs)
	}
}

// A body the broker took but one INSERT cannot carry (an escaped body near
// the 16 MiB column passed MariaDB's default max_allowed_packet, 16 MiB) is
// stored cut, and the row says so: refused, it held the parker, and every
// terminal message behind it, for good.
func TestParkStoresAHugeBodyCut(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	body := make([]byte, 17<<20)
	for i := range body {
		body[i] = "\x00'\"\\\n"[i%5] // each byte needs escaping in the statement
	}
	p := parked("HUGE1", time.Now())
	p.Body, p.ErrorClass = body, "bad_message"
	id, _, err := s.Park(ctx, p)
	if err != nil {
		t.Fatalf("park of a 17 MiB body: %v", err)
	}
	d, _, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Body) == 0 || len(d.Body) > 8<<20 || !bytes.Equal(d.Body, body[:len(d.Body)]) || !strings.Contains(d.LastError, "body cut from 17825792") {
		t.Fatalf("stored %d bytes, last_error %q: want the body's start, cut, and the cut said", len(d.Body), d.LastError)
	}
}
