package broker_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/testenv"
)

// A broker that goes silent after the client's login is a network or
// broker problem, not a refused login, although amqp091 reports it as one.
func TestSilentHandshakeIsNotARefusedLogin(t *testing.T) {
	t.Parallel()
	p, u := testenv.AMQPProxy(t, testenv.AMQP(t))
	p.BlackholeWhen(testenv.IsAMQPStartOk)
	started := time.Now()
	conn, err := broker.Dial(u, t.Name(), nil)
	if err == nil {
		conn.Close()
		t.Fatal("Dial succeeded through a black hole")
	}
	if broker.LoginRefused(err) || !strings.Contains(err.Error(), "no answer within") {
		t.Fatalf("Dial = %v, want a handshake that got no answer", err)
	}
	if took := time.Since(started); took > 10*time.Second {
		t.Fatalf("Dial took %s", took)
	}
}

// A connection cut during the login, and a wrong password, both read as a
// refused login; an undisturbed dial with the right one works.
func TestRefusedLogin(t *testing.T) {
	t.Parallel()
	good := testenv.AMQP(t)
	p, u := testenv.AMQPProxy(t, good)
	p.CutWhen(testenv.IsAMQPStartOk)
	if _, err := broker.Dial(u, t.Name(), nil); !broker.LoginRefused(err) {
		t.Fatalf("Dial through a cut = %v, want a refused login", err)
	}
	bad, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	bad.User = url.UserPassword(bad.User.Username(), "not-the-password")
	_, err = broker.Dial(bad.String(), t.Name(), nil)
	if !broker.LoginRefused(err) {
		t.Fatalf("Dial with a wrong password = %v, want a refused login", err)
	}
	if strings.Contains(err.Error(), "not-the-password") {
		t.Fatalf("the error shows the password: %v", err)
	}
	conn, err := broker.Dial(good, t.Name(), nil)
	if err != nil {
		t.Fatalf("Dial = %v", err)
	}
	conn.Close()
}
