// Command paydemo drives the demo (make demo): it resets and seeds a demo
// database, publishes payments (duplicates, an insufficient balance, malformed
// messages), waits until paysvc has settled them, and prints what resulted.
//
//	paydemo -dsn DSN -amqp URL reset     drop and create the demo database
//	paydemo -dsn DSN -amqp URL seed      insert the demo accounts and orders
//	paydemo -dsn DSN -amqp URL publish   publish the demo messages
//	paydemo -dsn DSN -amqp URL report    wait until settled, then print
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/pkg/producer"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "paydemo: %v\n", err)
		os.Exit(1)
	}
}

// The demo's messages: what each one shows.
var messages = []struct{ body, note string }{
	{`{"orderNo":"P20260928001","userId":10086,"amount":199.00}`, "first delivery: applied"},
	{`{"orderNo":"P20260928001","userId":10086,"amount":199.00}`, "redelivery: duplicate"},
	{`{"orderNo":"P20260928001","userId":10086,"amount":"199.00","channel":"wechat"}`, "another duplicate (string amount, extra field)"},
	{`{"orderNo":"P20260928002","userId":10086,"amount":"88.50"}`, "second payment of the same user: applied"},
	{`{"orderNo":"P20260928003","userId":10087,"amount":199.00}`, "balance 50.00 < 199.00: retries, then terminal"},
	{`{"orderNo":"P20260928004","userId":10088,"amount":12.345}`, "three decimals: bad message, terminal at once"},
	{`{"orderNo":"P20260928005","userId":10088,"amount":10.00}`, "amount differs from the order's 20.00: terminal"},
	{`this is not json`, "malformed: terminal at once"},
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("paydemo", flag.ContinueOnError)
	dsn := fs.String("dsn", "root@tcp(127.0.0.1:3306)/paysvc_demo", "MySQL DSN of the demo database")
	amqpURL := fs.String("amqp", "amqp://guest:guest@127.0.0.1:5672/paysvc_demo", "AMQP URL with the demo vhost")
	terminal := fs.Int("expect-terminal", 4, "report: terminal messages to wait for")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: paydemo [flags] reset|seed|publish|report")
	}
	switch fs.Arg(0) {
	case "reset":
		return reset(ctx, *dsn)
	case "seed":
		return withDB(ctx, *dsn, seed)
	case "publish":
		return publish(ctx, *amqpURL, out)
	case "report":
		return withDB(ctx, *dsn, func(ctx context.Context, db *sqlx.DB) error {
			return report(ctx, db, *amqpURL, *terminal, out)
		})
	}
	return fmt.Errorf("unknown command %q", fs.Arg(0))
}

func reset(ctx context.Context, dsn string) error {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return err
	}
	name := cfg.DBName
	cfg.DBName = ""
	db, err := sqldb.Open(ctx, cfg.FormatDSN(), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
	return err
}

func withDB(ctx context.Context, dsn string, f func(context.Context, *sqlx.DB) error) error {
	db, err := sqldb.Open(ctx, dsn, 2)
	if err != nil {
		return err
	}
	defer db.Close()
	return f(ctx, db)
}

func seed(ctx context.Context, db *sqlx.DB) error {
	stmts := []string{
		"INSERT INTO t_account (user_id, balance) VALUES (10086, 500.00), (10087, 50.00), (10088, 100.00)",
		`INSERT INTO t_order (order_no, user_id, amount) VALUES
		 ('P20260928001', 10086, 199.00), ('P20260928002', 10086, 88.50),
		 ('P20260928003', 10087, 199.00), ('P20260928005', 10088, 20.00)`,
	}
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// publish sends the demo's messages through the producer kit
// (pkg/producer), as bodies of their own: some break the contract on
// purpose, which Payment.Message would refuse to send.
func publish(ctx context.Context, url string, out io.Writer) error {
	p, err := producer.New(producer.Config{URLs: []string{url}, Name: "paydemo"})
	if err != nil {
		return err
	}
	defer p.Close()
	msgs := make([]producer.Message, len(messages))
	for i, m := range messages {
		msgs[i] = producer.Message{Body: []byte(m.body)}
	}
	var failed []error
	for i, err := range p.PublishMessages(ctx, msgs) {
		if err != nil {
			failed = append(failed, err)
			continue
		}
		fmt.Fprintf(out, "published %-78s %s\n", messages[i].body, messages[i].note)
	}
	return errors.Join(failed...)
}

func report(ctx context.Context, db *sqlx.DB, url string, wantTerminal int, out io.Writer) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	depth := func(q string) int {
		ch, err := conn.Channel()
		if err != nil {
			return -1
		}
		defer ch.Close()
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			return -1
		}
		return st.Messages
	}
	var queues []string
	for _, name := range []string{listener.MainQueue, "q.pay.dlx.wait.1s", "q.pay.dlx.wait.2s", listener.TerminalQueue} {
		if depth(name) >= 0 {
			queues = append(queues, name)
		}
	}
	// paysvc parks terminal messages in t_dead_letter: wait for them there.
	parked := func() int {
		var n int
		db.GetContext(ctx, &n, "SELECT COUNT(*) FROM t_dead_letter")
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	for parked() < wantTerminal || depth(listener.MainQueue) > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled after 60s (%d dead letters, want %d)", parked(), wantTerminal)
		}
		time.Sleep(200 * time.Millisecond)
	}

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "\nORDERS\norder_no\tuser_id\tamount\tstatus\tpay_time")
	var orders []struct {
		OrderNo string      `db:"order_no"`
		UserID  int64       `db:"user_id"`
		Amount  money.Cents `db:"amount"`
		Status  string      `db:"status"`
		PayTime *time.Time  `db:"pay_time"`
	}
	if err := db.SelectContext(ctx, &orders, "SELECT order_no, user_id, amount, status, pay_time FROM t_order ORDER BY order_no"); err != nil {
		return err
	}
	for _, o := range orders {
		pt := "-"
		if o.PayTime != nil {
			pt = o.PayTime.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", o.OrderNo, o.UserID, o.Amount, o.Status, pt)
	}
	fmt.Fprintln(tw, "\nBALANCES\tuser_id\tbalance")
	var accounts []struct {
		UserID  int64       `db:"user_id"`
		Balance money.Cents `db:"balance"`
	}
	if err := db.SelectContext(ctx, &accounts, "SELECT user_id, balance FROM t_account ORDER BY user_id"); err != nil {
		return err
	}
	for _, a := range accounts {
		fmt.Fprintf(tw, "\t%d\t%s\n", a.UserID, a.Balance)
	}
	fmt.Fprintln(tw, "\nFLOWS\nid\tuser_id\tamount\tbiz_no\ttype")
	var flows []struct {
		ID     int64       `db:"id"`
		UserID int64       `db:"user_id"`
		Amount money.Cents `db:"amount"`
		BizNo  string      `db:"biz_no"`
		Type   string      `db:"type"`
	}
	if err := db.SelectContext(ctx, &flows, "SELECT id, user_id, amount, biz_no, type FROM t_account_flow ORDER BY id"); err != nil {
		return err
	}
	for _, f := range flows {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\n", f.ID, f.UserID, f.Amount, f.BizNo, f.Type)
	}
	fmt.Fprintln(tw, "\nQUEUES\tqueue\tready")
	for _, q := range queues {
		fmt.Fprintf(tw, "\t%s\t%d\n", q, depth(q))
	}
	return nil
}
