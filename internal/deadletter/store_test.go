package deadletter_test

import (
	"context"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/testenv"
)

func parked(orderNo string, at time.Time) deadletter.Parked {
	return deadletter.Parked{OrderNo: orderNo, Body: []byte(`{"orderNo":"` + orderNo + `"}`), Headers: "{}",
		ErrorClass: "balance_not_enough", LastError: "balance not enough", RetryCount: 5,
		FirstFailedAt: at.Add(-time.Minute), LastFailedAt: at}
}

// One row per order: the same terminal message again changes nothing; parked
// again after a replay, the row is NEW again with its history kept.
func TestParkReplayPark(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	s := deadletter.NewStore(db)
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
	if err := s.MarkAlerted(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkReplayed(ctx, id, "alice", "topped up", "published"); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDiscarded(ctx, id, "bob", "x"); err == nil {
		t.Fatal("discarded a REPLAYED row")
	}
	_, isNew, err = s.Park(ctx, parked("D1", t0.Add(time.Hour)))
	if err != nil || !isNew {
		t.Fatalf("park after replay: %v, %v; want a new alert", isNew, err)
	}
	d, events, err := s.Get(ctx, "D1")
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
