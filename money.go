package tollgate

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"strconv"
	"strings"
)

// Money is exact integer arithmetic; no float64 ever touches an amount.
//
// Amount counts picodollars: 1 Amount = 1e-12 USD, the 12 decimals a cost
// keeps (docs/api.md, usage.cost). An int64 holds ±9,223,372.036854775807 USD, far above
// any prepaid balance; every operation that could overflow is checked and
// returns ErrMoneyOverflow instead of wrapping.
//
// Rate is USD per 1M tokens with 6 decimals: 1 Rate = 1e-6 USD per 1M tokens,
// which is exactly 1 picodollar per token. So the cost of n tokens at rate r
// is the Amount n*r, with no rounding at all.

// Amount is an exact USD amount in picodollars (1e-12 USD).
type Amount int64

// Rate is a price in USD per 1M tokens, in units of 1e-6 (so: picodollars per token).
type Rate int64

const (
	amountScale   = 12
	rateScale     = 6
	picoPerDollar = 1_000_000_000_000
)

// ErrMoneyOverflow is returned when a sum or product leaves the int64 range.
var ErrMoneyOverflow = errors.New("money: amount out of range")

// Dollars returns n whole dollars as an Amount (panics on overflow; for tests and constants).
func Dollars(n int64) Amount {
	a, err := Amount(n).mulInt(picoPerDollar)
	if err != nil {
		panic(err)
	}
	return a
}

// ParseAmount parses a decimal string such as "12.5", "-0.000000000001" or
// "100" (at most 12 decimals; more is an error, never silently rounded).
func ParseAmount(s string) (Amount, error) {
	v, err := parseFixed(s, amountScale, true)
	return Amount(v), err
}

// ParseRate parses a non-negative decimal string with at most 6 decimals.
func ParseRate(s string) (Rate, error) {
	v, err := parseFixed(s, rateScale, false)
	return Rate(v), err
}

// MustParseRate is ParseRate for constants in tests and examples.
func MustParseRate(s string) Rate {
	r, err := ParseRate(s)
	if err != nil {
		panic(err)
	}
	return r
}

// MustParseAmount is ParseAmount for constants in tests and examples.
func MustParseAmount(s string) Amount {
	a, err := ParseAmount(s)
	if err != nil {
		panic(err)
	}
	return a
}

func parseFixed(s string, scale int, signed bool) (int64, error) {
	orig := s
	if s == "" {
		return 0, fmt.Errorf("money: empty decimal")
	}
	neg := false
	switch s[0] {
	case '-':
		if !signed {
			return 0, fmt.Errorf("money: %q must not be negative", orig)
		}
		neg = true
		s = s[1:]
	case '+':
		s = s[1:]
	}
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" && (!hasDot || frac == "") {
		return 0, fmt.Errorf("money: %q is not a decimal number", orig)
	}
	if hasDot && frac == "" {
		return 0, fmt.Errorf("money: %q is not a decimal number", orig)
	}
	for _, part := range []string{intPart, frac} {
		for i := 0; i < len(part); i++ {
			if part[i] < '0' || part[i] > '9' {
				return 0, fmt.Errorf("money: %q is not a decimal number", orig)
			}
		}
	}
	// Trailing zeros beyond the scale carry no value; anything else would be rounded.
	frac = strings.TrimRight(frac, "0")
	if len(frac) > scale {
		return 0, fmt.Errorf("money: %q has more than %d decimals", orig, scale)
	}
	frac += strings.Repeat("0", scale-len(frac))
	intPart = strings.TrimLeft(intPart, "0")
	if intPart == "" {
		intPart = "0"
	}
	u, err := strconv.ParseUint(intPart+frac, 10, 64)
	if err != nil || u > math.MaxInt64+1 || (u == math.MaxInt64+1 && !neg) {
		return 0, fmt.Errorf("money: %q is out of range", orig)
	}
	if neg {
		return int64(-u), nil // two's complement: also right for MinInt64
	}
	return int64(u), nil
}

func formatFixed(v int64, scale int) string {
	neg := v < 0
	var u uint64
	if neg {
		u = uint64(-(v + 1)) + 1 // safe for MinInt64
	} else {
		u = uint64(v)
	}
	digits := strconv.FormatUint(u, 10)
	if len(digits) <= scale {
		digits = strings.Repeat("0", scale-len(digits)+1) + digits
	}
	intPart, frac := digits[:len(digits)-scale], strings.TrimRight(digits[len(digits)-scale:], "0")
	out := intPart
	if frac != "" {
		out += "." + frac
	}
	if neg {
		out = "-" + out
	}
	return out
}

