package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"
)

// clusterScenarios run against the cluster's own servers (make
// chaos-cluster): RabbitMQ node failures with quorum queues replicated on
// three nodes, a Redis master failover through Sentinel, and a MySQL restart
// during a RabbitMQ failover. Each records what it measured (failover and
// pause lengths) in the world's notes, printed under the table.
var clusterScenarios = []scenario{
	{name: "cluster-baseline", faults: "none (3 nodes, Sentinel)", verify: calm},
	{name: "kill9-queue-leader", faults: "SIGKILL the node leading q.pay.success, restart it after 5s",
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
			c := w.cluster
			leader, ok, err := w.leaderAfter(ctx, 500*time.Millisecond)
			if !ok {
				return 0, err
			}
			killed := time.Now()
			c.killNode(leader)
			w.note("killed leader %s", c.nodes[leader].name)
			w.markFault(killed)
			// A new leader is elected among the two left.
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
				if l, err := c.leader(w.vhost); err == nil && l != leader {
					w.note("%s elected leader in %s", c.nodes[l].name, time.Since(killed).Round(100*time.Millisecond))
					w.hit(1)
					break
				}
				if !at(ctx, 200*time.Millisecond) {
					break
				}
			}
			at(ctx, 5*time.Second)
			return 1, c.startNode(ctx, leader)
		},
		verify: all(injected(1, "new leaders elected"), handledAfterFault)},
	{name: "kill9-follower", faults: "SIGKILL a follower node of q.pay.success, restart it after 5s",
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
			c := w.cluster
			leader, ok, err := w.leaderAfter(ctx, 500*time.Millisecond)
			if !ok {
				return 0, err
			}
			follower := (leader + 1) % len(c.nodes)
			w.markFault(time.Now())
			c.killNode(follower)
			w.note("killed follower %s", c.nodes[follower].name)
			at(ctx, 5*time.Second)
			return 1, c.startNode(ctx, follower)
		},
		verify: handledAfterFault},
	{name: "kill-two-nodes", faults: "SIGKILL two nodes in turn: no majority for 8s, then one back, then the other",
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
			c := w.cluster
			leader, ok, err := w.leaderAfter(ctx, 500*time.Millisecond)
			if !ok {
				return 0, err
			}
			second := (leader + 1) % len(c.nodes)
			c.killNode(leader)
			at(ctx, 2*time.Second)
			c.killNode(second)
			lost := time.Now()
			w.markMinority(lost)
			w.note("no majority from %s", lost.Format("15:04:05.000"))
			at(ctx, 8*time.Second)
			back := time.Now()
			w.markMajority(back) // from here on a node is coming back
			if err := c.startNode(ctx, second); err != nil {
				return 2, err
			}
			w.note("majority back after %s (node start %s)", time.Since(lost).Round(100*time.Millisecond), time.Since(back).Round(100*time.Millisecond))
			w.markFault(time.Now())
			return 2, c.startNode(ctx, leader)
		},
		verify: all(pausedWithoutMajority, handledAfterFault)},
	{name: "redis-master-kill9", faults: "SIGKILL the Redis master: a Sentinel promotes the replica",
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
			c := w.cluster
			if !at(ctx, 500*time.Millisecond) {
				return 0, nil
			}
			old, err := c.master(ctx)
			if err != nil {
				return 0, err
			}
			killed := time.Now()
			c.kill(old, syscall.SIGKILL)
			for {
				m, err := c.master(ctx)
				if err == nil && m != old {
					w.note("Sentinel promoted %s in %s", m.name, time.Since(killed).Round(100*time.Millisecond))
					break
				}
				if time.Since(killed) > 30*time.Second {
					return 1, fmt.Errorf("no promotion within 30s")
				}
				if !at(ctx, 100*time.Millisecond) {
					return 1, ctx.Err()
				}
			}
			w.markFault(time.Now())
			// The old master comes back empty; the Sentinels make it a replica.
			return 1, c.start(ctx, old)
		},
		verify: all(handledAfterFault, atLeast(1, "moves to the new master seen by paysvc", msg("redis master changed")))},
	{name: "mysql-restart-in-failover", faults: "SIGKILL the leader node and restart MySQL meanwhile",
		inject: func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
			c := w.cluster
			leader, ok, err := w.leaderAfter(ctx, 500*time.Millisecond)
			if !ok {
				return 0, err
			}
			c.killNode(leader)
			c.kill(c.maria, syscall.SIGTERM)
			down := time.Now()
			at(ctx, 3*time.Second)
			if err := c.start(ctx, c.maria); err != nil {
				return 1, err
			}
			w.note("MySQL down %s", time.Since(down).Round(100*time.Millisecond))
			at(ctx, 2*time.Second)
			w.markFault(time.Now())
			return 2, c.startNode(ctx, leader)
		},
		verify: all(handledAfterFault, atLeast(1, "pauses on MySQL", either(msg("consumption paused; waiting for the dependency"),
			msg("dependency unavailable; not consuming"))))},
}

// leaderAfter waits d into the scenario (the load is flowing), then returns
// the index of the node leading q.pay.success; ok is false when the suite
// stops or there is no leader (err says so).
func (w *world) leaderAfter(ctx context.Context, d time.Duration) (leader int, ok bool, err error) {
	if !at(ctx, d) {
		return 0, false, nil
	}
	leader, err = w.cluster.leader(w.vhost)
	return leader, err == nil, err
}
