package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/testenv"
	"github.com/paysvc/paysvc/internal/tracing"
)

// The example producers of docs/producers.md (Go, Node's amqplib,
// Python's pika) pay through a real paysvc. Each starts before paysvc has
// declared its queue, so its first publishes come back unroutable: it
// must publish them again (mandatory, returns handled) once paysvc is up.
// Its first URL refuses connections: it must go on to the next. The user
// id is past 2^53, which a JavaScript Number would round.
func TestExampleProducersPayThroughPaysvc(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	examples := map[string]func(t *testing.T) []string{
		"go": func(t *testing.T) []string {
			bin := filepath.Join(t.TempDir(), "producer")
			build := exec.Command("go", "build", "-o", bin, "./docs/contract/examples")
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("build the Go example: %v\n%s", err, out)
			}
			return []string{bin}
		},
		"node": func(t *testing.T) []string {
			deps := exec.Command("scripts/example-deps.sh")
			deps.Dir = root
			if out, err := deps.CombinedOutput(); err != nil {
				t.Fatalf("the Node example's dependencies (scripts/ensure-test-tools.sh installs node and npm): %v\n%s", err, out)
			}
			return []string{"node", "docs/contract/examples/producer.js"}
		},
		"python": func(t *testing.T) []string {
			// Debian's python3-pika is Debian's python3's.
			for _, py := range []string{"/usr/bin/python3", "python3"} {
				if exec.Command(py, "-c", "import pika").Run() == nil {
					return []string{py, "docs/contract/examples/producer.py"}
				}
			}
			t.Fatal("no python3 with pika: scripts/ensure-test-tools.sh installs Debian's python3-pika")
			return nil
		},
	}
	for name, command := range examples {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			argv := command(t)
			w := newWorld(t)
			const user = 9007199254740993 // 2^53 + 1
			w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (?, 500.00)", user)
			orders := map[string]string{"EX-1": "199.00", "EX-2": "0.01", "EX:3": "88.5"}
			var args []string
			for no, amount := range orders {
				w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, ?)", no, user, amount)
				args = append(args, no+":9007199254740993:"+amount)
			}
			proxy, purl := testenv.AMQPProxy(t, w.amqpURL)
			returned := make(chan struct{}, 1)
			proxy.Watch(func(_ int, toServer bool, chunk []byte) {
				if !toServer && bytes.Contains(chunk, []byte{0, 60, 0, 50}) { // basic.return
					select {
					case returned <- struct{}{}:
					default:
					}
				}
			})
			dead, deadURL := testenv.AMQPProxy(t, w.amqpURL)
			dead.Down()

			var out lockedBuffer
			cmd := exec.Command(argv[0], append(argv[1:], args...)...)
			cmd.Dir = root
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "NODE_PATH=" + filepath.Join(root, "tmp/node/node_modules"),
				"PAYSVC_AMQP_URLS=" + deadURL + "," + purl}
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-done
				done <- nil
				if t.Failed() {
					t.Logf("%s output:\n%s", name, out.String())
				}
			})
			select {
			case <-returned:
			case err := <-done:
				done <- err
				t.Fatalf("the example ended before paysvc started: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("no publish came back unroutable within 30s")
			}

			w.daemonInProcess()
			select {
			case err := <-done:
				done <- err
				if err != nil {
					t.Fatalf("the example failed: %v", err)
				}
			case <-time.After(90 * time.Second):
				t.Fatal("the example still running after 90s")
			}
			for no := range orders {
				if !strings.Contains(out.String(), "confirmed "+no+"\n") {
					t.Errorf("the example did not report %s confirmed", no)
				}
			}
			testenv.Eventually(t, 30*time.Second, func() bool {
				return w.count("SELECT COUNT(*) FROM t_order WHERE status = 'PAID'") == len(orders)
			}, "the payments were not applied")
			if n := w.count("SELECT COUNT(*) FROM t_account WHERE user_id = ? AND balance = 212.49", user); n != 1 {
				t.Errorf("balance not 500.00 - 287.51")
			}

			// Their notices follow the notice contract.
			sch := noticeSchema(t)
			testenv.Eventually(t, 30*time.Second, func() bool { return testenv.Depth(t, w.amqpURL, outbox.Queue) == len(orders) },
				"%d notices, want %d", testenv.Depth(t, w.amqpURL, outbox.Queue), len(orders))
			for _, d := range testenv.GetAll(t, w.amqpURL, outbox.Queue) {
				v, err := jsonschema.UnmarshalJSON(bytes.NewReader(d.Body))
				if err == nil {
					err = sch.Validate(v)
				}
				var n outbox.Notice
				json.Unmarshal(d.Body, &n)
				if _, ok := tracing.FromHeaders(d.Headers); err != nil || !ok || orders[n.OrderNo] == "" || n.UserID != user {
					t.Errorf("notice %s (headers %v): %v", d.Body, d.Headers, err)
				}
			}
		})
	}
}

func noticeSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	sch, err := c.Compile("../../docs/contract/notice.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

// docs/contract/asyncapi.yaml is a valid AsyncAPI 3.0 document (by the
// AsyncAPI Initiative's own JSON Schema, npm's @asyncapi/specs), names the
// queues, exchanges, routing key and headers paysvc uses, points at the
// message schemas, and its examples follow them.
func TestAsyncAPIDocument(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	deps := exec.Command("scripts/example-deps.sh")
	deps.Dir = root
	if out, err := deps.CombinedOutput(); err != nil {
		t.Fatalf("@asyncapi/specs (scripts/ensure-test-tools.sh installs node and npm): %v\n%s", err, out)
	}
	raw, err := os.ReadFile("../../docs/contract/asyncapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	doc = jsonValue(doc)

	c := jsonschema.NewCompiler()
	spec, err := c.Compile(filepath.Join(root, "tmp/node/node_modules/@asyncapi/specs/schemas/3.0.0.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Validate(doc); err != nil {
		t.Fatalf("not a valid AsyncAPI 3.0.0 document: %v", err)
	}

	// The names, from paysvc's own constants.
	text := string(raw)
	names := []string{listener.MainQueue, listener.DLXExchange, listener.RetryExchange, listener.TerminalQueue,
		listener.OverflowQueue, listener.WaitQueue(30 * time.Second)[:len("q.pay.dlx.wait.")] + "{delay}",
		outbox.Exchange, outbox.Queue, outbox.DeadQueue, outbox.RoutingKey, outbox.EventPaymentSucceeded,
		tracing.Header, listener.HeaderRetryCount, listener.HeaderErrorClass, listener.HeaderLastError,
		listener.HeaderFirstFailedAt, listener.HeaderLastFailedAt, listener.HeaderInFlightCount,
		listener.HeaderRequeueCount, listener.HeaderRoutedTo}
	for _, name := range names {
		if !strings.Contains(text, name) {
			t.Errorf("asyncapi.yaml does not name %s", name)
		}
	}
	channels := doc.(map[string]any)["channels"].(map[string]any)
	address := func(ch string) string { return channels[ch].(map[string]any)["address"].(string) }
	if address("payments") != listener.MainQueue || address("notices") != outbox.RoutingKey || address("noticeQueue") != outbox.Queue {
		t.Errorf("channel addresses %q, %q, %q", address("payments"), address("notices"), address("noticeQueue"))
	}

	// The messages' payloads are the schema files, and the examples follow them.
	messages := doc.(map[string]any)["components"].(map[string]any)["messages"].(map[string]any)
	for name, file := range map[string]string{"payment": "payment.schema.json", "notice": "notice.schema.json"} {
		m := messages[name].(map[string]any)
		payload := m["payload"].(map[string]any)
		if ref := payload["schema"].(map[string]any)["$ref"]; ref != "./"+file {
			t.Errorf("%s payload $ref %v, want ./%s", name, ref, file)
		}
		sc := jsonschema.NewCompiler()
		sch, err := sc.Compile("../../docs/contract/" + file)
		if err != nil {
			t.Fatal(err)
		}
		for _, ex := range m["examples"].([]any) {
			if err := sch.Validate(ex.(map[string]any)["payload"]); err != nil {
				t.Errorf("%s example: %v", name, err)
			}
		}
	}
}

// jsonValue turns what yaml.v3 decodes into what encoding/json would:
// validators expect json.Number for numbers.
func jsonValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = jsonValue(e)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = jsonValue(e)
		}
		return v
	case int:
		return json.Number(strconv.Itoa(v))
	case float64:
		return json.Number(strconv.FormatFloat(v, 'f', -1, 64))
	}
	return v
}
