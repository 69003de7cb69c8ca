package listener_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/money"
)

// paymentSchema compiles docs/contract/payment.schema.json, the contract
// producers read.
func paymentSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	sch, err := c.Compile("../../docs/contract/payment.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

// schemaValid reports whether body is one JSON value that the schema
// accepts, and that value.
func schemaValid(sch *jsonschema.Schema, body []byte) (any, bool) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return nil, false
	}
	return v, sch.Validate(v) == nil
}

// agree checks that the schema and DecodePayment give body the same
// verdict, and that an accepted body decodes to the values the schema saw.
func agree(t *testing.T, sch *jsonschema.Schema, body []byte) (accepted bool) {
	t.Helper()
	v, valid := schemaValid(sch, body)
	p, err := listener.DecodePayment(body)
	switch {
	case err != nil && !errors.Is(err, listener.ErrBadMessage):
		t.Errorf("DecodePayment(%.120s): %v is not ErrBadMessage", body, err)
	case valid && err != nil:
		t.Errorf("schema accepts %.120s, DecodePayment refuses it: %v", body, err)
	case !valid && err == nil:
		t.Errorf("schema refuses %.120s, DecodePayment accepts it as %+v", body, p)
	case valid:
		obj := v.(map[string]any)
		if p.OrderNo != obj["orderNo"] || strconv.FormatInt(p.UserID, 10) != fmt.Sprint(obj["userId"]) ||
			!sameAmount(p.Amount, obj["amount"]) {
			t.Errorf("%.120s decodes to %+v, the schema saw %v", body, p, obj)
		}
	}
	return valid
}

// sameAmount compares cents with the schema's view of amount (a string or
// a json.Number), exactly.
func sameAmount(c money.Cents, amount any) bool {
	r, ok := new(big.Rat).SetString(fmt.Sprint(amount))
	return ok && r.Cmp(big.NewRat(int64(c), 100)) == 0
}

