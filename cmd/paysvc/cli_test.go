package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/testenv"
)

// help, -h and --help, for the program, a group or one command, print the
// usage on out and succeed; the usage is made from the table, so every
// command and every flag of the command is in it.
func TestCLIHelp(t *testing.T) {
	t.Parallel()
	top := []string{"usage: paysvc [--config FILE] <command>", "exit status: 0 done; 1 failed; 2 reconcile found problems; 64 usage error"}
	for _, s := range commands {
		top = append(top, "  "+s.path()+" ")
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"help"}, top},
		{[]string{"-h"}, top},
		{[]string{"--help"}, top},
		{[]string{"--config", "absent.yaml", "help"}, top},
		{[]string{"dlq", "-h"}, []string{"usage: paysvc [--config FILE] dlq list|show|replay|discard",
			"usage: paysvc [--config FILE] dlq list [--order", "usage: paysvc [--config FILE] dlq replay (ORDER_NO",
			"  --reason TEXT           why, TEXT (required; kept in the audit trail)", "  --rate N                N replays per second at most (default 20)"}},
		{[]string{"help", "dlq"}, []string{"usage: paysvc [--config FILE] dlq list|show|replay|discard", "dlq discard"}},
		{[]string{"dlq", "list", "-h"}, []string{"usage: paysvc [--config FILE] dlq list [--order ORDER_NO]",
			"  --output FORMAT", "(default table)", "  --limit N               N rows at most (default 100)",
			"  --config FILE", "first_failed_at, last_failed_at (RFC 3339, UTC)", `amount (a decimal string such as "5.00"`}},
		{[]string{"dlq", "list", "--help"}, []string{"usage: paysvc [--config FILE] dlq list"}},
		{[]string{"help", "dlq", "show"}, []string{"usage: paysvc [--config FILE] dlq show", "  --id ID", "history: an array of {at"}},
		{[]string{"dlq", "show", "OPS1", "-h"}, []string{"usage: paysvc [--config FILE] dlq show"}},
		{[]string{"reconcile", "-h"}, []string{"usage: paysvc [--config FILE] reconcile [--from T]", "  --fix",
			"Exit status 2 when it finds problems", "reconciled: duplicate groups", "{kind, order_no"}},
		{[]string{"trace", "--help"}, []string{"usage: paysvc [--config FILE] trace ORDER_NO [--log FILE]", "  --log FILE"}},
		{[]string{"migrate", "-h"}, []string{"usage: paysvc [--config FILE] migrate\n"}},
		{[]string{"prune", "-h"}, []string{"usage: paysvc [--config FILE] prune [--dry-run]", "  --dry-run", "prune.outboxAfter",
			"NEW dead letter never go", "paysvc.prune"}},
		{[]string{"help", "run"}, []string{"usage: paysvc [--config FILE] run\n"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out bytes.Buffer
			if err := run(context.Background(), tc.args, nil, &out); err != nil {
				t.Fatalf("paysvc %s: %v", strings.Join(tc.args, " "), err)
			}
			for _, want := range tc.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("paysvc %s: output lacks %q:\n%s", strings.Join(tc.args, " "), want, out.String())
				}
			}
		})
	}
}

