package broker

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Dial connects with paysvc's connection settings. tlsCfg (may be nil: the
// system roots) is used for amqps:// URLs.
func Dial(url, name string, tlsCfg *tls.Config) (*amqp.Connection, error) {
	if tlsCfg != nil {
		// amqp091 writes ServerName into the config it is given: every dial
		// gets its own copy, or concurrent dials race.
		tlsCfg = tlsCfg.Clone()
	}
	conn, err := amqp.DialConfig(url, amqp.Config{
		Heartbeat:       10 * time.Second,
		Locale:          "en_US",
		Properties:      amqp.Table{"connection_name": name},
		TLSClientConfig: tlsCfg,
	})
	if err != nil {
		// amqp091's errors never carry the URL, so no password leaks here.
		return nil, fmt.Errorf("amqp dial: %w", err)
	}
	return conn, nil
}

// DialingPublisher is a Publisher that owns its connection: it dials on
// first use and again after a failure. Safe for concurrent use (publishes are
// serialised); for occasional publishing such as replays.
type DialingPublisher struct {
	URL     string
	Name    string
	Timeout time.Duration
	TLS     *tls.Config

	mu   sync.Mutex
	conn *amqp.Connection
	pub  *Publisher
}

// Publish publishes msg with confirms and mandatory routing.
func (d *DialingPublisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil || d.conn.IsClosed() {
		conn, err := Dial(d.URL, d.Name, d.TLS)
		if err != nil {
			return err
		}
		d.conn, d.pub = conn, NewPublisher(conn, d.Timeout)
	}
	err := d.pub.Publish(ctx, exchange, key, msg)
	if err != nil {
		d.closeLocked()
	}
	return err
}

// Close closes the connection.
func (d *DialingPublisher) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closeLocked()
}

func (d *DialingPublisher) closeLocked() {
	if d.conn != nil {
		d.conn.Close()
		d.conn, d.pub = nil, nil
	}
}