// String returns the exact decimal form without trailing zeros ("0.0125", "3", "-1.5").
func (a Amount) String() string { return formatFixed(int64(a), amountScale) }

// String returns the exact decimal form without trailing zeros ("0.15", "2").
func (r Rate) String() string { return formatFixed(int64(r), rateScale) }

// Add returns a+b, or ErrMoneyOverflow.
func (a Amount) Add(b Amount) (Amount, error) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, ErrMoneyOverflow
	}
	return s, nil
}

// Sub returns a-b, or ErrMoneyOverflow.
func (a Amount) Sub(b Amount) (Amount, error) {
	if b == math.MinInt64 {
		return 0, ErrMoneyOverflow
	}
	return a.Add(-b)
}

func (a Amount) mulInt(n int64) (Amount, error) {
	if a == 0 || n == 0 {
		return 0, nil
	}
	neg := (a < 0) != (n < 0)
	ua, un := absU(int64(a)), absU(n)
	hi, lo := bits.Mul64(ua, un)
	if hi != 0 || lo > math.MaxInt64 {
		return 0, ErrMoneyOverflow
	}
	v := int64(lo)
	if neg {
		v = -v
	}
	return Amount(v), nil
}

func absU(v int64) uint64 {
	if v < 0 {
		return uint64(-(v + 1)) + 1
	}
	return uint64(v)
}

// Cost returns the exact cost of tokens at rate r. tokens must be >= 0.
func (r Rate) Cost(tokens int64) (Amount, error) {
	if tokens < 0 {
		return 0, fmt.Errorf("money: negative token count %d", tokens)
	}
	return Amount(r).mulInt(tokens)
}

// Prices are the two rates of one backend (or one blend), per 1M tokens.
type Prices struct {
	Input  Rate `json:"input"`
	Output Rate `json:"output"`
}

// Cost is the cost of a request at these prices: prompt x input + completion x output.
func (p Prices) Cost(promptTokens, completionTokens int64) (Amount, error) {
	in, err := p.Input.Cost(promptTokens)
	if err != nil {
		return 0, err
	}
	out, err := p.Output.Cost(completionTokens)
	if err != nil {
		return 0, err
	}
	return in.Add(out)
}

// SearchFee is the fee for a number of web searches at price each: an exact
// product, or ErrMoneyOverflow. A negative count or price is an error (a
// price is configured as a non-negative decimal; a count is what ran).
func SearchFee(searches int64, price Amount) (Amount, error) {
	if searches < 0 {
		return 0, fmt.Errorf("money: negative search count %d", searches)
	}
	if price < 0 {
		return 0, fmt.Errorf("money: negative search price %s", price)
	}
	return price.mulInt(searches)
}

// BlendRates returns network*share + fallback*(1-share) where share =
// networkServed/allServed, rounded half-even to 6 decimals (the Rate's own
// scale). With allServed == 0 the share is 1 (docs/api.md, /pricing).
func BlendRates(network, fallback Rate, networkServed, allServed int64) Rate {
	if allServed <= 0 {
		return network
	}
	// (network*ns + fallback*(all-ns)) / all, exact then rounded half-even.
	num := new(big.Int).Mul(big.NewInt(int64(network)), big.NewInt(networkServed))
	num.Add(num, new(big.Int).Mul(big.NewInt(int64(fallback)), big.NewInt(allServed-networkServed)))
	den := big.NewInt(allServed)
	q, m := new(big.Int).QuoRem(num, den, new(big.Int))
	twice := new(big.Int).Mul(m, big.NewInt(2))
	switch twice.Cmp(den) {
	case 1:
		q.Add(q, big.NewInt(1))
	case 0:
		if q.Bit(0) == 1 {
			q.Add(q, big.NewInt(1))
		}
	}
	return Rate(q.Int64())
}

// MarshalJSON writes the amount as a JSON string (clients parse decimals).
func (a Amount) MarshalJSON() ([]byte, error) { return strconv.AppendQuote(nil, a.String()), nil }

// UnmarshalJSON accepts a decimal string or a bare JSON number literal, parsed exactly.
func (a *Amount) UnmarshalJSON(b []byte) error {
	v, err := ParseAmount(unquoteDecimal(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// MarshalJSON writes the rate as a JSON string.
func (r Rate) MarshalJSON() ([]byte, error) { return strconv.AppendQuote(nil, r.String()), nil }

// UnmarshalJSON accepts a decimal string or a bare JSON number literal, parsed exactly.
func (r *Rate) UnmarshalJSON(b []byte) error {
	v, err := ParseRate(unquoteDecimal(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

func unquoteDecimal(b []byte) string {
	s := string(b)
	if u, err := strconv.Unquote(s); err == nil {
		return u
	}
	return s
}
