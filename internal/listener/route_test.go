package listener

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/order"

	"github.com/paysvc/paysvc/internal/metrics"
)

func TestRoute(t *testing.T) {
	p := RetryPolicy{Delays: []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}, MaxAttempts: 3}
	fail := errors.New("boom")
	out := func(kind Kind, class Class) outcome {
		o := outcome{kind: kind, class: class, orderNo: "P1"}
		if kind != Applied {
			o.err = fail
		}
		return o
	}
	inFlight := out(Retryable, ClassInFlight)
	inFlight.wait = 1500 * time.Millisecond
	heldLocked := out(Retryable, ClassLockWait)
	heldLocked.err = fmt.Errorf("user 7: %w: %w", order.ErrAccountLocked, fail)
	h := func(kv ...any) amqp.Table {
		t := amqp.Table{}
		for i := 0; i < len(kv); i += 2 {
			t[kv[i].(string)] = kv[i+1]
		}
		return t
	}
	tests := []struct {
		name    string
		out     outcome
		headers amqp.Table
		letGo   bool
		want    action
		cause   string // the copy's x-last-error, when not the outcome's
		err     string // the error logged, when not the outcome's
	}{
		{
			name:    "applied",
			out:     out(Applied, ClassNone),
			headers: h(HeaderRetryCount, int32(2)),
			want:    action{result: ResultFirst, attempt: 2},
		},
		{
			name: "duplicate",
			out:  out(Duplicate, ClassNone),
			want: action{result: ResultDuplicate},
		},
		{
			name: "retryable, first attempt",
			out:  out(Retryable, ClassBalance),
			want: action{result: ResultRetry, attempt: 1, copy: &copySpec{exchange: DLXExchange, queue: "q.pay.dlx.wait.1s", count: 1, class: ClassBalance}},
		},
		{
			name:    "retryable, attempt 3",
			out:     out(Retryable, ClassDeadlock),
			headers: h(HeaderRetryCount, int32(2)),
			want:    action{result: ResultRetry, attempt: 3, copy: &copySpec{exchange: DLXExchange, queue: "q.pay.dlx.wait.3s", count: 3, class: ClassDeadlock}},
		},
		{
			name:    "retryable, budget spent",
			out:     out(Retryable, ClassBalance),
			headers: h(HeaderRetryCount, int32(3)),
			want:    action{result: ResultTerminal, attempt: 3, copy: &copySpec{exchange: DLXExchange, queue: TerminalQueue, count: 3, class: ClassBalance}},
			cause:   "gave up after 3 retries: boom",
		},
		{
			name:    "terminal",
			out:     out(Terminal, ClassMismatch),
			headers: h(HeaderRetryCount, int32(1)),
			want:    action{result: ResultTerminal, attempt: 1, copy: &copySpec{exchange: DLXExchange, queue: TerminalQueue, count: 1, class: ClassMismatch}},
		},
		{
			name: "terminal, bad message",
			out:  out(Terminal, ClassBadMessage),
			want: action{result: ResultTerminal, copy: &copySpec{exchange: DLXExchange, queue: TerminalQueue, class: ClassBadMessage}},
		},
		{
			name:    "in flight: waits out the lease, no attempt spent",
			out:     inFlight,
			headers: h(HeaderRetryCount, int32(1), HeaderInFlightCount, int32(4)),
			want:    action{result: ResultRetry, attempt: 1, copy: &copySpec{exchange: DLXExchange, queue: "q.pay.dlx.wait.2s", count: 1, class: ClassInFlight, inflight: 5}},
		},
		{
			name:    "account row found locked: waits it out, no attempt spent",
			out:     heldLocked,
			headers: h(HeaderRetryCount, int32(1), HeaderInFlightCount, int32(2)),
			want:    action{result: ResultRetry, attempt: 1, copy: &copySpec{exchange: DLXExchange, queue: "q.pay.dlx.wait.1s", count: 1, class: ClassLockWait, inflight: 3}},
		},
		{
			name:    "lock wait timeout itself: spends an attempt",
			out:     out(Retryable, ClassLockWait),
			headers: h(HeaderRetryCount, int32(1)),
			want:    action{result: ResultRetry, attempt: 2, copy: &copySpec{exchange: DLXExchange, queue: "q.pay.dlx.wait.2s", count: 2, class: ClassLockWait}},
		},
		{
			name:    "in flight past its budget: spends an attempt",
			out:     inFlight,
			headers: h(HeaderRetryCount, int32(1), HeaderInFlightCount, int32(maxInFlightRetries)),
			want:    action{result: ResultRetry, attempt: 2, copy: &copySpec{exchange: DLXExchange, queue: "q.pay.dlx.wait.2s", count: 2, class: ClassInFlight, inflight: maxInFlightRetries}},
		},
		{
			name:    "unavailable, dependencies up: requeued alone",
			out:     out(Unavailable, ClassTimeout),
			headers: h(HeaderRetryCount, int32(1)),
			want:    action{result: ResultRequeue, attempt: 1, copy: &copySpec{exchange: RetryExchange, queue: MainQueue, count: 1, class: ClassTimeout, requeues: 1}},
		},
		{
			name:    "unavailable, requeued twice",
			out:     out(Unavailable, ClassCommitUnknown),
			headers: h(HeaderRequeueCount, int32(2)),
			want:    action{result: ResultRequeue, copy: &copySpec{exchange: RetryExchange, queue: MainQueue, class: ClassCommitUnknown, requeues: 3}},
		},
		{
			name:    "unavailable, requeues alone spent: an attempt",
			out:     out(Unavailable, ClassTimeout),
			headers: h(HeaderRequeueCount, int32(maxRequeuesAlone)),
			want:    action{result: ResultRetry, attempt: 1, copy: &copySpec{exchange: DLXExchange, queue: "q.pay.dlx.wait.1s", count: 1, class: ClassTimeout}},
			cause:   "requeued 3 times without an attempt: boom",
			err:     "requeued 3 times without an attempt: boom",
		},
		{
			name:    "unavailable, requeues alone and attempts spent",
			out:     out(Unavailable, ClassTimeout),
			headers: h(HeaderRetryCount, int32(3), HeaderRequeueCount, int32(maxRequeuesAlone)),
			want:    action{result: ResultTerminal, attempt: 3, copy: &copySpec{exchange: DLXExchange, queue: TerminalQueue, count: 3, class: ClassTimeout}},
			cause:   "gave up after 3 retries: requeued 3 times without an attempt: boom",
			err:     "requeued 3 times without an attempt: boom",
		},
		{
			name:    "unavailable, let go at the session's end",
			out:     out(Unavailable, ClassRedisUnavailable),
			headers: h(HeaderRetryCount, int32(2), HeaderRequeueCount, int32(maxRequeuesAlone)),
			letGo:   true,
			want:    action{result: ResultRequeue, nack: true, attempt: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := route(tt.out, tt.headers, p, tt.letGo)
			wantErr := errText(tt.out.err)
			if tt.err != "" {
				wantErr = tt.err
			}
			if errText(got.err) != wantErr || (got.err != nil && !errors.Is(got.err, fail)) {
				t.Errorf("err %v, want %q wrapping the outcome's", got.err, wantErr)
			}
			if tt.want.copy != nil && got.copy != nil {
				wantCause := errText(tt.out.err)
				if tt.cause != "" {
					wantCause = tt.cause
				}
				if errText(got.copy.cause) != wantCause {
					t.Errorf("copy cause %v, want %q", got.copy.cause, wantCause)
				}
				g, w := *got.copy, *tt.want.copy
				g.cause, w.cause = nil, nil
				if g != w {
					t.Errorf("copy %+v, want %+v", g, w)
				}
			} else if (got.copy == nil) != (tt.want.copy == nil) {
				t.Errorf("copy %+v, want %+v", got.copy, tt.want.copy)
			}
			if got.result != tt.want.result || got.nack != tt.want.nack || got.attempt != tt.want.attempt {
				t.Errorf("result %s nack %v attempt %d; want %s nack %v attempt %d",
					got.result, got.nack, got.attempt, tt.want.result, tt.want.nack, tt.want.attempt)
			}
		})
	}
}

