package listener

import (
	"errors"
	"strings"
	"testing"

	"github.com/paysvc/paysvc/internal/money"
)

func TestDecodePayment(t *testing.T) {
	ok := []struct {
		body   string
		user   int64
		amount money.Cents
	}{
		{`{"orderNo":"P20260928001","userId":10086,"amount":199.00}`, 10086, 19900},
		{`{"orderNo":"P1","userId":1,"amount":"0.01"}`, 1, 1},
		{`{"orderNo":"P1","userId":1,"amount":5}`, 1, 500},
		{` {"amount":5.5, "userId":1, "orderNo":"A-1_b.c:d", "extra":{"nested":[1,2]}} `, 1, 550},
		{`{"orderNo":"P1","userId":1,"amount":"9999999999999999.99"}`, 1, money.Max},
		{`{"orderNo":"P1","userId":9223372036854775807,"amount":1}`, 9223372036854775807, 100},
	}
	for _, tt := range ok {
		p, err := DecodePayment([]byte(tt.body))
		if err != nil || p.UserID != tt.user || p.Amount != tt.amount {
			t.Errorf("DecodePayment(%s) = %+v, %v", tt.body, p, err)
		}
	}
	bad := map[string]string{
		`{"orderNo":"P1","userId":1,"amount":1}x`:                                             "trailing",
		`{"orderNo":"P1","userId":1,"amount":1} {}`:                                           "trailing",
		`{"orderNo":"P1","orderNo":"P2","userId":1,"amount":1}`:                               "duplicate field",
		`{"orderNo":"P1","UserId":1,"amount":1}`:                                              "spelled",
		`{"orderNo":"P1","userId":1,"AMOUNT":1}`:                                              "spelled",
		`{"orderNo":"P1","userId":1}`:                                                         "amount is required",
		`{"orderNo":"P1","amount":1}`:                                                         "userId is required",
		`{"userId":1,"amount":1}`:                                                             "orderNo is required",
		`{"orderNo":null,"userId":1,"amount":1}`:                                              "orderNo is required",
		`{"orderNo":"P1","userId":1,"amount":1.001}`:                                          "more than two decimals",
		`{"orderNo":"P1","userId":1,"amount":1e2}`:                                            "invalid amount",
		`{"orderNo":"P1","userId":1,"amount":-1}`:                                             "greater than 0",
		`{"orderNo":"P1","userId":1,"amount":0}`:                                              "greater than 0",
		`{"orderNo":"P1","userId":1,"amount":"0.00"}`:                                         "greater than 0",
		`{"orderNo":"P1","userId":1,"amount":"1 "}`:                                           "invalid amount",
		`{"orderNo":"P1","userId":1,"amount":true}`:                                           "invalid amount",
		`{"orderNo":"P1","userId":1,"amount":"10000000000000000.00"}`:                         "out of range",
		`{"orderNo":"P1","userId":"1","amount":1}`:                                            "positive integer",
		`{"orderNo":"P1","userId":1.0,"amount":1}`:                                            "positive integer",
		`{"orderNo":"P1","userId":0,"amount":1}`:                                              "positive integer",
		`{"orderNo":"P1","userId":-5,"amount":1}`:                                             "positive integer",
		`{"orderNo":"P1","userId":9223372036854775808,"amount":1}`:                            "positive integer",
		`{"orderNo":"","userId":1,"amount":1}`:                                                "orderNo",
		`{"orderNo":"P 1","userId":1,"amount":1}`:                                             "orderNo",
		`{"orderNo":"-P1","userId":1,"amount":1}`:                                             "orderNo",
		`{"orderNo":5,"userId":1,"amount":1}`:                                                 "orderNo must be a string",
		`[{"orderNo":"P1"}]`:                                                                  "not a JSON object",
		`"P1"`:                                                                                "not a JSON object",
		``:                                                                                    "not a JSON object",
		`{"orderNo":"P1","userId":1,"amount":1`:                                               "bad message",
		`{"orderNo":"` + strings.Repeat("A", 65) + `","userId":1,"amount":1}`:                 "orderNo",
		`{"orderNo":"P1","userId":1,"amount":1,"pad":"` + strings.Repeat("x", MaxBody) + `"}`: "exceeds",
	}
	for body, want := range bad {
		_, err := DecodePayment([]byte(body))
		if !errors.Is(err, ErrBadMessage) || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodePayment(%.70s) = %v, want ErrBadMessage mentioning %q", body, err, want)
		}
	}
}

func FuzzDecodePayment(f *testing.F) {
	f.Add([]byte(`{"orderNo":"P1","userId":1,"amount":"1.50"}`))
	f.Add([]byte(`{"orderNo":"P1","userId":1,"amount":1.5,"x":[{}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := DecodePayment(body)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v is not ErrBadMessage", err)
			}
			return
		}
		if p.Amount <= 0 || p.Amount > money.Max || p.UserID <= 0 || !orderNoPattern.MatchString(p.OrderNo) {
			t.Fatalf("accepted an invalid payment %+v from %q", p, body)
		}
	})
}
