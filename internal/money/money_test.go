package money

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want Cents
		ok   bool
	}{
		{"199", 19900, true},
		{"199.0", 19900, true},
		{"199.00", 19900, true},
		{"0.01", 1, true},
		{"0.1", 10, true},
		{"0", 0, true},
		{"-199.05", -19905, true},
		{"9999999999999999.99", Max, true},
		{"10000000000000000", 0, false},
		{"1.001", 0, false},
		{"1e2", 0, false},
		{"+1", 0, false},
		{" 1", 0, false},
		{"1.", 0, false},
		{".5", 0, false},
		{"01", 0, false},
		{"", 0, false},
		{"-", 0, false},
		{"1,00", 0, false},
		{"NaN", 0, false},
		{"0x10", 0, false},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if tt.ok != (err == nil) {
			t.Errorf("Parse(%q) error = %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) error %v is not ErrInvalid", tt.in, err)
		}
		if got != tt.want {
			t.Errorf("Parse(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestStringRoundTrip(t *testing.T) {
	for _, c := range []Cents{0, 1, 10, 19900, -19905, -5, Max, -Max} {
		back, err := Parse(c.String())
		if err != nil || back != c {
			t.Errorf("Parse(%q) = %d, %v; want %d", c.String(), back, err, c)
		}
	}
	if got := Cents(-5).String(); got != "-0.05" {
		t.Errorf("String(-5) = %q", got)
	}
}

func TestScan(t *testing.T) {
	var c Cents
	if err := c.Scan([]byte("-12.30")); err != nil || c != -1230 {
		t.Fatalf("Scan = %d, %v", c, err)
	}
	if err := c.Scan(1.5); err == nil {
		t.Fatal("Scan(float64) succeeded; floats must be refused")
	}
}
