package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// URLs splits amqp.url: one URL, or several (the nodes of a cluster),
// comma-separated. A comma inside a password must be written %2C.
func URLs(list string) []string {
	var out []string
	for _, u := range strings.Split(list, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// Dial connects with paysvc's connection settings to the first node of urls
// (a comma-separated list, see URLs) that answers, trying each once in
// turn from a random one: replicas spread over a cluster, and a dead node
// is tried at most once per dial. tlsCfg (may be nil: the
// system roots) is used for amqps:// URLs. The connection's RemoteAddr says
// which node it reached.
func Dial(urls, name string, tlsCfg *tls.Config) (*amqp.Connection, error) {
	list := URLs(urls)
	if len(list) == 0 {
		return nil, errors.New("amqp dial: no URL")
	}
	start := rand.IntN(len(list))
	var errs []error
	for i := range list {
		conn, err := dialOne(list[(start+i)%len(list)], name, tlsCfg)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	// amqp091's errors never carry the URL, so no password leaks here.
	return nil, fmt.Errorf("amqp dial: %w", errors.Join(errs...))
}

// dialTimeout bounds a dial: the TCP connect, then the TLS and AMQP
// handshakes together.
const dialTimeout = 5 * time.Second

func dialOne(url, name string, tlsCfg *tls.Config) (*amqp.Connection, error) {
	if tlsCfg != nil {
		// amqp091 writes ServerName into the config it is given: every dial
		// gets its own copy, or concurrent dials race.
		tlsCfg = tlsCfg.Clone()
	}
	started := time.Now()
	conn, err := amqp.DialConfig(url, amqp.Config{
		Heartbeat:       10 * time.Second,
		Locale:          "en_US",
		Properties:      amqp.Table{"connection_name": name},
		TLSClientConfig: tlsCfg,
		Dial:            amqp.DefaultDial(dialTimeout),
	})
	if LoginRefused(err) && time.Since(started) >= dialTimeout {
		// amqp091 reports a handshake that ran out of time after start-ok
		// as a refused login; it was a silent network or broker.
		return nil, fmt.Errorf("amqp handshake: no answer within %s", dialTimeout)
	}
	return conn, err
}

// LoginRefused reports a dial that the broker ended during login or while
// opening the vhost, without saying why: wrong credentials or vhost
// permissions, most likely, but amqp091 reports a connection cut in the
// middle of the handshake the same way. A caller that stops on it should
// see it more than once first.
func LoginRefused(err error) bool {
	return errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost)
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

// CloseTimeout bounds CloseConn's wait for the broker's close-ok.
const CloseTimeout = 5 * time.Second

// CloseConn closes conn, waiting at most CloseTimeout for the broker: a
// broker that blocked the connection (a resource alarm) may never answer
// the close, and amqp091's Close would wait for the heartbeat to declare
// the connection dead, holding up a shutdown. Even CloseDeadline is not
// bound by its deadline alone (measured: 10 s for 5 on a blocked
// connection; the broker's heartbeats move the socket's read deadline), so
// the wait is cut here and the close finishes, or fails, on its own.
func CloseConn(conn *amqp.Connection) error {
	done := make(chan error, 1)
	go func() { done <- conn.CloseDeadline(time.Now().Add(CloseTimeout)) }()
	t := time.NewTimer(CloseTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("amqp: no close-ok within %s", CloseTimeout)
	}
}

// Close closes the connection.
func (d *DialingPublisher) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closeLocked()
}

func (d *DialingPublisher) closeLocked() {
	if d.conn != nil {
		CloseConn(d.conn)
		d.conn, d.pub = nil, nil
	}
}
