package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/testenv"
)

// paydemo publish sends each demo message once, through the producer kit:
// persistent, with a traceparent and a timestamp.
func TestPublishSendsEachDemoMessage(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	testenv.Declare(t, url, func(ch *amqp.Channel) error { return listener.Declare(ch, []time.Duration{time.Second}) })
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-amqp", url, "publish"}, &out); err != nil {
		t.Fatalf("publish: %v\n%s", err, out.String())
	}
	got := testenv.GetAll(t, url, listener.MainQueue)
	if len(got) != len(messages) {
		t.Fatalf("%d messages in the queue, want %d", len(got), len(messages))
	}
	for i, d := range got {
		if string(d.Body) != messages[i].body || d.DeliveryMode != amqp.Persistent || d.Headers["traceparent"] == nil || d.Timestamp.IsZero() {
			t.Errorf("message %d: %s, mode %d, headers %v, timestamp %s; want %s", i, d.Body, d.DeliveryMode, d.Headers, d.Timestamp, messages[i].body)
		}
	}
	if n := strings.Count(out.String(), "published "); n != len(messages) {
		t.Errorf("%d lines say published, want %d:\n%s", n, len(messages), out.String())
	}
}
