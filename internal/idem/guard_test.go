package idem

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/testenv"
)

func newGuard(t *testing.T, lease time.Duration) (*Guard, *redis.Client) {
	rdb, prefix := testenv.Redis(t)
	return New(rdb, Config{KeyPrefix: prefix, TTL: time.Hour, Lease: lease}), rdb
}

func TestClaimDoneRelease(t *testing.T) {
	t.Parallel()
	g, rdb := newGuard(t, time.Minute)
	ctx := context.Background()

	st, c, err := g.Claim(ctx, "P1")
	if err != nil || st != Claimed {
		t.Fatalf("first claim = %v, %v; want claimed", st, err)
	}
	if st, other, _ := g.Claim(ctx, "P1"); st != InFlight || other.Remaining <= 0 || other.Remaining > time.Minute {
		t.Fatalf("second claim = %v with %v of lease left, want in_flight with (0, 1m]", st, other.Remaining)
	}
	if ttl := rdb.PTTL(ctx, c.Key).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("lease TTL %v, want (0, 1m]", ttl)
	}
	// Another holder's token cannot release it.
	if ok, err := g.Release(ctx, Claim{Key: c.Key, Token: "inflight:other"}); ok || err != nil {
		t.Fatalf("foreign release = %v, %v; want false", ok, err)
	}
	if ok, err := g.Release(ctx, c); !ok || err != nil {
		t.Fatalf("own release = %v, %v; want true", ok, err)
	}
	st, _, _ = g.Claim(ctx, "P1")
	if st != Claimed {
		t.Fatalf("claim after release = %v, want claimed", st)
	}
	if err := g.Done(ctx, "P1"); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := g.Claim(ctx, "P1"); st != Done {
		t.Fatalf("claim after done = %v, want done", st)
	}
	if ttl := rdb.PTTL(ctx, c.Key).Val(); ttl < 59*time.Minute {
		t.Fatalf("done TTL %v, want about 1h", ttl)
	}
	// A stale claim cannot delete a done marker.
	if ok, _ := g.Release(ctx, c); ok {
		t.Fatal("release deleted a done marker")
	}
}

// go-redis retries a command whose reply was lost; the retry meets the key the
// first try set. It must still read as our claim, not as someone else's.
func TestClaimRetryAfterLostReplyIsOurs(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, time.Minute)
	ctx := context.Background()
	if st, _, err := g.claim(ctx, "P2", "inflight:tok"); st != Claimed || err != nil {
		t.Fatalf("first = %v, %v", st, err)
	}
	if st, _, err := g.claim(ctx, "P2", "inflight:tok"); st != Claimed || err != nil {
		t.Fatalf("retry = %v, %v; want claimed", st, err)
	}
}

func TestLeaseExpires(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, 100*time.Millisecond)
	ctx := context.Background()
	if st, _, _ := g.Claim(ctx, "P3"); st != Claimed {
		t.Fatal("first claim failed")
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		st, _, _ := g.Claim(ctx, "P3")
		return st == Claimed
	}, "a dead holder's lease never expired")
}

func TestClaimErrorWhenRedisDown(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	g := New(rdb, Config{KeyPrefix: "x:", TTL: time.Hour, Lease: time.Second})
	if _, _, err := g.Claim(context.Background(), "P4"); err == nil {
		t.Fatal("claim against a closed port succeeded")
	}
}
