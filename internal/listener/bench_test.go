package listener

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/account"
)

// Hot-path micro-benchmarks: go test -bench . -benchmem ./internal/listener/

func BenchmarkDecodePayment(b *testing.B) {
	body := []byte(`{"orderNo":"P20260928001","userId":10086,"amount":199.00,"channel":"wechat"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodePayment(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkClassify(b *testing.B) {
	err := fmt.Errorf("order P1: pay: deduct P1: %w", account.ErrInsufficientBalance)
	b.ReportAllocs()
	for b.Loop() {
		classify(err)
	}
}

func BenchmarkFailedCopy(b *testing.B) {
	d := amqp.Delivery{Body: []byte(`{"orderNo":"P1","userId":1,"amount":1}`), Headers: amqp.Table{"x-retry-count": int32(1)}}
	err := fmt.Errorf("order P1: %w", account.ErrInsufficientBalance)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		failedCopy(d, TerminalQueue, 2, ClassBalance, err, now)
	}
}
