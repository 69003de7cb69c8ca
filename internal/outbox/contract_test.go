package outbox_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/outbox"
)

// noticeSchema compiles docs/contract/notice.schema.json, the contract
// the notice's consumers read.
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

func validate(sch *jsonschema.Schema, body []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return err
	}
	return sch.Validate(v)
}

// Every notice PaymentSucceeded writes is valid by the schema: the
// smallest and largest amounts, whole seconds and nanoseconds, times in
// other zones, the longest order numbers.
func TestNoticeMatchesItsSchema(t *testing.T) {
	sch := noticeSchema(t)
	r := rand.New(rand.NewPCG(1, 2))
	zones := []*time.Location{time.UTC, time.FixedZone("CST", 8*3600), time.FixedZone("X", -(3*3600 + 30*60))}
	for i := range 5000 {
		amount := money.Cents(1 + r.Int64N(int64(money.Max)))
		switch i % 5 {
		case 0:
			amount = 1
		case 1:
			amount = money.Max
		case 2:
			amount = money.Cents(r.Int64N(100)*100 + 100) // whole units
		}
		paidAt := time.Unix(r.Int64N(4e9), r.Int64N(1e9)).In(zones[i%len(zones)])
		if i%2 == 0 {
			paidAt = paidAt.Truncate(time.Second)
		}
		orderNo := fmt.Sprintf("P%d", i) + strings.Repeat("x", r.IntN(63-len(fmt.Sprint(i))))
		body := outbox.PaymentSucceeded(orderNo, 1+r.Int64N(1<<62), amount, paidAt)
		if err := validate(sch, body); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
	}
}

// The schema says something: notices that differ from what paysvc sends
// are refused.
func TestNoticeSchemaRefusesOtherShapes(t *testing.T) {
	sch := noticeSchema(t)
	good := `{"event":"PAYMENT_SUCCEEDED","orderNo":"P1","userId":1,"amount":"199.00","paidAt":"2026-09-28T10:15:30.123Z"}`
	if err := validate(sch, []byte(good)); err != nil {
		t.Fatalf("%s: %v", good, err)
	}
	for _, bad := range []string{
		strings.Replace(good, "PAYMENT_SUCCEEDED", "PAYMENT_FAILED", 1),
		strings.Replace(good, `"199.00"`, `"199.0"`, 1),
		strings.Replace(good, `"199.00"`, `199.00`, 1),
		strings.Replace(good, `"199.00"`, `"0.00"`, 1),
		strings.Replace(good, `"userId":1`, `"userId":"1"`, 1),
		strings.Replace(good, `.123Z`, `.123+08:00`, 1),
		strings.Replace(good, `2026-09-28T`, `2026-09-28 `, 1),
		strings.Replace(good, `"orderNo":"P1",`, ``, 1),
	} {
		if validate(sch, []byte(bad)) == nil {
			t.Errorf("schema accepts %s", bad)
		}
	}
}