// Hand-written edge cases: the schema and the decoder agree on each, and
// each is on the side the contract says.
func TestPaymentSchemaAgreesWithDecoderOnEdgeCases(t *testing.T) {
	sch := paymentSchema(t)
	long := strings.Repeat("A", 64)
	valid := []string{
		`{"orderNo":"P20260928001","userId":10086,"amount":"199.00"}`,
		`{"orderNo":"P20260928001","userId":10086,"amount":199.00}`,
		`{"orderNo":"P1","userId":1,"amount":"0.01"}`,
		`{"orderNo":"P1","userId":1,"amount":0.01}`,
		`{"orderNo":"P1","userId":1,"amount":"0.1"}`,
		`{"orderNo":"P1","userId":1,"amount":"0.10"}`,
		`{"orderNo":"P1","userId":1,"amount":"5"}`,
		`{"orderNo":"P1","userId":1,"amount":5}`,
		`{"orderNo":"P1","userId":1,"amount":"5.5"}`,
		`{"orderNo":"P1","userId":1,"amount":"9999999999999999.99"}`,
		`{"orderNo":"P1","userId":1,"amount":9999999999999999.99}`,
		`{"orderNo":"P1","userId":1,"amount":"1\u002e50"}`,
		`{"orderNo":"P1","userId":9223372036854775807,"amount":"1.00"}`,
		`{"orderNo":"` + long + `","userId":1,"amount":"1.00"}`,
		`{"orderNo":"0a_b.c:d-","userId":1,"amount":"1.00"}`,
		`{"orderNo":"\u0050\u0031","userId":1,"amount":"1.00"}`,
		` {"amount":"1.00", "userId":1, "orderNo":"P1"} ` + "\n",
		`{"orderNo":"P1","userId":1,"amount":"1.00","channel":"wechat","extra":{"nested":[1,2,null]},"orderNo2":1,"order_no":"x","userid2":0,"amounts":[]}`,
		`{"orderNo":"P1","userId":1,"amount":"1.00","":null,"AMOUNT ":1,"usérId":1}`,
	}
	invalid := []string{
		`{"orderNo":"` + long + `A","userId":1,"amount":"1.00"}`,
		`{"orderNo":"","userId":1,"amount":"1.00"}`,
		`{"orderNo":"-P1","userId":1,"amount":"1.00"}`,
		`{"orderNo":"_P1","userId":1,"amount":"1.00"}`,
		`{"orderNo":"P 1","userId":1,"amount":"1.00"}`,
		`{"orderNo":"P1\n","userId":1,"amount":"1.00"}`,
		`{"orderNo":"Pé","userId":1,"amount":"1.00"}`,
		`{"orderNo":"P/1","userId":1,"amount":"1.00"}`,
		`{"orderNo":5,"userId":1,"amount":"1.00"}`,
		`{"orderNo":null,"userId":1,"amount":"1.00"}`,
		`{"orderNo":["P1"],"userId":1,"amount":"1.00"}`,
		`{"userId":1,"amount":"1.00"}`,
		`{"orderNo":"P1","userId":0,"amount":"1.00"}`,
		`{"orderNo":"P1","userId":-1,"amount":"1.00"}`,
		`{"orderNo":"P1","userId":1.5,"amount":"1.00"}`,
		`{"orderNo":"P1","userId":"1","amount":"1.00"}`,
		`{"orderNo":"P1","userId":null,"amount":"1.00"}`,
		`{"orderNo":"P1","userId":9223372036854775808,"amount":"1.00"}`,
		`{"orderNo":"P1","amount":"1.00"}`,
		`{"orderNo":"P1","userId":1}`,
		`{"orderNo":"P1","userId":1,"amount":null}`,
		`{"orderNo":"P1","userId":1,"amount":true}`,
		`{"orderNo":"P1","userId":1,"amount":{"value":"1.00"}}`,
		`{"orderNo":"P1","userId":1,"amount":"1.001"}`,
		`{"orderNo":"P1","userId":1,"amount":1.001}`,
		`{"orderNo":"P1","userId":1,"amount":"0"}`,
		`{"orderNo":"P1","userId":1,"amount":"0.00"}`,
		`{"orderNo":"P1","userId":1,"amount":0}`,
		`{"orderNo":"P1","userId":1,"amount":0.00}`,
		`{"orderNo":"P1","userId":1,"amount":"-1.00"}`,
		`{"orderNo":"P1","userId":1,"amount":-1.00}`,
		`{"orderNo":"P1","userId":1,"amount":"+1.00"}`,
		`{"orderNo":"P1","userId":1,"amount":"01.00"}`,
		`{"orderNo":"P1","userId":1,"amount":"1."}`,
		`{"orderNo":"P1","userId":1,"amount":".5"}`,
		`{"orderNo":"P1","userId":1,"amount":" 1.00"}`,
		`{"orderNo":"P1","userId":1,"amount":"1,00"}`,
		`{"orderNo":"P1","userId":1,"amount":"1e2"}`,
		`{"orderNo":"P1","userId":1,"amount":""}`,
		`{"orderNo":"P1","userId":1,"amount":"10000000000000000.00"}`,
		`{"orderNo":"P1","userId":1,"amount":10000000000000000}`,
		`{"orderNo":"P1","userId":1,"amount":"1.00","orderno":"P2"}`,
		`{"orderNo":"P1","userId":1,"amount":"1.00","USERID":1}`,
		`{"orderNo":"P1","userId":1,"amount":"1.00","Amount":"1.00"}`,
		`{"orderNo":"P1","userId":1,"amount":"1.00","uſerId":1}`,
		`{"orderNo":"P1","userid":1,"amount":"1.00"}`,
		`[{"orderNo":"P1","userId":1,"amount":"1.00"}]`,
		`"P1"`, `null`, `1`, ``, `{}`,
		`{"orderNo":"P1","userId":1,"amount":"1.00"`,
		`{"orderNo":"P1","userId":1,"amount":"1.00"} {}`,
		`{"orderNo":"P1","userId":1,"amount":"1.00"}x`,
	}
	for _, body := range valid {
		if !agree(t, sch, []byte(body)) {
			t.Errorf("%.120s: refused, the contract accepts it", body)
		}
	}
	for _, body := range invalid {
		if agree(t, sch, []byte(body)) {
			t.Errorf("%.120s: accepted, the contract refuses it", body)
		}
	}
}

