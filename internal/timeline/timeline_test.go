package timeline

import (
	"context"
	"strings"
	"testing"

	"github.com/paysvc/paysvc/internal/testenv"
)

// A notice not sent yet holds a placeholder sent_time (migration 0007): the
// timeline shows a publication only for a SENT notice, at its time.
func TestTimelineShowsANoticePublishedOnlyWhenSent(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.MustExec(`INSERT INTO t_outbox (event_type, biz_no, payload) VALUES ('payment.succeeded', 'TL1', '{}')`)
	db.MustExec(`INSERT INTO t_outbox (event_type, biz_no, payload, status, attempts, sent_time)
		VALUES ('payment.succeeded', 'TL2', '{}', 'SENT', 1, '2026-11-30 10:00:00.250')`)
	lines := func(orderNo string) string {
		t.Helper()
		entries, err := FromDB(context.Background(), db, orderNo)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, e := range entries {
			b.WriteString(e.At.UTC().Format("2006-01-02 15:04:05.000") + " " + e.What + "\n")
		}
		return b.String()
	}
	if got := lines("TL1"); !strings.Contains(got, "payment notice queued") || strings.Contains(got, "published") {
		t.Fatalf("pending notice:\n%s", got)
	}
	if got := lines("TL2"); !strings.Contains(got, "2026-11-30 10:00:00.250 payment notice published (attempt 1)") {
		t.Fatalf("sent notice:\n%s", got)
	}
}
