// Package money holds exact monetary amounts as int64 cents.
//
// Amounts are never float64: they are parsed from their decimal text (a JSON
// number's literal or a string) and stored in MySQL as DECIMAL(18,2) text.
package money

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Cents is an exact amount in hundredths of the currency unit. It may be
// negative (a debit flow).
type Cents int64

// Max is the largest amount DECIMAL(18,2) holds: 9999999999999999.99.
const Max Cents = 999_999_999_999_999_999

// ErrInvalid reports text that is not an exact amount.
var ErrInvalid = errors.New("invalid amount")

// Parse reads a plain decimal such as "199", "199.5" or "-199.00": an optional
// minus sign, digits without leading zeros, and at most two decimals. Exponents,
// a plus sign, spaces and more than two decimals are rejected, as is anything
// outside DECIMAL(18,2).
func Parse(s string) (Cents, error) {
	text := s
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	whole, frac, hasDot := strings.Cut(s, ".")
	switch {
	case whole == "" || !digits(whole):
		return 0, fmt.Errorf("%w %q: want digits with at most two decimals", ErrInvalid, text)
	case len(whole) > 1 && whole[0] == '0':
		return 0, fmt.Errorf("%w %q: leading zero", ErrInvalid, text)
	case hasDot && (frac == "" || !digits(frac)):
		return 0, fmt.Errorf("%w %q: want digits after the decimal point", ErrInvalid, text)
	case len(frac) > 2:
		return 0, fmt.Errorf("%w %q: more than two decimals", ErrInvalid, text)
	case len(whole) > 16:
		return 0, fmt.Errorf("%w %q: out of range for DECIMAL(18,2)", ErrInvalid, text)
	}
	for len(frac) < 2 {
		frac += "0"
	}
	n, err := strconv.ParseInt(whole+frac, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w %q: %v", ErrInvalid, text, err)
	}
	if neg {
		n = -n
	}
	return Cents(n), nil
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// String formats the amount with exactly two decimals, e.g. "199.00", "-0.05".
func (c Cents) String() string {
	n := int64(c)
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	return fmt.Sprintf("%s%d.%02d", sign, n/100, n%100)
}

// Value stores the amount as decimal text, which MySQL converts exactly.
func (c Cents) Value() (driver.Value, error) { return c.String(), nil }

// Scan reads a DECIMAL column, which the MySQL driver returns as text.
func (c *Cents) Scan(src any) error {
	var s string
	switch v := src.(type) {
	case []byte:
		s = string(v)
	case string:
		s = v
	case int64:
		*c = Cents(v * 100)
		return nil
	default:
		return fmt.Errorf("money: cannot scan %T", src)
	}
	v, err := Parse(s)
	if err != nil {
		return fmt.Errorf("money: scan: %w", err)
	}
	*c = v
	return nil
}
