package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// entry is one JSON line of an instance's log.
type entry map[string]any

func (e entry) str(k string) string { s, _ := e[k].(string); return s }

func (e entry) num(k string) float64 { f, _ := e[k].(float64); return f }

func (e entry) at() time.Time {
	t, _ := time.Parse("2006-01-02T15:04:05.000Z0700", e.str("ts"))
	return t
}

// entries reads every instance's log; instance i's lines carry "instance": i.
func (w *world) entries() []entry {
	w.mu.Lock()
	paths := make([]string, 0, len(w.instances))
	for _, in := range w.instances {
		paths = append(paths, in.logPath)
	}
	w.mu.Unlock()
	var out []entry
	for i, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e entry
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				e["instance"] = float64(i)
				out = append(out, e)
			}
		}
		f.Close()
	}
	return out
}

// count counts the entries for which match holds.
func count(es []entry, match func(entry) bool) int {
	n := 0
	for _, e := range es {
		if match(e) {
			n++
		}
	}
	return n
}

func msg(m string) func(entry) bool { return func(e entry) bool { return e.str("msg") == m } }

func handled(result string) func(entry) bool {
	return func(e entry) bool { return e.str("msg") == "message handled" && e.str("result") == result }
}

func class(c string) func(entry) bool {
	return func(e entry) bool { return e.str("msg") == "message handled" && e.str("error_class") == c }
}

func slower(d time.Duration) func(entry) bool {
	return func(e entry) bool { return e.str("msg") == "message handled" && e.num("duration") >= d.Seconds() }
}

func either(fs ...func(entry) bool) func(entry) bool {
	return func(e entry) bool {
		for _, f := range fs {
			if f(e) {
				return true
			}
		}
		return false
	}
}

// atMost is a verify: at most n log entries match, described by what.
func atMost(n int, what string, match func(entry) bool) func(context.Context, *world, *workload) (bool, string) {
	return func(_ context.Context, w *world, _ *workload) (bool, string) {
		got := count(w.entries(), match)
		return got <= n, fmt.Sprintf("%d %s (want <= %d)", got, what, n)
	}
}

// atLeast is a verify: at least n log entries match, described by what.
func atLeast(n int, what string, match func(entry) bool) func(context.Context, *world, *workload) (bool, string) {
	return func(_ context.Context, w *world, _ *workload) (bool, string) {
		got := count(w.entries(), match)
		return got >= n, fmt.Sprintf("%d %s (want >= %d)", got, what, n)
	}
}

// injected is a verify: the injection itself reports how often it hit
// paysvc (connections killed, COMMITs cut...), at least n times.
func injected(n int, what string) func(context.Context, *world, *workload) (bool, string) {
	return func(_ context.Context, w *world, _ *workload) (bool, string) {
		w.mu.Lock()
		hits := w.hits
		w.mu.Unlock()
		return hits >= n, fmt.Sprintf("%d %s (want >= %d)", hits, what, n)
	}
}

// all combines verifies: every one must hold.
func all(vs ...func(context.Context, *world, *workload) (bool, string)) func(context.Context, *world, *workload) (bool, string) {
	return func(ctx context.Context, w *world, wl *workload) (bool, string) {
		ok := true
		var details []string
		for _, v := range vs {
			o, d := v(ctx, w, wl)
			ok = ok && o
			details = append(details, d)
		}
		return ok, strings.Join(details, "; ")
	}
}

// dupAfterUnknown is the evidence of a COMMIT whose reply was lost: an
// order that got commit_unknown and later was found committed: a FIRST
// with commit_resolved (the copy found its own COMMIT applied), or a
// DUPLICATE (another copy's).
func dupAfterUnknown(_ context.Context, w *world, _ *workload) (bool, string) {
	es := w.entries()
	unknown := map[string]time.Time{}
	for _, e := range es {
		if e.str("msg") == "message handled" && e.str("error_class") == "commit_unknown" {
			unknown[e.str("order_no")] = e.at()
		}
	}
	n := 0
	for _, e := range es {
		if t, ok := unknown[e.str("order_no")]; ok && !e.at().Before(t) &&
			(e.str("result") == "DUPLICATE" || e.str("result") == "FIRST" && e["commit_resolved"] == true) {
			n++
		}
	}
	return n >= 1, fmt.Sprintf("%d commit_unknown orders, %d found committed after one (want >= 1)", len(unknown), n)
}