// The rules the schema's description lists as beyond JSON Schema: the
// schema accepts these bodies, the decoder refuses each, and the
// description names each rule.
func TestPaymentSchemaDescribesWhatItCannotCheck(t *testing.T) {
	sch := paymentSchema(t)
	pad := func(n int) string {
		head := `{"orderNo":"P1","userId":1,"amount":"1.00","pad":"`
		return head + strings.Repeat("x", n-len(head)-2) + `"}`
	}
	if _, err := listener.DecodePayment([]byte(pad(listener.MaxBody))); err != nil {
		t.Errorf("a body of exactly %d bytes: %v", listener.MaxBody, err)
	}
	beyond := map[string]string{
		pad(listener.MaxBody + 1):                                    "exceeds",
		`{"orderNo":"P1","orderNo":"P1","userId":1,"amount":"1.00"}`: "duplicate",
		`{"orderNo":"P1","userId":1,"amount":"1.00","x":1,"x":2}`:    "duplicate",
		`{"orderNo":"P1","userId":1.0,"amount":"1.00"}`:              "positive integer",
		`{"orderNo":"P1","userId":1e0,"amount":"1.00"}`:              "positive integer",
		`{"orderNo":"P1","userId":10E1,"amount":"1.00"}`:             "positive integer",
		`{"orderNo":"P1","userId":1,"amount":1.995e2}`:               "invalid amount",
		`{"orderNo":"P1","userId":1,"amount":1E2}`:                   "invalid amount",
		`{"orderNo":"P1","userId":1,"amount":1.000}`:                 "more than two decimals",
		`{"orderNo":"P1","userId":1,"amount":0.010}`:                 "more than two decimals",
	}
	for body, want := range beyond {
		if _, valid := schemaValid(sch, []byte(body)); !valid {
			t.Errorf("schema refuses %.80s: the rule is the schema's, not one it cannot check", body)
		}
		if _, err := listener.DecodePayment([]byte(body)); !errors.Is(err, listener.ErrBadMessage) || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodePayment(%.80s) = %v, want a bad message mentioning %q", body, err, want)
		}
	}
	var doc struct{ Description string }
	raw, err := os.ReadFile("../../docs/contract/payment.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, rule := range []string{strconv.Itoa(listener.MaxBody) + " bytes", "duplicate keys", "nothing after it", "plain digits", "exponent", "two digits after the point"} {
		if !strings.Contains(doc.Description, rule) {
			t.Errorf("the schema's description does not mention %q", rule)
		}
	}
}