// A wrong command line fails with exit status 64 and the usage (the
// command's own for a known command), before reading any configuration or
// reaching a server (the environment here names none), and prints nothing
// on out.
func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	const top = "usage: paysvc [--config FILE] <command>"
	for _, tc := range []struct {
		args       []string
		msg, usage string
	}{
		{nil, "no command", top},
		{[]string{"nosuch"}, `unknown command "nosuch"`, top},
		{[]string{"--nosuch", "run"}, "flag provided but not defined: -nosuch", top},
		{[]string{"--config"}, "flag needs an argument: -config", top},
		{[]string{"help", "nosuch"}, `help: unknown command "nosuch"`, top},
		{[]string{"dlq"}, "dlq: want list, show, replay or discard", "dlq list|show|replay|discard"},
		{[]string{"dlq", "nosuch"}, `dlq: unknown subcommand "nosuch"`, "dlq list|show|replay|discard"},
		{[]string{"help", "dlq", "nosuch"}, `help: dlq has no subcommand "nosuch"`, "dlq list|show|replay|discard"},
		{[]string{"run", "--nosuch"}, "run: flag provided but not defined: -nosuch", "paysvc [--config FILE] run\n"},
		{[]string{"migrate", "extra"}, `migrate: unexpected arguments ["extra"]`, "paysvc [--config FILE] migrate\n"},
		{[]string{"prune", "extra"}, `prune: unexpected arguments ["extra"]`, "paysvc [--config FILE] prune [--dry-run]"},
		{[]string{"version", "extra"}, `version: unexpected arguments ["extra"]`, "paysvc [--config FILE] version\n"},
		{[]string{"reconcile", "--output", "yaml"}, `reconcile: invalid value "yaml" for flag -output: want table or json`, "reconcile [--from T]"},
		{[]string{"dlq", "list", "--output", "yaml"}, `dlq list: invalid value "yaml" for flag -output: want table or json`, "dlq list [--order"},
		{[]string{"dlq", "show", "X1", "--output=yaml"}, `dlq show: invalid value "yaml" for flag -output: want table or json`, "dlq show ORDER_NO"},
		{[]string{"dlq", "list", "--order", "A", "--order", "B"}, "dlq list: one --order at most", "dlq list [--order"},
		{[]string{"dlq", "list", "--since", "yesterday"}, "dlq list: --since: want a time", "dlq list [--order"},
		{[]string{"dlq", "list", "--status", "PARKED"}, `dlq list: --status "PARKED": want NEW, REPLAYED or DISCARDED`, "dlq list [--order"},
		{[]string{"dlq", "list", "--limit", "0"}, "dlq list: --limit 0: want 1 or more", "dlq list [--order"},
		{[]string{"dlq", "list", "X1"}, `dlq list: unexpected arguments ["X1"]`, "dlq list [--order"},
		{[]string{"dlq", "show"}, "dlq show: want ORDER_NO, --order ORDER_NO or --id N", "dlq show ORDER_NO"},
		{[]string{"dlq", "show", "--id", "abc"}, `dlq show: invalid value "abc" for flag -id: want a number`, "dlq show ORDER_NO"},
		{[]string{"dlq", "replay", "X1"}, "dlq replay: --reason is required", "dlq replay (ORDER_NO"},
		{[]string{"dlq", "replay", "--reason", "r"}, "dlq replay: give order numbers, --id, --class, or --all", "dlq replay (ORDER_NO"},
		{[]string{"dlq", "replay", "X1", "--reason", "r", "--rate", "0"}, "dlq replay: --rate must be positive", "dlq replay (ORDER_NO"},
		{[]string{"dlq", "replay", "--id", "5", "--class", "timeout", "--reason", "r"}, "dlq replay: name rows (ORDER_NO, --order, --id) or select them (--class, --all), not both", "dlq replay (ORDER_NO"},
		{[]string{"dlq", "replay", "X1", "--all", "--reason", "r"}, "dlq replay: name rows (ORDER_NO, --order, --id) or select them (--class, --all), not both", "dlq replay (ORDER_NO"},
		{[]string{"dlq", "discard", "X1"}, "dlq discard: want ORDER_NO, --order ORDER_NO or --id N, and --reason", "dlq discard (ORDER_NO"},
		{[]string{"dlq", "discard", "--reason", "r"}, "dlq discard: want ORDER_NO, --order ORDER_NO or --id N", "dlq discard (ORDER_NO"},
		{[]string{"reconcile", "--from", "last week"}, "reconcile: --from: since: want a time", "reconcile [--from T]"},
		{[]string{"trace"}, "trace: want one ORDER_NO", "trace ORDER_NO"},
		{[]string{"trace", "A1", "B1"}, "trace: want one ORDER_NO", "trace ORDER_NO"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out bytes.Buffer
			env := []string{"PAYSVC_MYSQL_DSN=nobody@tcp(127.0.0.1:1)/none", "PAYSVC_AMQP_URL=amqp://nobody@127.0.0.1:1/"}
			err := run(context.Background(), tc.args, env, &out)
			var exit *exitError
			if !errors.As(err, &exit) || exit.code != exitUsage || exit.logged {
				t.Fatalf("paysvc %s: %v (%#v); want a usage error, exit status 64", strings.Join(tc.args, " "), err, exit)
			}
			if err.Error() != tc.msg && !strings.HasPrefix(err.Error(), tc.msg) {
				t.Errorf("message %q, want %q", err.Error(), tc.msg)
			}
			if !strings.Contains(exit.usage, tc.usage) || !strings.HasPrefix(exit.usage, "usage: paysvc ") {
				t.Errorf("usage lacks %q:\n%s", tc.usage, exit.usage)
			}
			if out.Len() != 0 {
				t.Errorf("printed on out:\n%s", out.String())
			}
		})
	}
}

