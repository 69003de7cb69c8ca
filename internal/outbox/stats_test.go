package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/testenv"
)

// Stats counts the notices not yet published and measures the oldest's
// age by its create_time on the database's clock; sent notices count for
// nothing, however old, and an empty backlog is 0 and 0.
func TestStats(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ctx := context.Background()
	if b, err := outbox.Stats(ctx, db); err != nil || b != (outbox.Backlog{}) {
		t.Fatalf("empty: %+v (%v), want zero", b, err)
	}
	db.MustExec(`INSERT INTO t_outbox (event_type, biz_no, payload, status, sent_time, create_time)
		VALUES ('PAYMENT_SUCCEEDED', 'ST0', '{}', 'SENT', NOW(3), NOW(3) - INTERVAL 1 HOUR)`)
	db.MustExec(`INSERT INTO t_outbox (event_type, biz_no, payload, create_time)
		VALUES ('PAYMENT_SUCCEEDED', 'ST1', '{}', NOW(3) - INTERVAL 90 SECOND)`)
	db.MustExec(`INSERT INTO t_outbox (event_type, biz_no, payload) VALUES ('PAYMENT_SUCCEEDED', 'ST2', '{}')`)
	b, err := outbox.Stats(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if b.Pending != 2 || b.OldestAge < 90*time.Second || b.OldestAge > 120*time.Second {
		t.Fatalf("%+v, want 2 pending, the oldest about 90 s old", b)
	}
	db.MustExec(`UPDATE t_outbox SET status = 'SENT', sent_time = NOW(3) WHERE biz_no IN ('ST1', 'ST2')`)
	if b, err := outbox.Stats(ctx, db); err != nil || b != (outbox.Backlog{}) {
		t.Fatalf("all sent: %+v (%v), want zero", b, err)
	}
}
