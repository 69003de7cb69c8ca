package producer_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/paysvc/paysvc/pkg/producer"
)

// A producer publishes a payment and keeps it when it was not confirmed.
func Example() {
	p, err := producer.New(producer.Config{
		URLs: []string{"amqp://app:secret@rabbit-1:5672/pay", "amqp://app:secret@rabbit-2:5672/pay"},
		Name: "checkout",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = p.Publish(ctx, producer.Payment{
		OrderNo:     "P20260928001",
		UserID:      10086,
		Amount:      "199.00",
		Traceparent: producer.NewTraceparent(), // or the current span's
	})
	switch {
	case errors.Is(err, producer.ErrInvalid):
		log.Printf("never publishable, fix the payment: %v", err)
	case err != nil:
		log.Printf("not confirmed, keep it and publish it again later: %v", err)
	}
}
