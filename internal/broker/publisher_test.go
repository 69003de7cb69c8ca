package broker_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/testenv"
)

// A batch whose publishing stops half way reports every message unsent:
// the ones before the failure were never confirmed. (The outbox marks a
// notice SENT on a nil error: a nil here for an unconfirmed message would
// lose the notice if the broker never stored it.)
func TestPublishBatchFailingHalfWayConfirmsNothing(t *testing.T) {
	t.Parallel()
	u := testenv.AMQP(t)
	const queue = "batch"
	testenv.Declare(t, u, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
		return err
	})
	conn, err := broker.Dial(u, t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pub := broker.NewPublisher(conn, 10*time.Second)
	defer pub.Close()
	msgs := make([]amqp.Publishing, 10)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprint("m", i), Body: []byte("{}")}
	}
	msgs[5].Headers = amqp.Table{"bad": struct{}{}} // amqp091 refuses to send it
	for i, err := range pub.PublishBatch(context.Background(), "", queue, msgs) {
		if err == nil {
			t.Errorf("message %d: nil error, but the batch stopped at message 5 before any confirm", i)
		}
	}
	// The publisher recovers: the next batch goes through.
	msgs[5].Headers = nil
	for i, err := range pub.PublishBatch(context.Background(), "", queue, msgs) {
		if err != nil {
			t.Fatalf("message %d of the next batch: %v", i, err)
		}
	}
}

// A batch whose confirm wait fails half way reports every message unsent,
// the confirmed ones included: one of them may have been returned
// unroutable, and its return is lost with the channel. Here the first
// message is returned (no queue is bound to the exchange) and confirmed,
// and the second never reaches the broker, so its confirm never comes.
// (Reported before the fix as sent: the outbox would have marked a notice
// no queue holds SENT.)
func TestPublishBatchTimingOutHalfWayKeepsAReturnedMessageUnsent(t *testing.T) {
	t.Parallel()
	u := testenv.AMQP(t)
	const exchange = "nowhere"
	testenv.Declare(t, u, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil)
	})
	proxied, cut := dropAfterFirstPublish(t, u)
	conn, err := broker.Dial(proxied, t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	defer cut() // first: the broker never gets the connection's close
	pub := broker.NewPublisher(conn, 2*time.Second)
	msgs := []amqp.Publishing{{MessageId: "m0", Body: []byte("{}")}, {MessageId: "m1", Body: []byte("{}")}}
	errs := pub.PublishBatch(context.Background(), exchange, "x", msgs)
	if errs[1] == nil {
		t.Fatal("message 1: nil error, but it never reached the broker")
	}
	if !errors.Is(errs[1], context.DeadlineExceeded) {
		t.Fatalf("message 1: %v, want the confirm wait's timeout (the setup did not stall the batch)", errs[1])
	}
	if errs[0] == nil {
		t.Error("message 0: nil error, but the broker returned it unroutable")
	}
}

// dropAfterFirstPublish returns amqpURL pointed at a proxy that passes the
// client's frames until its second basic.publish and drops that and
// everything after it, while the broker's replies keep flowing; cut closes
// the proxied connections.
func dropAfterFirstPublish(t *testing.T, amqpURL string) (proxied string, cut func()) {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	broker := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	cut = func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
	t.Cleanup(cut)
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", broker)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			go io.Copy(client, server)
			go forwardFrames(server, client)
		}
	}()
	u.Host = ln.Addr().String()
	return u.String(), cut
}

// forwardFrames copies the client's protocol header and then its frames
// (type, channel, size, payload, end) to dst, up to its second
// basic.publish (class 60, method 40); the rest it reads and drops.
func forwardFrames(dst, src net.Conn) {
	r := bufio.NewReader(src)
	header := make([]byte, 8) // "AMQP" 0 0 9 1
	if _, err := io.ReadFull(r, header); err != nil {
		return
	}
	if _, err := dst.Write(header); err != nil {
		return
	}
	publishes := 0
	for {
		head := make([]byte, 7)
		if _, err := io.ReadFull(r, head); err != nil {
			return
		}
		rest := make([]byte, binary.BigEndian.Uint32(head[3:7])+1)
		if _, err := io.ReadFull(r, rest); err != nil {
			return
		}
		if head[0] == 1 && len(rest) > 4 && binary.BigEndian.Uint16(rest[0:2]) == 60 && binary.BigEndian.Uint16(rest[2:4]) == 40 {
			publishes++
		}
		if publishes >= 2 {
			continue
		}
		if _, err := dst.Write(append(head, rest...)); err != nil {
			return
		}
	}
}
