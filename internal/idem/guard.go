// Package idem is the fast Redis guard in front of the database: one key per
// business order number, claimed with an atomic SET NX and a short in-flight
// lease, turned into a long-lived "done" marker only after the payment's
// transaction committed, and deleted when processing fails.
//
// The guard only saves the database work. It never decides alone that a
// message may be dropped: Redis loses keys on flush, eviction and failover,
// and a claim whose reply was lost is retried by the client and then meets
// its own key. The caller checks the database before it acks on the guard's
// word.
package idem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// State is what a claim found.
type State int

const (
	// Claimed: this caller holds the in-flight lease and must call Done after
	// the commit, or Release when processing fails.
	Claimed State = iota + 1
	// Done: the payment was committed before (a "done" marker).
	Done
	// InFlight: another holder's lease: a worker still at it, or one that
	// died. Never ack on this alone.
	InFlight
	// Foreign: the key holds a value paysvc never writes (a hand-written
	// consumer's "1", a value of another type): no lease of paysvc's, and no
	// word on the payment. The database decides alone.
	Foreign
)

func (s State) String() string {
	switch s {
	case Claimed:
		return "claimed"
	case Done:
		return "done"
	case InFlight:
		return "in_flight"
	case Foreign:
		return "foreign"
	}
	return "unknown"
}

const (
	doneValue      = "done"
	inFlightPrefix = "inflight:"
)

// Config sets the guard's keys and lifetimes.
type Config struct {
	KeyPrefix string        // e.g. "mq:consumed:pay_success:"
	TTL       time.Duration // how long "done" is remembered
	Lease     time.Duration // how long an in-flight claim lives if never released
}

// Guard claims and marks order keys.
type Guard struct {
	rdb  redis.UniversalClient
	cfg  Config
	pipe *pipeline // nil: one round trip per call
}

// New returns a Guard over rdb.
func New(rdb redis.UniversalClient, cfg Config) *Guard { return &Guard{rdb: rdb, cfg: cfg} }

// Claim is a held in-flight lease, or what a claim found in the key.
type Claim struct {
	Key   string
	Token string
	// Remaining is how long the key still lives: for InFlight, when the
	// other holder's lease runs out (negative: the key never expires).
	Remaining time.Duration
}

// claimScript sets the key to our token if it is free and returns the value
// the key holds afterwards with its remaining life in milliseconds, in one
// atomic step. A retry of a call whose reply was lost finds its own token,
// and so still reads as claimed. A key of another type than a string reads
// as the value "<wrongtype>" (its GET fails with WRONGTYPE). The script
// calls only SET, GET and PTTL: the commands the least-privilege ACL user
// (scripts/least-privilege.sh) may run.
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {ARGV[1], tonumber(ARGV[2])}
end
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  return {'<wrongtype>', redis.call('PTTL', KEYS[1])}
end
if not v then
  return {false, -2}
