package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// scanCount is how many keys one SCAN call asks Redis to look at (its
// COUNT): about a millisecond of the server's time, after which it serves
// its other clients before the next call.
const scanCount = 1000

// ScanDone walks every key under the prefix with SCAN (never KEYS, which
// holds Redis for the whole keyspace) and hands fn the order numbers whose
// key says done, a batch at a time, in one goroutine. These are the
// payments paysvc committed within idempotent.ttl. rate bounds the keys
// Redis looks at per second, SCAN's COUNT included (0: no bound): a walk of
// N keys in the whole keyspace takes about N/rate seconds. In-flight
// claims, values paysvc does not write, keys of another type (the retry
// ledger) are skipped.
//
// SCAN promises every key that stays through the walk at least once, not
// exactly once: fn may meet an order twice. On Redis Cluster every master
// is walked in turn. A walk that meets a change of master (a Sentinel
// failover) goes on with the old cursor on the new master and may miss or
// repeat keys; the next walk sees them.
func (g *Guard) ScanDone(ctx context.Context, rate int, fn func(orderNos []string) error) error {
	count := scanCount
	if rate > 0 {
		count = min(count, rate)
	}
	p := pacer{every: perCall(count, rate)}
	if cc, ok := g.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var masters []*redis.Client
		if err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			masters = append(masters, c)
			mu.Unlock()
			return nil
		}); err != nil {
			return fmt.Errorf("idem scan: %w", err)
		}
		for _, c := range masters {
			if err := g.scanDone(ctx, c, count, &p, fn); err != nil {
				return err
			}
		}
		return nil
	}
	return g.scanDone(ctx, g.rdb, count, &p, fn)
}

func (g *Guard) scanDone(ctx context.Context, c redis.UniversalClient, count int, p *pacer, fn func([]string) error) error {
	match := globEscape(g.cfg.KeyPrefix) + "*"
	var cursor uint64
	for {
		if err := p.wait(ctx); err != nil {
			return err
		}
		// TYPE string: the retry ledger (a sorted set) and any other type
		// are left out by Redis itself.
		keys, next, err := c.ScanType(ctx, cursor, match, int64(count), "string").Result()
		if err != nil {
			return fmt.Errorf("idem scan: %w", err)
		}
		done, err := g.doneOf(ctx, c, keys)
		if err != nil {
			return err
		}
		if len(done) > 0 {
			if err := fn(done); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// doneOf reads keys in one pipeline and returns the order numbers of those
// that say done. A key gone since the SCAN, or changed to another type, is
// skipped.
func (g *Guard) doneOf(ctx context.Context, c redis.UniversalClient, keys []string) ([]string, error) {
	var orderNos []string
	var cmds []*redis.StringCmd
	pipe := c.Pipeline()
	for _, k := range keys {
		orderNo := strings.TrimPrefix(k, g.cfg.KeyPrefix)
		if orderNo == k || strings.HasPrefix(orderNo, "~") {
			continue // not under the prefix (MATCH is a glob); the retry ledger's name
		}
		orderNos = append(orderNos, orderNo)
		cmds = append(cmds, pipe.Get(ctx, k))
	}
	if len(cmds) == 0 {
		return nil, nil
	}
	pipe.Exec(ctx) // each command keeps its own error
	var done []string
	for i, cmd := range cmds {
		v, err := cmd.Result()
		var reply redis.Error
		switch {
		case errors.Is(err, redis.Nil), errors.As(err, &reply):
			continue // expired since the SCAN, or no longer a string
		case err != nil:
			return nil, fmt.Errorf("idem scan: %w", err)
		case v == doneValue:
			done = append(done, orderNos[i])
		}
	}
	return done, nil
}

// perCall is the pause between two SCAN calls of count keys that keeps the
// walk at rate keys a second (0: none).
func perCall(count, rate int) time.Duration {
	if rate <= 0 {
		return 0
	}
	return time.Duration(count) * time.Second / time.Duration(rate)
}

// pacer spaces calls every apart.
type pacer struct {
	every time.Duration
	last  time.Time
}

func (p *pacer) wait(ctx context.Context) error {
	if d := p.every - time.Since(p.last); p.every > 0 && !p.last.IsZero() && d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	p.last = time.Now()
	return nil
}
