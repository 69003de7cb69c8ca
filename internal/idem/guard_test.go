package idem

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/testenv"
)

func newGuard(t *testing.T, lease time.Duration) (*Guard, *redis.Client) {
	rdb, prefix := testenv.Redis(t)
	return New(rdb, Config{KeyPrefix: prefix, TTL: time.Hour, Lease: lease}), rdb
}

// bothWays runs test on a guard with a one-minute lease, alone and through
// a pipeline.
func bothWays(t *testing.T, test func(t *testing.T, g *Guard, rdb *redis.Client)) {
	for _, pipelined := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipelined=%v", pipelined), func(t *testing.T) {
			t.Parallel()
			g, rdb := newGuard(t, time.Minute)
			if pipelined {
				t.Cleanup(g.StartPipeline(1, 8))
			}
			test(t, g, rdb)
		})
	}
}

func TestClaimDoneRelease(t *testing.T) {
	t.Parallel()
	bothWays(t, testClaimDoneRelease)
}

func testClaimDoneRelease(t *testing.T, g *Guard, rdb *redis.Client) {
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

// pipelineSizes records how many claims each pipeline rdb sends carries; while hold is
// open, the first pipeline waits in the hook.
type pipelineSizes struct {
	mu    sync.Mutex
	sizes []int
	hold  chan struct{}
	held  chan struct{}
}

func (h *pipelineSizes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		claims := 0
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				claims++
			}
		}
		if claims == 0 {
			return next(ctx, cmds) // the client's own (HELLO on a new connection)
		}
		h.mu.Lock()
		h.sizes = append(h.sizes, claims)
		first := len(h.sizes) == 1
		h.mu.Unlock()
		if first {
			close(h.held)
			<-h.hold
		}
		return next(ctx, cmds)
	}
}

// Claims and done marks made at the same moment share a pipeline, and each
// still gets its own answer: of two claims of one order, one holds it and
// the other finds it in flight.
func TestPipelinedClaimsShareARoundTrip(t *testing.T) {
	t.Parallel()
	g, rdb := newGuard(t, time.Minute)
	h := &pipelineSizes{hold: make(chan struct{}), held: make(chan struct{})}
	rdb.AddHook(h)
	stop := g.StartPipeline(1, 64)
	defer stop()
	ctx := context.Background()

	first := make(chan State, 1)
	go func() { st, _, _ := g.Claim(ctx, "first"); first <- st }()
	<-h.held // the only pipeline is busy: the next claims queue up
	const orders = 20
	states := make([][2]State, orders)
	var wg sync.WaitGroup
	for i := range orders {
		for j := range 2 {
			wg.Go(func() {
				st, _, err := g.Claim(ctx, fmt.Sprintf("O%d", i))
				if err != nil {
					t.Error(err)
				}
				states[i][j] = st
			})
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return g.pipe.calls.Waiting() == 2*orders },
		"the claims are queued")
	close(h.hold)
	wg.Wait()
	if st := <-first; st != Claimed {
		t.Fatalf("first claim: %v", st)
	}
	for i, st := range states {
		if !(st == [2]State{Claimed, InFlight} || st == [2]State{InFlight, Claimed}) {
			t.Errorf("order O%d: claims %v, want one claimed and one in flight", i, st)
		}
	}
	h.mu.Lock()
	sizes := slices.Clone(h.sizes)
	h.mu.Unlock()
	if len(sizes) < 2 || slices.Max(sizes[1:]) < 2 {
		t.Fatalf("pipeline sizes %v: the queued claims did not share one", sizes)
	}
	for i := range orders {
		if err := g.Done(ctx, fmt.Sprintf("O%d", i)); err != nil {
			t.Fatal(err)
		}
		if st, _, _ := g.Claim(ctx, fmt.Sprintf("O%d", i)); st != Done {
			t.Fatalf("O%d after Done: %v", i, st)
		}
	}
}

