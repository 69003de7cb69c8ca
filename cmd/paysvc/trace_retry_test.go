package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/testenv"
)

// paysvc trace shows the retry copies the ledger still watches: one not due
// yet, and one overdue, said to be stranded, with the queue it was
// published to.
func TestTraceShowsWhereARetryCopyWasLastSeen(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	cfg, err := loadConfig("absent.yaml", false, map[string]string{
		"PAYSVC_REDIS_ADDR": testenv.RedisAddr(), "PAYSVC_IDEMPOTENT_KEYPREFIX": prefix})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ledger := idem.New(rdb, idem.Config{KeyPrefix: prefix}).Retries()
	now := time.Now()
	for _, rc := range []idem.RetryCopy{
		{OrderNo: "TRC1", Attempt: 1, Queue: "q.pay.dlx.wait.30s", OverdueAt: now.Add(-time.Minute)},
		{OrderNo: "TRC1", Attempt: 2, Queue: "q.pay.dlx.wait.1m", OverdueAt: now.Add(time.Minute)},
		{OrderNo: "TRC10", Attempt: 1, Queue: "q.pay.dlx.wait.30s", OverdueAt: now.Add(-time.Minute)},
	} {
		if err := ledger.Sent(ctx, rc); err != nil {
			t.Fatal(err)
		}
	}
	entries := redisEntries(ctx, cfg, nil, "TRC1", now) // no guard key: the database is not read
	if len(entries) != 2 {
		t.Fatalf("entries %+v, want TRC1's two copies", entries)
	}
	var text []string
	for _, e := range entries {
		text = append(text, e.What)
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{
		"retry copy of attempt 1 last seen published to q.pay.dlx.wait.30s; not back, overdue since",
		"retry copy of attempt 2 last seen published to q.pay.dlx.wait.1m; not back yet",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("trace lacks %q:\n%s", want, all)
		}
	}
}
