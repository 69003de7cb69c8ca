package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/paysvc/paysvc/internal/listener"
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
	{name: "leader-kills-wait-and-main", faults: "SIGKILL the node leading q.pay.dlx.wait.3s, .1s, then q.pay.success, twice over, each back after 3s, retries flowing",
		delays: []time.Duration{time.Second, 3 * time.Second}, maxAttempts: 100, holdLate: true, shape: retrying,
		inject: leaderKills(6, 3*time.Second),
		verify: all(leadersKilled(2), handledAfterFault)},
	{name: "dlx-workers-stopped", faults: "every node's quorum dead-letter workers stopped (as a leader change can leave them) for 8s of retries",
		delays: []time.Duration{time.Second, 3 * time.Second}, maxAttempts: 100, holdLate: true, shape: retrying,
		inject: stopDLXWorkers(8 * time.Second),
		verify: injected(4, "dead-letter workers stopped")},
}

// stopDLXWorkers stops, on every node, the at-least-once dead-letter worker
// of every quorum queue: the state RabbitMQ 3.10 can be left in after leader
// changes (the queue's registered worker gone, no other started until its
// leader changes again), in which an expired message stays in its queue,
// counted in its messages, neither ready nor unacked. Retries flow through
// the wait queues for d after it; nothing starts the workers again.
func stopDLXWorkers(d time.Duration) func(context.Context, *world, *rand.Rand) (int, error) {
	return func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
		if !at(ctx, 500*time.Millisecond) {
			return 0, nil
		}
		const stop = `length([supervisor:terminate_child(rabbit_fifo_dlx_sup, P) || ` +
			`{_, P, _, _} <- supervisor:which_children(rabbit_fifo_dlx_sup), is_pid(P)]).`
		n := 0
		for _, node := range w.cluster.alive() {
			out, err := w.cluster.ctlOutput(node, "eval", stop)
			if err != nil {
				return n, err
			}
			stopped, err := strconv.Atoi(strings.TrimSpace(out))
			if err != nil {
				return n, fmt.Errorf("eval on %s printed %q", node.name, out)
			}
			n += stopped
		}
		w.hit(n)
		at(ctx, d)
		return n, nil
	}
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

// retrying shapes the load of leader-kills-wait-and-main: every fourth
// payable order is late (created once the kills are over), so that its
// payments walk the wait queues for the whole fault; the poor user's
// payments go (their retries, as many as a late order's, would outlast the
// scenario before they are parked; other scenarios park them).
func retrying(wl *workload) {
	poor := map[string]bool{}
	for _, no := range wl.terminal {
		o := wl.orders[no]
		poor[fmt.Sprintf(`{"orderNo":%q,"userId":%d,"amount":"%s"}`, o.no, o.user, o.amount)] = true
		delete(wl.orders, no)
	}
	wl.terminal = nil
	kept := wl.messages[:0]
	for _, b := range wl.messages {
		if !poor[string(b)] {
			kept = append(kept, b)
		}
	}
	wl.messages = kept
	for i, no := range wl.payable {
		if i%4 == 1 {
			wl.late[no] = wl.orders[no]
		}
	}
}

// leaderKills kills, kills times in turn, the node leading each wait queue
// (the longest delay first) and then the one leading q.pay.success, each
// while retries expire in the wait queues; it waits for another node to be
// elected the queue's leader, restarts the killed node after restart and
// goes on once it runs.
func leaderKills(kills int, restart time.Duration) func(context.Context, *world, *rand.Rand) (int, error) {
	return func(ctx context.Context, w *world, _ *rand.Rand) (int, error) {
		c := w.cluster
		var targets []string
		for i := len(w.delays) - 1; i >= 0; i-- {
			targets = append(targets, listener.WaitQueue(w.delays[i]))
		}
		targets = append(targets, listener.MainQueue)
		// The first retries are in the wait queues after a few seconds.
		if !at(ctx, 3*time.Second) {
			return 0, nil
		}
		n := 0
		for k := range kills {
			q := targets[k%len(targets)]
			leaders, messages, err := c.leaders(w.vhost)
			if err != nil {
				return n, err
			}
			leader, ok := leaders[q]
			if !ok {
				return n, fmt.Errorf("%s has no leader", q)
			}
			var led []string
			for _, other := range w.queues() {
				if l, ok := leaders[other]; ok && l == leader && other != q {
					led = append(led, other)
				}
			}
			killed := time.Now()
			c.killNode(leader)
			n++
			elected := "no new leader within 30s"
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
				if l, err := c.leaderOf(w.vhost, q); err == nil && l != leader {
					elected = fmt.Sprintf("%s elected in %s", c.nodes[l].name, time.Since(killed).Round(100*time.Millisecond))
					w.mu.Lock()
					if w.leaderKills == nil {
						w.leaderKills = map[string]int{}
					}
					w.leaderKills[q]++
					w.mu.Unlock()
					break
				}
				if !at(ctx, 200*time.Millisecond) {
					return n, nil
				}
			}
			w.note("killed %s leading %s (%d messages; and %v): %s", c.nodes[leader].name, q, messages[q], led, elected)
			at(ctx, restart)
			if err := c.startNode(ctx, leader); err != nil {
				return n, err
			}
			w.markFault(time.Now())
		}
		return n, nil
	}
}

// leadersKilled is the evidence of leaderKills: every wait queue's and
// q.pay.success's leader was killed at least n times and another elected.
func leadersKilled(n int) func(context.Context, *world, *workload) (bool, string) {
	return func(_ context.Context, w *world, _ *workload) (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		ok := true
		var got []string
		for _, q := range w.queues() {
			if q == listener.TerminalQueue || q == listener.OverflowQueue {
				continue
			}
			ok = ok && w.leaderKills[q] >= n
			got = append(got, fmt.Sprintf("%s %d", q, w.leaderKills[q]))
		}
		return ok, fmt.Sprintf("leaders killed and replaced: %s (want >= %d each)", strings.Join(got, ", "), n)
	}
}
