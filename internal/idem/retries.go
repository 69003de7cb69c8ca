package idem

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Retries is the ledger of retry copies out in the wait queues, so that a
// copy the broker never brings back is seen: one sorted set under the key
// prefix (KeyPrefix + "~retries": an order number starts with a letter or a
// digit, so no order's key is this one), a member per copy
// (orderNo|attempt|queue), scored by when the copy is overdue. A copy is
// entered when paysvc publishes it to a wait queue and removed when it
// comes back (the mover takes it when due, or the consumer receives it).
//
// Like the guard, the ledger decides nothing: it only tells. A copy whose
// entry could not be written is not watched; one whose removal was lost
// shows as overdue until Prune drops it.
type Retries struct {
	rdb redis.UniversalClient
	key string
}

// retriesKey follows the key prefix.
const retriesKey = "~retries"

// Retries returns the ledger kept beside the guard's keys.
func (g *Guard) Retries() *Retries {
	return &Retries{rdb: g.rdb, key: g.cfg.KeyPrefix + retriesKey}
}

// RetryCopy is one copy the ledger watches.
type RetryCopy struct {
	OrderNo   string
	Attempt   int
	Queue     string
	OverdueAt time.Time
}

func (c RetryCopy) member() string {
	return c.OrderNo + "|" + strconv.Itoa(c.Attempt) + "|" + c.Queue
}

// Sent enters a copy published to a wait queue.
func (r *Retries) Sent(ctx context.Context, c RetryCopy) error {
	return r.rdb.ZAdd(ctx, r.key, redis.Z{Score: float64(c.OverdueAt.UnixMilli()), Member: c.member()}).Err()
}

// Back removes a copy that came back from its wait queue.
func (r *Retries) Back(ctx context.Context, c RetryCopy) error {
	return r.rdb.ZRem(ctx, r.key, c.member()).Err()
}

// Overdue counts the copies overdue at now.
func (r *Retries) Overdue(ctx context.Context, now time.Time) (int64, error) {
	return r.rdb.ZCount(ctx, r.key, "-inf", strconv.FormatInt(now.UnixMilli(), 10)).Result()
}

// Prune forgets the copies overdue before before: a copy that long
// overdue was dealt with by hand, or its removal was lost.
func (r *Retries) Prune(ctx context.Context, before time.Time) error {
	return r.rdb.ZRemRangeByScore(ctx, r.key, "-inf", "("+strconv.FormatInt(before.UnixMilli(), 10)).Err()
}

// Of lists the copies of orderNo the ledger watches (a scan of the set:
// for an operator's look, not for the payment path).
func (r *Retries) Of(ctx context.Context, orderNo string) ([]RetryCopy, error) {
	var out []RetryCopy
	var cursor uint64
	for {
		kv, next, err := r.rdb.ZScan(ctx, r.key, cursor, globEscape(orderNo)+"|*", 256).Result()
		if err != nil {
			return nil, fmt.Errorf("retry ledger: %w", err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			parts := strings.SplitN(kv[i], "|", 3)
			if len(parts) != 3 || parts[0] != orderNo {
				continue
			}
			attempt, _ := strconv.Atoi(parts[1])
			ms, _ := strconv.ParseFloat(kv[i+1], 64)
			out = append(out, RetryCopy{OrderNo: orderNo, Attempt: attempt, Queue: parts[2],
				OverdueAt: time.UnixMilli(int64(ms))})
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

// globEscape escapes the glob characters of Redis's MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