// A Redis that lost its scripts (restart, SCRIPT FLUSH) answers a pipelined
// EVALSHA with NOSCRIPT: the claim loads the script and goes on. On a
// redis-server of the test's own: SCRIPT FLUSH on the shared one would
// touch every client, and another test could load the script back before
// the claim, which would then prove nothing.
func TestPipelinedClaimAfterScriptFlush(t *testing.T) {
	t.Parallel()
	addr := testenv.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	srv := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	testenv.WaitPort(t, addr)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	g := New(rdb, Config{KeyPrefix: "flush:", TTL: time.Hour, Lease: time.Minute})
	defer g.StartPipeline(1, 8)()
	ctx := context.Background()
	if st, _, err := g.Claim(ctx, "F0"); st != Claimed || err != nil {
		t.Fatalf("first claim = %v, %v", st, err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if loaded, err := rdb.ScriptExists(ctx, claimScript.Hash()).Result(); err != nil || loaded[0] {
		t.Fatalf("after SCRIPT FLUSH the claim script is loaded (%v, %v): the test proves nothing", loaded, err)
	}
	if st, _, err := g.Claim(ctx, "F1"); st != Claimed || err != nil {
		t.Fatalf("claim after SCRIPT FLUSH = %v, %v; want claimed", st, err)
	}
	if loaded, err := rdb.ScriptExists(ctx, claimScript.Hash()).Result(); err != nil || !loaded[0] {
		t.Fatalf("the claim went on without loading its script again (%v, %v)", loaded, err)
	}
}

// A value paysvc never writes at an order's key (a hand-written consumer's
// "1", a key of another type) is Foreign: neither done nor another worker's
// lease, and never an error; the key is left as it was.
func TestClaimReadsForeignValues(t *testing.T) {
	t.Parallel()
	bothWays(t, func(t *testing.T, g *Guard, rdb *redis.Client) {
		ctx := context.Background()
		rdb.Set(ctx, g.Key("LEGACY"), "1", 24*time.Hour)
		rdb.HSet(ctx, g.Key("HASH"), "a", "b")
		rdb.Set(ctx, g.Key("OTHER"), "inflight", 0) // no token after the prefix's colon: not paysvc's
		rdb.Set(ctx, g.Key("EMPTY"), "", 0)
		for _, no := range []string{"LEGACY", "HASH", "OTHER", "EMPTY"} {
			st, c, err := g.Claim(ctx, no)
			if err != nil || st != Foreign {
				t.Fatalf("claim of %s = %v, %v; want foreign", no, st, err)
			}
			if no == "LEGACY" && (c.Remaining <= time.Hour || c.Remaining > 24*time.Hour) {
				t.Fatalf("remaining %v, want the legacy key's TTL", c.Remaining)
			}
		}
		if v := rdb.Get(ctx, g.Key("LEGACY")).Val(); v != "1" {
			t.Fatalf("legacy key now %q, want it untouched", v)
		}
		if v := rdb.HGet(ctx, g.Key("HASH"), "a").Val(); v != "b" {
			t.Fatalf("hash key now %q, want it untouched", v)
		}
		// paysvc's own values still read as before.
		rdb.Set(ctx, g.Key("MINE"), "inflight:abc", time.Minute)
		if st, _, err := g.Claim(ctx, "MINE"); err != nil || st != InFlight {
			t.Fatalf("claim of another worker's lease = %v, %v; want in_flight", st, err)
		}
	})
}

// Behind a Redis Cluster there is no one server to follow: Server says so
// without asking (a keyless CLIENT INFO goes to each master in turn, and
// the monitor counted a failover at every sample). No Cluster runs here:
// the client is never dialled.
func TestServerOfACluster(t *testing.T) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	g := New(rdb, Config{KeyPrefix: "x:", TTL: time.Hour, Lease: time.Minute})
	if s, err := g.Server(context.Background()); err != nil || s != ClusterServer {
		t.Fatalf("Server on a Cluster = %q, %v; want %q", s, err, ClusterServer)
	}
}