// The copy route asks for carries its counts; the delivery's other headers
// travel along.
func TestCopySpecPublishing(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	d := amqp.Delivery{Body: []byte(`{}`), Headers: amqp.Table{"trace-id": "abc", HeaderInFlightCount: int32(2), HeaderRequeueCount: int32(1)}}
	alone := route(outcome{kind: Unavailable, class: ClassTimeout, err: errors.New("timeout")}, d.Headers, RetryPolicy{}, false)
	msg := alone.copy.publishing(d, now)
	if msg.Headers[HeaderRequeueCount] != int32(2) || msg.Headers[HeaderInFlightCount] != int32(2) ||
		msg.Headers[HeaderRoutedTo] != MainQueue || msg.Headers["trace-id"] != "abc" || msg.Headers[HeaderLastError] != "timeout" {
		t.Fatalf("requeue alone: %v", msg.Headers)
	}
	retry := route(outcome{kind: Retryable, class: ClassBalance, err: errors.New("poor")}, d.Headers,
		RetryPolicy{Delays: []time.Duration{time.Second}, MaxAttempts: 1}, false)
	msg = retry.copy.publishing(d, now)
	if msg.Headers[HeaderRequeueCount] != nil || msg.Headers[HeaderRetryCount] != int32(1) ||
		msg.Headers[HeaderRoutedTo] != "q.pay.dlx.wait.1s" || msg.Headers[HeaderErrorClass] != "balance_not_enough" {
		t.Fatalf("retry: %v", msg.Headers)
	}
}

// The label values of paysvc_messages_total are the Result strings, every
// one present from the start; deploy/ (alerts, dashboards) uses them.
func TestResultStrings(t *testing.T) {
	var want []string
	for _, r := range results {
		want = append(want, r.String())
	}
	if strings.Join(want, " ") != "FIRST DUPLICATE RETRY TERMINAL REQUEUE" {
		t.Fatalf("results %v", want)
	}
	families, err := metrics.New().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range families {
		if f.GetName() != "paysvc_messages_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					got = append(got, l.GetValue())
				}
			}
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("paysvc_messages_total results %v, want %v", got, want)
	}
}