// The built binary: usage on stdout and exit 0 for help, the message and
// the usage on stderr and exit 64 for a usage error, exit 2 for reconcile's
// problems, 0 for version.
func TestCLIExitStatus(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (81, 7.00)")
	w.db.MustExec("INSERT INTO t_account_opening (user_id, balance, as_of) VALUES (81, 10.00, '2020-01-01')")
	for _, tc := range []struct {
		args         []string
		code         int
		stdout       string // a line of it
		stderrPrefix string
	}{
		{[]string{"help"}, 0, "usage: paysvc [--config FILE] <command> [arguments]", ""},
		{[]string{"--help"}, 0, "usage: paysvc [--config FILE] <command> [arguments]", ""},
		{[]string{"dlq", "list", "-h"}, 0, "usage: paysvc [--config FILE] dlq list [--order ORDER_NO] [--class C] [--since T] [--status S] [--limit N] [--output json]", ""},
		{[]string{"version"}, 0, "", ""},
		{[]string{"nosuch"}, 64, "", "paysvc: unknown command \"nosuch\"\n\nusage: paysvc [--config FILE] <command> [arguments]\n"},
		{[]string{"reconcile", "--output", "yaml"}, 64, "",
			"paysvc: reconcile: invalid value \"yaml\" for flag -output: want table or json\n\nusage: paysvc [--config FILE] reconcile"},
		{[]string{"reconcile"}, 2, "balance_mismatch  -       81    balance 7.00, opening balance plus flows 10.00 (difference -3.00)  false",
			"paysvc: reconcile: problems found with 0 orders and 1 accounts\n"},
		{[]string{"reconcile", "--output", "json"}, 2, `      "kind": "balance_mismatch",`, "paysvc: reconcile: problems found with 0 orders and 1 accounts\n"},
	} {
		cmd := exec.Command(binary, tc.args...)
		cmd.Env, cmd.Dir = w.env(), t.TempDir()
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case tc.code == 0 && err != nil, tc.code != 0 && (!errors.As(err, &exit) || exit.ExitCode() != tc.code):
			t.Errorf("paysvc %s: %v, want exit status %d\nstdout:\n%s\nstderr:\n%s", strings.Join(tc.args, " "), err, tc.code, &stdout, &stderr)
		case tc.stdout != "" && !slices.Contains(strings.Split(stdout.String(), "\n"), tc.stdout):
			t.Errorf("paysvc %s: stdout lacks the line %q:\n%s", strings.Join(tc.args, " "), tc.stdout, &stdout)
		case tc.stdout == "" && tc.code == 0 && !strings.HasPrefix(stdout.String(), "paysvc dev revision "):
			t.Errorf("paysvc %s: stdout %q", strings.Join(tc.args, " "), &stdout)
		case tc.code != 64 && tc.stderrPrefix == "" && stderr.Len() != 0:
			t.Errorf("paysvc %s: stderr %q", strings.Join(tc.args, " "), &stderr)
		case !strings.HasPrefix(stderr.String(), tc.stderrPrefix):
			t.Errorf("paysvc %s: stderr does not begin with %q:\n%s", strings.Join(tc.args, " "), tc.stderrPrefix, &stderr)
		case tc.code == 64 && stdout.Len() != 0:
			t.Errorf("paysvc %s: a usage error printed on stdout:\n%s", strings.Join(tc.args, " "), &stdout)
		}
	}
}

