package order_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// script is a driver whose connections answer a payment group with counts
// rows-affected figures and its COMMIT with commitErr, and log what they
// were sent. It stands in for a server misbehaving in ways MariaDB will not
// do on request.
type script struct {
	counts    []int64
	commitErr error

	mu      sync.Mutex
	sent    []string
	queries []string
	closed  int
}

func (s *script) Connect(context.Context) (driver.Conn, error) { return &scriptConn{s}, nil }
func (s *script) Driver() driver.Driver                        { return scriptDriver{s} }

type scriptDriver struct{ s *script }

func (d scriptDriver) Open(string) (driver.Conn, error) { return &scriptConn{d.s}, nil }

func (s *script) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sent...)
}

type scriptConn struct{ s *script }

func (c *scriptConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("no prepare") }
func (c *scriptConn) Begin() (driver.Tx, error)           { return nil, errors.New("no begin") }
func (c *scriptConn) Close() error {
	c.s.mu.Lock()
	c.s.closed++
	c.s.mu.Unlock()
	return nil
}

func (c *scriptConn) ExecContext(_ context.Context, q string, _ []driver.NamedValue) (driver.Result, error) {
	word := strings.Fields(q)[0]
	c.s.mu.Lock()
	c.s.sent = append(c.s.sent, word)
	c.s.queries = append(c.s.queries, q)
	c.s.mu.Unlock()
	switch word {
	case "START":
		return counts(c.s.counts), nil
	case "COMMIT":
		return counts(nil), c.s.commitErr
	}
	return counts(nil), nil
}

// counts is a result as go-sql-driver returns for a multi-statement.
type counts []int64

func (r counts) LastInsertId() (int64, error) { return 0, nil }
func (r counts) RowsAffected() (int64, error) { return 0, nil }
func (r counts) AllLastInsertIds() []int64    { return make([]int64, len(r)) }
func (r counts) AllRowsAffected() []int64     { return r }

var _ mysql.Result = counts(nil)

func scripted(s *script) *order.Store {
	return order.NewStore(sqlx.NewDb(sql.OpenDB(s), "mysql"))
}

// A server answering with fewer (or more) results than the group sent
// statements is not trusted: nothing is committed, the group is rolled
// back, and nothing is reported applied.
func TestPayGroupRefusesAMiscountedAnswer(t *testing.T) {
	t.Parallel()
	ps := []order.Payment{pay("M1", 1, 100), pay("M2", 2, 100)}
	for _, n := range []int{1 + 4 - 1, 1 + 4 + 1} { // START TRANSACTION and four statements
		all := make([]int64, n)
		for i := range all {
			all[i] = 1
		}
		s := &script{counts: all}
		applied, err := order.PayGroup(scripted(s), context.Background(), ps)
		if err == nil || errors.Is(err, sqldb.ErrCommitUnknown) {
			t.Errorf("%d results: payGroup error %v, want a plain error", n, err)
		}
		for _, a := range applied {
			if a {
				t.Errorf("%d results: applied %v", n, applied)
			}
		}
		if sent := s.log(); strings.Join(sent, " ") != "START ROLLBACK" {
			t.Errorf("%d results: sent %v, want START then ROLLBACK", n, sent)
		}
	}
}

// A COMMIT that fails leaves the group's outcome unknown, and the
// connection, whose state is unknown too, is discarded.
func TestPayGroupDiscardsTheConnectionAfterAFailedCommit(t *testing.T) {
	t.Parallel()
	s := &script{counts: []int64{0, 2, 2, 2, 2}, commitErr: &mysql.MySQLError{Number: 1180, Message: "got error during COMMIT"}}
	applied, err := order.PayGroup(scripted(s), context.Background(), []order.Payment{pay("K1", 1, 100), pay("K2", 2, 100)})
	if !errors.Is(err, sqldb.ErrCommitUnknown) || len(applied) != 2 || !applied[0] || !applied[1] {
		t.Fatalf("payGroup = %v, %v; want both in an unknown COMMIT", applied, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed != 1 {
		t.Fatalf("connection closed %d times, want 1 (discarded, not pooled)", s.closed)
	}
}

// A group costs the same statements whatever its size: START TRANSACTION
// and four statements in one round trip (orders, flows, balances, notices),
// then COMMIT, and commits only with every count what it must be (an order,
// a flow and a notice per payment, an account per user).
func TestPayGroupSendsFourStatementsWhateverItsSize(t *testing.T) {
	t.Parallel()
	var ps []order.Payment
	for i := range 10 {
		ps = append(ps, pay(fmt.Sprintf("S%02d", i), int64(i%3+1), 100))
	}
	s := &script{counts: []int64{0, 10, 10, 3, 10}}
	applied, err := order.PayGroup(scripted(s), context.Background(), ps)
	if err != nil || slices.Contains(applied, false) {
		t.Fatalf("payGroup = %v, %v; want all applied", applied, err)
	}
	if sent := s.log(); strings.Join(sent, " ") != "START COMMIT" {
		t.Fatalf("sent %v, want START then COMMIT", sent)
	}
	s.mu.Lock()
	q := s.queries[0]
	s.mu.Unlock()
	if n := strings.Count(q, ";\n"); n != 4 {
		t.Fatalf("%d statements after START TRANSACTION, want 4:\n%s", n, q)
	}
	for _, c := range [][]int64{{0, 9, 10, 3, 10}, {0, 10, 10, 2, 10}, {0, 10, 10, 3, 9}} {
		s := &script{counts: c}
		applied, err := order.PayGroup(scripted(s), context.Background(), ps)
		if slices.Contains(applied, true) {
			t.Errorf("counts %v: applied %v, %v", c, applied, err)
		}
		if sent := s.log(); sent[len(sent)-1] == "COMMIT" || !slices.Contains(sent, "ROLLBACK") {
			t.Errorf("counts %v: sent %v, want a ROLLBACK and no COMMIT", c, sent)
		}
	}
}
