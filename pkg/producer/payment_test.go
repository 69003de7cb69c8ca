package producer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/tracing"
	"github.com/paysvc/paysvc/pkg/producer"
)

func TestQueueIsPaysvcs(t *testing.T) {
	if producer.Queue != listener.MainQueue {
		t.Fatalf("producer.Queue = %q, paysvc consumes %q", producer.Queue, listener.MainQueue)
	}
}

// Payment.Message refuses what paysvc would park as bad_message, and
// what it encodes paysvc decodes to the same payment.
func TestPaymentMessageAgreesWithPaysvc(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	amounts := []string{"199.00", "0.01", "0.1", "0.10", "5", "9999999999999999.99", "1.5",
		"0", "0.00", "-1", "+1", "01", "1.", ".5", "1.001", "1e2", " 1", "1 ", "10000000000000000", "", "1,5", "NaN"}
	orders := []string{"P1", strings.Repeat("A", 64), "0a_b.c:d-", "",
		strings.Repeat("A", 65), "-P1", "P 1", "Pé", "P/1", "P1\n"}
	users := []int64{1, 10086, 1<<63 - 1, 0, -1}
	for range 3000 {
		pay := producer.Payment{
			OrderNo: orders[r.IntN(len(orders))],
			UserID:  users[r.IntN(len(users))],
			Amount:  amounts[r.IntN(len(amounts))],
		}
		if r.IntN(3) == 0 { // a random valid amount
			pay.Amount = money.Cents(1 + r.Int64N(int64(money.Max))).String()
		}
		m, err := pay.Message()
		// What a hand-written producer would send for the same payment.
		naive := fmt.Sprintf(`{"orderNo":%s,"userId":%d,"amount":%s}`, strconv.Quote(pay.OrderNo), pay.UserID, strconv.Quote(pay.Amount))
		want, werr := listener.DecodePayment([]byte(naive))
		if (err == nil) != (werr == nil) {
			t.Fatalf("%+v: Message: %v; paysvc: %v", pay, err, werr)
		}
		if err != nil {
			if !errors.Is(err, producer.ErrInvalid) {
				t.Fatalf("%+v: %v is not ErrInvalid", pay, err)
			}
			continue
		}
		got, derr := listener.DecodePayment(m.Body)
		if derr != nil || got != want {
			t.Fatalf("%+v encodes %s, which paysvc decodes to %+v, %v; want %+v", pay, m.Body, got, derr, want)
		}
	}
}

func TestNewTraceparentIsValid(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		tp := producer.NewTraceparent()
		c, ok := tracing.Parse(tp)
		if !ok || c.Flags != 1 || seen[c.TraceIDHex()] {
			t.Fatalf("NewTraceparent() = %q: parsed %v, sampled %v, seen before %v", tp, ok, c.Flags == 1, seen[c.TraceIDHex()])
		}
		seen[c.TraceIDHex()] = true
	}
}
