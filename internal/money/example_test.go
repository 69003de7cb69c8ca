package money_test

import (
	"errors"
	"fmt"

	"github.com/paysvc/paysvc/internal/money"
)

// Amounts are read from their decimal text into exact cents, and written
// back with two decimals.
func ExampleParse() {
	for _, s := range []string{"199", "199.5", "-0.05", "0.10"} {
		c, err := money.Parse(s)
		fmt.Println(int64(c), c, err)
	}
	// Output:
	// 19900 199.00 <nil>
	// 19950 199.50 <nil>
	// -5 -0.05 <nil>
	// 10 0.10 <nil>
}

// Text that is not an exact amount with at most two decimals is refused,
// never rounded.
func ExampleParse_invalid() {
	for _, s := range []string{"1.999", "1e3", "+5", "007", "1.", " 5", "10000000000000000"} {
		_, err := money.Parse(s)
		fmt.Println(errors.Is(err, money.ErrInvalid), err)
	}
	// Output:
	// true invalid amount "1.999": more than two decimals
	// true invalid amount "1e3": want digits with at most two decimals
	// true invalid amount "+5": want digits with at most two decimals
	// true invalid amount "007": leading zero
	// true invalid amount "1.": want digits after the decimal point
	// true invalid amount " 5": want digits with at most two decimals
	// true invalid amount "10000000000000000": out of range for DECIMAL(18,2)
}

// An amount prints with exactly two decimals, as MySQL stores it.
func ExampleCents_String() {
	fmt.Println(money.Cents(123456), money.Cents(-5), money.Max)
	// Output: 1234.56 -0.05 9999999999999999.99
}