// handledAfterResume is the evidence of SIGSTOP/SIGCONT: the stopped
// instance held work and went on with it after it was resumed.
func handledAfterResume(_ context.Context, w *world, _ *workload) (bool, string) {
	if w.resumedAt.IsZero() {
		return false, "no instance was stopped and resumed"
	}
	n := count(w.entries(), func(e entry) bool {
		return e.num("instance") == 1 && e.str("msg") == "message handled" && e.at().After(w.resumedAt)
	})
	return n >= 1, fmt.Sprintf("%d messages handled by the stopped instance after SIGCONT (want >= 1)", n)
}

// cleanTerms is the evidence of SIGTERM under load: instances that were
// working drained and exited 0 within the bound.
func cleanTerms(n int) func(context.Context, *world, *workload) (bool, string) {
	return func(_ context.Context, w *world, _ *workload) (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		got := 0
		for _, e := range w.exits {
			if e.term && e.code == 0 && e.sig == "" && e.drain <= drainBound {
				got++
			}
		}
		return got >= n, fmt.Sprintf("%d instances exited 0 within %s of SIGTERM (want >= %d)", got, drainBound, n)
	}
}

// calm is the baseline's evidence: nothing paused, reconnected or was
// requeued.
func calm(_ context.Context, w *world, _ *workload) (bool, string) {
	n := count(w.entries(), either(msg("consumption paused; waiting for the dependency"),
		msg("amqp session ended; reconnecting"), handled("REQUEUE")))
	return n == 0, fmt.Sprintf("%d pauses, reconnects or requeues (want 0)", n)
}

// redelivered matches a message the broker delivered again (a killed
// instance's unacked messages).
func redelivered(e entry) bool { return e.str("msg") == "message handled" && e["redelivered"] == true }

// killed is the evidence of a crash point: an instance died of SIGKILL.
func killed(_ context.Context, w *world, _ *workload) (bool, string) {
	n := w.killedExits()
	return n >= 1, fmt.Sprintf("%d instances killed by SIGKILL (want >= 1)", n)
}

// handledAfterFault is the evidence that paysvc went on after the fault:
// messages handled after it, and how long the first took to come.
func handledAfterFault(_ context.Context, w *world, _ *workload) (bool, string) {
	w.mu.Lock()
	at := w.faultAt
	w.mu.Unlock()
	if at.IsZero() {
		return false, "the fault never happened"
	}
	n := 0
	var first time.Time
	for _, e := range w.entries() {
		if e.str("msg") == "message handled" && e.at().After(at) {
			n++
			if first.IsZero() || e.at().Before(first) {
				first = e.at()
			}
		}
	}
	if n == 0 {
		return false, "no message handled after the fault"
	}
	return true, fmt.Sprintf("%d messages handled after the fault, the first %s after it", n, first.Sub(at).Round(10*time.Millisecond))
}

// pausedWithoutMajority is the evidence that the quorum queue stopped while
// the cluster had no majority: no message was handled in that window (from
// a second after the second node died to the restart of one of them).
func pausedWithoutMajority(_ context.Context, w *world, _ *workload) (bool, string) {
	w.mu.Lock()
	from, to := w.minority.Add(time.Second), w.majority
	w.mu.Unlock()
	if from.IsZero() || to.IsZero() {
		return false, "the cluster never lost its majority"
	}
	// A message sent back (REQUEUE: its copy could not be stored, its
	// handling began before the loss) is what a pause looks like; any other
	// outcome is progress the cluster could not have made.
	n := count(w.entries(), func(e entry) bool {
		return e.str("msg") == "message handled" && e.str("result") != "REQUEUE" && e.at().After(from) && e.at().Before(to)
	})
	return n == 0, fmt.Sprintf("%d messages handled (other than sent back) without a majority over %s (want 0: the queue pauses)",
		n, to.Sub(from).Round(100*time.Millisecond))
}