// Generated bodies: every one the schema accepts, the decoder accepts with
// the same values; every one it refuses, the decoder refuses as a bad
// message. The generator writes numbers only in the plain forms (the forms
// the schema cannot tell apart are the test above's).
func TestPaymentSchemaAgreesWithDecoderOnGeneratedBodies(t *testing.T) {
	sch := paymentSchema(t)
	seed := uint64(20260928)
	if s := os.Getenv("PAYSVC_CONTRACT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (PAYSVC_CONTRACT_SEED)", seed)
	g := gen{rand.New(rand.NewPCG(seed, seed))}
	const n = 20000
	accepted := 0
	for range n {
		if agree(t, sch, g.body()) {
			accepted++
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	t.Logf("%d of %d generated bodies valid", accepted, n)
	if accepted < n/5 || accepted > n*4/5 {
		t.Errorf("%d of %d generated bodies valid: the generator should mix both", accepted, n)
	}
}

// gen writes payment bodies, most of their fields valid, some not.
type gen struct{ r *rand.Rand }

func (g gen) pick(choices ...string) string { return choices[g.r.IntN(len(choices))] }

func (g gen) chars(alphabet string, n int) string {
	var b strings.Builder
	for range n {
		b.WriteByte(alphabet[g.r.IntN(len(alphabet))])
	}
	return b.String()
}

const (
	alnum    = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	orderSet = alnum + "_.:-"
	digits   = "0123456789"
)

func (g gen) body() []byte {
	type field struct{ key, value string }
	var fields []field
	// Each field: valid three times in four, else one of its faults.
	add := func(key string, valid func() string, faults ...func() string) {
		if g.r.IntN(4) > 0 {
			fields = append(fields, field{key, valid()})
			return
		}
		if v := faults[g.r.IntN(len(faults))](); v != "" {
			fields = append(fields, field{key, v})
		}
	}
	missing := func() string { return "" }
	null := func() string { return "null" }
	add("orderNo", g.orderNo, missing, null, g.badOrderNo, g.badOrderNo, g.badOrderNo,
		func() string { return g.userID() })
	add("userId", g.userID, missing, null, g.badUserID, g.badUserID,
		func() string { return strconv.Quote(g.userID()) })
	add("amount", g.amount, missing, null, g.badAmount, g.badAmount, g.badAmount,
		func() string { return g.pick("true", "[]", "{}") })
	for range g.r.IntN(3) {
		key := g.extraKey()
		if !slices.ContainsFunc(fields, func(f field) bool { return f.key == key }) { // no duplicate keys
			fields = append(fields, field{key, g.pick(`1`, `"x"`, `null`, `{"orderNo":"P1"}`, `[1,"2"]`)})
		}
	}
	g.r.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	var b strings.Builder
	b.WriteString(g.pick("", " ", "\n"))
	b.WriteString("{")
	for i, f := range fields {
		if i > 0 {
			b.WriteString(g.pick(",", ", ", ",\n"))
		}
		b.WriteString(strconv.Quote(f.key) + ":" + f.value)
	}
	b.WriteString("}")
	return []byte(b.String())
}

func (g gen) orderNo() string {
	rest := g.r.IntN(64)
	if g.r.IntN(3) == 0 {
		rest = 63 // the longest
	}
	return strconv.Quote(g.chars(alnum, 1) + g.chars(orderSet, rest))
}

func (g gen) badOrderNo() string {
	switch g.r.IntN(5) {
	case 0: // too long
		return strconv.Quote(g.chars(alnum, 1) + g.chars(orderSet, 64+g.r.IntN(3)))
	case 1: // empty
		return `""`
	case 2: // a bad first character
		return strconv.Quote(g.chars("_.:-", 1) + g.chars(orderSet, g.r.IntN(10)))
	case 3: // a character outside the set, written plainly or escaped
		c := g.pick(" ", "/", "é", "\\u00e9", "\\n", "+", "#", "\\u0000", "😀")
		s := g.chars(alnum, 1+g.r.IntN(5))
		i := 1 + g.r.IntN(len(s))
		return `"` + s[:i] + c + s[i:] + `"`
	default: // not a string
		return g.pick("1", "true", "[]", `{"no":"P1"}`)
	}
}

func (g gen) userID() string {
	switch g.r.IntN(4) {
	case 0:
		return g.pick("1", "9223372036854775807", "9223372036854775806")
	default:
		return strconv.FormatInt(1+g.r.Int64N(1<<(1+g.r.IntN(62))), 10)
	}
}

func (g gen) badUserID() string {
	return g.pick("0", "-1", "-9223372036854775808", "9223372036854775808", "18446744073709551616",
		"1.5", "0.1", "-0", `true`, `[]`, `{}`)
}

// amount writes a valid amount: a string or a plain number.
func (g gen) amount() string {
	whole := g.pick("0", "1", g.chars("123456789", 1)+g.chars(digits, g.r.IntN(16)))
	frac := ""
	switch g.r.IntN(3) {
	case 1:
		frac = "." + g.chars(digits, 1)
	case 2:
		frac = "." + g.chars(digits, 2)
	}
	if strings.Trim(whole+frac, "0.") == "" {
		frac = ".01" // not zero
	}
	if g.r.IntN(2) == 0 {
		return strconv.Quote(whole + frac)
	}
	return whole + frac
}

func (g gen) badAmount() string {
	s := g.pick("0", "0.00", "-1", "-0.01", "00.01", "01", "1.", ".5", "1.001", "0.001", "12.345",
		"10000000000000000", "99999999999999999.99", "10000000000000000.01")
	switch g.r.IntN(3) {
	case 0:
		return s
	case 1:
		return strconv.Quote(s)
	default: // text that is no number
		return strconv.Quote(g.pick("", " 1", "1 ", "1,00", "1e2", "+1", "NaN", "Infinity", "0x10", "１"))
	}
}

// extraKey is a field name beyond the three: most are ignored, a
// misspelling of a field's name is refused.
func (g gen) extraKey() string {
	name := g.pick("orderNo", "userId", "amount")
	switch g.r.IntN(4) {
	case 0: // the name in another case
		b := []byte(name)
		for i := range b {
			if g.r.IntN(2) == 0 {
				b[i] ^= 0x20
			}
		}
		if s := string(b); s != name {
			return s
		}
		return strings.ToUpper(name)
	case 1: // near misses, which are other fields
		return g.pick(name+"s", name+" ", "_"+name, strings.ToLower(name)+"2", "order_no", "user_id", "amt")
	default:
		return g.pick("channel", "traceId", "", "meta", "currency", "x")
	}
}