// dlq list and dlq show with --output json: every field of the seeded
// rows, the amount as exact decimal text, null for what is unknown, []
// for nothing; flags before or after the arguments; the table stays the
// default.
func TestCLIDeadLettersJSON(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (71, 1.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('JS1', 71, 5.00)")
	store := deadletter.NewStore(w.db)
	first := time.Date(2026, 11, 30, 8, 0, 1, 0, time.UTC)
	user, amt := int64(71), money.Cents(500)
	body := payment("JS1", 71, "5.00")
	paidID, _, err := store.Park(context.Background(), deadletter.Parked{OrderNo: "JS1", UserID: &user, Amount: &amt,
		Body: body, Headers: `{"x-retry":3}`, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", ErrorClass: "balance_not_enough",
		LastError: "balance 1.00 < amount 5.00", RetryCount: 3, FirstFailedAt: first, LastFailedAt: first.Add(90 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	badID, _, err := store.Park(context.Background(), deadletter.Parked{Body: []byte(`{"orderNo":`), Headers: "{}",
		ErrorClass: "bad_message", LastError: "unexpected end of JSON input", FirstFailedAt: first.Add(time.Hour),
		LastFailedAt: first.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}

	// A decoder keeping numbers as json.Number: an amount decoded as a
	// number would not be a string.
	decode := func(out string, v any) {
		t.Helper()
		d := json.NewDecoder(strings.NewReader(out))
		d.UseNumber()
		d.DisallowUnknownFields()
		if err := d.Decode(v); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
	}
	var list []map[string]any
	decode(w.mustCLI("dlq", "list", "--output", "json"), &list)
	paid := map[string]any{"id": json.Number(fmt.Sprint(paidID)), "order_no": "JS1", "user_id": json.Number("71"), "amount": "5.00",
		"status": "NEW", "error_class": "balance_not_enough", "last_error": "balance 1.00 < amount 5.00",
		"retry_count": json.Number("3"), "parked_count": json.Number("1"), "first_failed_at": "2026-11-30T08:00:01Z",
		"last_failed_at": "2026-11-30T08:01:31Z", "updated_by": "paysvc", "reason": "", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
	bad := map[string]any{"id": json.Number(fmt.Sprint(badID)), "order_no": nil, "user_id": nil, "amount": nil,
		"status": "NEW", "error_class": "bad_message", "last_error": "unexpected end of JSON input",
		"retry_count": json.Number("0"), "parked_count": json.Number("1"), "first_failed_at": "2026-11-30T09:00:01Z",
		"last_failed_at": "2026-11-30T09:00:01Z", "updated_by": "paysvc", "reason": "", "trace_id": ""}
	if len(list) != 2 || fmt.Sprint(list[0]) != fmt.Sprint(bad) || fmt.Sprint(list[1]) != fmt.Sprint(paid) {
		t.Fatalf("dlq list --output json:\n%v\nwant, the last failed first:\n%v\n%v", list, bad, paid)
	}
	decode(w.mustCLI("dlq", "list", "--class", "balance_not_enough", "--output=json"), &list)
	if len(list) != 1 || fmt.Sprint(list[0]) != fmt.Sprint(paid) {
		t.Fatalf("dlq list --class balance_not_enough --output=json: %v", list)
	}
	if out := w.mustCLI("dlq", "list", "--class", "nosuch", "--output", "json"); out != "[]\n" {
		t.Fatalf("dlq list of nothing: %q, want []", out)
	}
	if out := w.mustCLI("dlq", "list"); !strings.HasPrefix(out, "ID  ORDER_NO  AMOUNT  CLASS") || !strings.Contains(out, "JS1") {
		t.Fatalf("dlq list, the default table:\n%s", out)
	}

	type shown struct {
		deadLetterJSON
		ReplayWould string `json:"replay_would"`
		Body        string `json:"body"`
		Headers     string `json:"headers"`
		History     []struct {
			At, Event, Operator, Reason, Result string
		} `json:"history"`
	}
	for _, args := range [][]string{
		{"dlq", "show", "JS1", "--output", "json"},
		{"dlq", "show", "--output", "json", "JS1"},
		{"dlq", "show", "--output", "json", "--id", fmt.Sprint(paidID)},
	} {
		var got []shown
		decode(w.mustCLI(args...), &got)
		if len(got) != 1 {
			t.Fatalf("%s: %d dead letters, want 1", args, len(got))
		}
		g := got[0]
		if g.ID != paidID || g.OrderNo == nil || *g.OrderNo != "JS1" || g.Amount == nil || *g.Amount != "5.00" ||
			g.UserID == nil || *g.UserID != 71 || g.ErrorClass != "balance_not_enough" || g.RetryCount != 3 ||
			g.LastFailedAt != "2026-11-30T08:01:31Z" || g.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" ||
			g.Body != string(body) || g.Headers != `{"x-retry":3}` || g.ReplayWould != "would fail: balance 1.00 < amount 5.00 (user 71)" {
			t.Errorf("%s: %+v", args, g)
		}
		if len(g.History) != 1 || g.History[0].Event != "PARKED" || g.History[0].Operator != "paysvc" ||
			g.History[0].Result != "balance 1.00 < amount 5.00" || g.History[0].Reason != "" {
			t.Errorf("%s: history %+v, want the one PARKED event", args, g.History)
		}
		if _, err := time.Parse(time.RFC3339, g.History[0].At); err != nil {
			t.Errorf("%s: history time: %v", args, err)
		}
	}
	var got []shown
	decode(w.mustCLI("dlq", "show", "--id", fmt.Sprint(badID), "--order", "JS1", "--output", "json"), &got)
	if len(got) != 2 || got[0].ID != badID || got[0].OrderNo != nil || got[0].Amount != nil || got[0].Body != `{"orderNo":` ||
		!strings.HasPrefix(got[0].ReplayWould, "would fail: ") || got[1].ID != paidID {
		t.Fatalf("dlq show of two: %+v", got)
	}
	// After a discard, the record says so.
	w.mustCLI("dlq", "discard", "--id", fmt.Sprint(badID), "--reason", "malformed by the producer", "--operator", "alice")
	got = nil
	decode(w.mustCLI("dlq", "show", "--id", fmt.Sprint(badID), "--output", "json"), &got)
	if len(got) != 1 || got[0].Status != "DISCARDED" || got[0].UpdatedBy != "alice" || got[0].Reason != "malformed by the producer" ||
		len(got[0].History) != 2 || got[0].History[1].Event != "DISCARDED" || got[0].History[1].Operator != "alice" ||
		got[0].History[1].Reason != "malformed by the producer" {
		t.Fatalf("dlq show after discard: %+v", got)
	}
	if out := w.mustCLI("dlq", "show", "JS1"); !strings.Contains(out, "order_no         JS1") || !strings.Contains(out, "HISTORY") {
		t.Fatalf("dlq show, the default text:\n%s", out)
	}
}

// reconcile --output json: the problems with their fields, exit status 2
// as with the table; clean, {"problems": []} and exit status 0.
func TestCLIReconcileJSON(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (61, 7.00)")
	w.db.MustExec("INSERT INTO t_account_opening (user_id, balance, as_of) VALUES (61, 10.00, '2020-01-01')")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount, status) VALUES ('RJ1', 62, 5.00, 'PAID')")

	out, err := w.cli("reconcile", "--output", "json")
	var exit *exitError
	if !errors.As(err, &exit) || exit.code != exitProblems || exit.usage != "" {
		t.Fatalf("reconcile --output json: %v, want exit status 2\n%s", err, out)
	}
	var rep struct {
		Problems []struct {
			Kind    string  `json:"kind"`
			OrderNo *string `json:"order_no"`
			UserID  int64   `json:"user_id"`
			Amount  *string `json:"amount"` // lost_payment only
			Detail  string  `json:"detail"`
			Fixed   bool    `json:"fixed"`
		} `json:"problems"`
		Reconciled *int `json:"reconciled"`
	}
	d := json.NewDecoder(strings.NewReader(out))
	d.DisallowUnknownFields()
	if err := d.Decode(&rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	got := map[string]string{}
	for _, p := range rep.Problems {
		orderNo := "<null>"
		if p.OrderNo != nil {
			orderNo = *p.OrderNo
		}
		got[p.Kind] = fmt.Sprintf("%s %d %s %v", orderNo, p.UserID, p.Detail, p.Fixed)
		if p.Amount != nil {
			t.Errorf("%s has an amount %q: only a lost_payment has one", p.Kind, *p.Amount)
		}
	}
	want := map[string]string{
		"balance_mismatch":  "<null> 61 balance 7.00, opening balance plus flows 10.00 (difference -3.00) false",
		"paid_without_flow": "RJ1 62 order is PAID but no PAY_DEDUCT flow exists false",
	}
	if len(rep.Problems) != 2 || fmt.Sprint(got) != fmt.Sprint(want) || rep.Reconciled == nil || *rep.Reconciled != 0 {
		t.Fatalf("reconcile --output json:\n%s\nwant the problems %v, reconciled 0", out, want)
	}
	// The table stays the default, with the same exit status.
	out, err = w.cli("reconcile")
	if !errors.As(err, &exit) || exit.code != exitProblems || !strings.Contains(out, "2 findings about 1 orders and 1 accounts, 0 duplicate groups already reversed") {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}

	w.db.MustExec("DELETE FROM t_order WHERE order_no = 'RJ1'")
	w.db.MustExec("UPDATE t_account SET balance = 10.00 WHERE user_id = 61")
	if out := w.mustCLI("reconcile", "--output", "json"); out != "{\n  \"problems\": [],\n  \"reconciled\": 0\n}\n" {
		t.Fatalf("clean reconcile --output json: %q", out)
	}
}

// Stopped while it waits for MySQL: openMySQL says so with an error (no
// nil, nil), and run exits 0 all the same, as on SIGTERM.
func TestRunStoppedWhileWaitingForMySQL(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	proxy, dsn := testenv.MySQLProxy(t, w.dsn)
	proxy.Down()
	cfg, err := loadConfig("absent.yaml", false, map[string]string{"PAYSVC_MYSQL_DSN": dsn})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	db, err := openMySQL(ctx, cfg, zap.NewNop())
	if db != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("openMySQL stopped while waiting: %v, %v; want no database and the context's error", db, err)
	}

	logs := &lockedBuffer{}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"run"}, w.env("PAYSVC_MYSQL_DSN="+dsn), logs) }()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "mysql unavailable; waiting")
	}, "the daemon did not wait for MySQL")
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run stopped while waiting for MySQL: %v, want nil (exit 0)\n%s", err, logs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
	if strings.Contains(logs.String(), "paysvc failed") {
		t.Fatalf("a stop while waiting was logged as a failure:\n%s", logs)
	}
}
