// Command examples publishes payments to paysvc through pkg/producer: the
// Go counterpart of producer.js and producer.py beside it, with the same
// arguments and output.
//
//	PAYSVC_AMQP_URLS=amqp://user:pass@node1:5672/vhost,amqp://...node2... \
//	  go run ./docs/contract/examples ORDER_NO:USER_ID:AMOUNT...
//
// It prints "confirmed ORDER_NO" for each payment the broker confirmed and
// "failed ORDER_NO: why" for the others, and exits 1 when one failed.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/paysvc/paysvc/pkg/producer"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// cut splits s at its last colon.
func cut(s string) (before, after string, ok bool) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

func run(args []string) error {
	var payments []producer.Payment
	for _, arg := range args {
		// An order number may hold colons: the last two fields are the
		// user id and the amount.
		rest, amount, ok1 := cut(arg)
		orderNo, userID, ok2 := cut(rest)
		if !ok1 || !ok2 {
			return fmt.Errorf("%q: want ORDER_NO:USER_ID:AMOUNT", arg)
		}
		user, err := strconv.ParseInt(userID, 10, 64)
		if err != nil {
			return fmt.Errorf("%q: user id: %w", arg, err)
		}
		payments = append(payments, producer.Payment{OrderNo: orderNo, UserID: user, Amount: amount})
	}
	p, err := producer.New(producer.Config{
		URLs: strings.Split(os.Getenv("PAYSVC_AMQP_URLS"), ","),
		Name: "producer.go",
		// 10 attempts: about half a minute of backoff before a payment is
		// reported failed.
		Attempts: 10,
	})
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var failed []error
	for i, err := range p.PublishBatch(ctx, payments) {
		if err != nil {
			fmt.Printf("failed %s: %v\n", payments[i].OrderNo, err)
			failed = append(failed, err)
			continue
		}
		fmt.Printf("confirmed %s\n", payments[i].OrderNo)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d payments not confirmed: keep them and publish them again", len(failed), len(payments))
	}
	return nil
}
