package listener

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/order"
)

// MaxBody is the largest message body accepted.
const MaxBody = 64 << 10

// ErrBadMessage marks a message that can never be applied: terminal at once.
var ErrBadMessage = errors.New("bad message")

var orderNoPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$`)

// field names, exactly as producers send them.
const (
	keyOrderNo = "orderNo"
	keyUserID  = "userId"
	keyAmount  = "amount"
)

// DecodePayment decodes {"orderNo":"P20260928001","userId":10086,"amount":199.00}
// strictly: the three fields are required, non-null and spelled exactly;
// duplicate keys, keys that match only ignoring case, trailing bytes and
// bodies over MaxBody are refused. Other fields are ignored. amount may be a
// JSON number or string, is exact, > 0, with at most two decimals.
func DecodePayment(body []byte) (order.Payment, error) {
	var p order.Payment
	if len(body) > MaxBody {
		return p, fmt.Errorf("%w: body of %d bytes exceeds %d", ErrBadMessage, len(body), MaxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return p, fmt.Errorf("%w: not a JSON object", ErrBadMessage)
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return p, fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
		key := tok.(string) // object keys are always strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return p, fmt.Errorf("%w: field %q: %v", ErrBadMessage, key, err)
		}
		for _, known := range []string{keyOrderNo, keyUserID, keyAmount} {
			if key != known && strings.EqualFold(key, known) {
				return p, fmt.Errorf("%w: field %q must be spelled %q", ErrBadMessage, key, known)
			}
		}
		if _, dup := fields[key]; dup {
			return p, fmt.Errorf("%w: duplicate field %q", ErrBadMessage, key)
		}
		fields[key] = raw
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return p, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return p, fmt.Errorf("%w: trailing data after the JSON object", ErrBadMessage)
	}

	var err error
	if p.OrderNo, err = decodeOrderNo(fields[keyOrderNo]); err != nil {
		return p, err
	}
	if p.UserID, err = decodeUserID(fields[keyUserID]); err != nil {
		return p, err
	}
	if p.Amount, err = decodeAmount(fields[keyAmount]); err != nil {
		return p, err
	}
	return p, nil
}

func missing(raw json.RawMessage) bool { return raw == nil || string(raw) == "null" }

func decodeOrderNo(raw json.RawMessage) (string, error) {
	var s string
	if missing(raw) {
		return "", fmt.Errorf("%w: orderNo is required", ErrBadMessage)
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%w: orderNo must be a string", ErrBadMessage)
	}
	if !orderNoPattern.MatchString(s) {
		return "", fmt.Errorf("%w: orderNo %.80q must be 1-64 of [A-Za-z0-9_.:-]", ErrBadMessage, s)
	}
	return s, nil
}

func decodeUserID(raw json.RawMessage) (int64, error) {
	if missing(raw) {
		return 0, fmt.Errorf("%w: userId is required", ErrBadMessage)
	}
	id, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%w: userId %.40s must be a positive integer", ErrBadMessage, raw)
	}
	return id, nil
}

func decodeAmount(raw json.RawMessage) (money.Cents, error) {
	if missing(raw) {
		return 0, fmt.Errorf("%w: amount is required", ErrBadMessage)
	}
	text := string(raw)
	if strings.HasPrefix(text, `"`) {
		if err := json.Unmarshal(raw, &text); err != nil {
			return 0, fmt.Errorf("%w: amount: %v", ErrBadMessage, err)
		}
	}
	c, err := money.Parse(text)
	if err != nil {
		return 0, fmt.Errorf("%w: amount: %v", ErrBadMessage, err)
	}
	if c <= 0 {
		return 0, fmt.Errorf("%w: amount %s must be greater than 0", ErrBadMessage, c)
	}
	return c, nil
}