end
return {v, redis.call('PTTL', KEYS[1])}
`)

// releaseScript deletes the key only while it holds our token.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// Key is the Redis key for an order number.
func (g *Guard) Key(orderNo string) string { return g.cfg.KeyPrefix + orderNo }

// Claim tries to take the order's key. Any error means Redis could not be
// asked: the caller decides whether to wait (CLOSED) or go on with the
// database guards alone (OPEN).
func (g *Guard) Claim(ctx context.Context, orderNo string) (State, Claim, error) {
	b := make([]byte, 12)
	rand.Read(b)
	return g.claim(ctx, orderNo, inFlightPrefix+hex.EncodeToString(b))
}

func (g *Guard) claim(ctx context.Context, orderNo, token string) (State, Claim, error) {
	c := Claim{Key: g.Key(orderNo), Token: token}
	keys, lease := []string{c.Key}, g.cfg.Lease.Milliseconds()
	cmd, err := do(ctx, g, func(p redis.Pipeliner) *redis.Cmd { return claimScript.EvalSha(ctx, p, keys, token, lease) })
	if isNoScript(err) {
		cmd = claimScript.Run(ctx, g.rdb, keys, token, lease) // loads it
		err = cmd.Err()
	}
	if err != nil {
		return 0, c, fmt.Errorf("idem claim %s: %w", c.Key, err)
	}
	res, err := cmd.Slice()
	if err != nil {
		return 0, c, fmt.Errorf("idem claim %s: %w", c.Key, err)
	}
	if len(res) != 2 {
		return 0, c, fmt.Errorf("idem claim %s: unexpected reply %v", c.Key, res)
	}
	if ms, ok := res[1].(int64); ok {
		c.Remaining = time.Duration(ms) * time.Millisecond
	}
	switch v, isString := res[0].(string); {
	case !isString:
		// The key vanished between SET and GET: impossible inside a script,
		// but in flight is the safe reading.
		return InFlight, c, nil
	case v == token:
		return Claimed, c, nil
	case v == doneValue:
		return Done, c, nil
	case strings.HasPrefix(v, inFlightPrefix):
		return InFlight, c, nil
	}
	return Foreign, c, nil
}

// Done marks the order's payment committed, for the long TTL. Call it only
// after the database transaction committed (or proved the payment applied).
func (g *Guard) Done(ctx context.Context, orderNo string) error {
	key := g.Key(orderNo)
	if _, err := do(ctx, g, func(p redis.Pipeliner) *redis.StatusCmd { return p.Set(ctx, key, doneValue, g.cfg.TTL) }); err != nil {
		return fmt.Errorf("idem done %s: %w", g.Key(orderNo), err)
	}
	return nil
}

// Release deletes the claim if it still holds c's token, so that a retry can
// claim again. It reports whether a key was deleted.
func (g *Guard) Release(ctx context.Context, c Claim) (bool, error) {
	n, err := releaseScript.Run(ctx, g.rdb, []string{c.Key}, c.Token).Int()
	if err != nil {
		return false, fmt.Errorf("idem release %s: %w", c.Key, err)
	}
	return n == 1, nil
}

// Peek reads what the order's key holds now, for an operator's look (paysvc
// trace): Done, InFlight or Foreign, with the key's remaining life
// (negative: it never expires); 0 when there is no key.
func (g *Guard) Peek(ctx context.Context, orderNo string) (State, time.Duration, error) {
	key := g.Key(orderNo)
	pipe := g.rdb.Pipeline()
	get, ttl := pipe.Get(ctx, key), pipe.PTTL(ctx, key)
	pipe.Exec(ctx) // each command keeps its own error
	v, err := get.Result()
	var reply redis.Error
	switch {
	case errors.Is(err, redis.Nil):
		return 0, 0, nil
	case errors.As(err, &reply):
		v = "<wrongtype>" // a key of another type: not paysvc's
	case err != nil:
		return 0, 0, fmt.Errorf("idem peek %s: %w", key, err)
	}
	left, err := ttl.Result()
	if err != nil {
		return 0, 0, fmt.Errorf("idem peek %s: %w", key, err)
	}
	switch {
	case v == doneValue:
		return Done, left, nil
	case strings.HasPrefix(v, inFlightPrefix):
		return InFlight, left, nil
	}
	return Foreign, left, nil
}

// Server returns the address of the Redis server the guard talks to, as
// that server sees it (CLIENT INFO, laddr): behind Sentinel, the current
// master. A Redis Cluster has a master per slot range, and a keyless
// command goes to any of them in turn: Server says "cluster" (there is no
// one server to follow, and following CLIENT INFO's answers would count a
// failover at every sample).
func (g *Guard) Server(ctx context.Context) (string, error) {
	if _, ok := g.rdb.(*redis.ClusterClient); ok {
		return ClusterServer, nil
	}
	info, err := g.rdb.Do(ctx, "CLIENT", "INFO").Text()
	if err != nil {
		return "", err
	}
	for _, f := range strings.Fields(info) {
		if addr, ok := strings.CutPrefix(f, "laddr="); ok {
			return addr, nil
		}
	}
	return "", errors.New("CLIENT INFO: no laddr")
}

// ClusterServer is Server's answer for a Redis Cluster.
const ClusterServer = "cluster"

// Probe checks that Redis takes a write, as a claim needs: a PING is answered
// by a replica, a full server or a user without write rights too.
func (g *Guard) Probe(ctx context.Context) error {
	return g.rdb.Set(ctx, g.cfg.KeyPrefix+"__probe__", "1", 10*time.Second).Err()
}
