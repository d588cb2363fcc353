package tollgate

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

func TestParseFormatRoundTrip(t *testing.T) {
	cases := []struct{ in, want string }{
		{"0", "0"}, {"1", "1"}, {"0.15", "0.15"}, {"0.150000", "0.15"}, {"000.5", "0.5"},
		{"-1.5", "-1.5"}, {"+2", "2"}, {"0.000000000001", "0.000000000001"},
		{"9223372.036854775807", "9223372.036854775807"}, {"-9223372.036854775808", "-9223372.036854775808"},
		{"12.3400000000000000000", "12.34"},
	}
	for _, c := range cases {
		a, err := ParseAmount(c.in)
		if err != nil {
			t.Fatalf("ParseAmount(%q): %v", c.in, err)
		}
		if got := a.String(); got != c.want {
			t.Errorf("ParseAmount(%q).String() = %q, want %q", c.in, got, c.want)
		}
	}
	for _, bad := range []string{"", "-", ".", "1.", ".5x", "1e3", "0.0000000000001", "9223372.036854775808", "1,5", " 1", "--1", "NaN"} {
		if _, err := ParseAmount(bad); err == nil {
			t.Errorf("ParseAmount(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"-0.1", "0.0000001", "abc"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) accepted", bad)
		}
	}
	if r := MustParseRate("0.000001"); r != 1 {
		t.Errorf("smallest rate = %d units, want 1", r)
	}
}

// Property: for random values, format then parse is the identity, and the
// decimal string equals big.Rat's exact rendering.
func TestAmountStringProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	scale := new(big.Rat).SetInt64(picoPerDollar)
	for i := 0; i < 20000; i++ {
		v := Amount(rng.Int64() - rng.Int64())
		s := v.String()
		back, err := ParseAmount(s)
		if err != nil || back != v {
			t.Fatalf("round trip %d -> %q -> %d (%v)", v, s, back, err)
		}
		want := new(big.Rat).Quo(new(big.Rat).SetInt64(int64(v)), scale)
		got, ok := new(big.Rat).SetString(s)
		if !ok || got.Cmp(want) != 0 {
			t.Fatalf("%d rendered %q, exact value %s", v, s, want.FloatString(12))
		}
	}
}

// Property: Cost is exact (equal to the big-integer product) or reports overflow.
func TestCostExactProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 20000; i++ {
		r := Rate(rng.Int64N(1 << 40))
		n := rng.Int64N(1 << 30)
		got, err := r.Cost(n)
		want := new(big.Int).Mul(big.NewInt(int64(r)), big.NewInt(n))
		if !want.IsInt64() {
			if err == nil {
				t.Fatalf("Cost(%d, %d) should overflow", r, n)
			}
			continue
		}
		if err != nil || int64(got) != want.Int64() {
			t.Fatalf("Cost(%d,%d) = %d, %v; want %s", r, n, got, err, want)
		}
	}
	if _, err := Rate(math.MaxInt64).Cost(2); err == nil {
		t.Fatal("overflow not detected")
	}
	if _, err := Amount(math.MaxInt64).Add(1); err == nil {
		t.Fatal("Add overflow not detected")
	}
	if _, err := Amount(math.MinInt64).Sub(1); err == nil {
		t.Fatal("Sub overflow not detected")
	}
}

func TestPricesCost(t *testing.T) {
	p := Prices{Input: MustParseRate("0.15"), Output: MustParseRate("0.6")}
	c, err := p.Cost(1000, 500)
	if err != nil {
		t.Fatal(err)
	}
	// 1000 * 0.15/1e6 + 500 * 0.6/1e6 = 0.00015 + 0.0003 = 0.00045
	if c.String() != "0.00045" {
		t.Fatalf("cost = %s, want 0.00045", c)
	}
	// Smallest rate on one token is one picodollar.
	c, _ = Prices{Input: 1}.Cost(1, 0)
	if c.String() != "0.000000000001" {
		t.Fatalf("cost = %s", c)
	}
}

func TestSearchFee(t *testing.T) {
	price := MustParseAmount("0.005")
	fee, err := SearchFee(3, price)
	if err != nil || fee.String() != "0.015" {
		t.Fatalf("SearchFee(3, 0.005) = %s, %v; want 0.015", fee, err)
	}
	if fee, err := SearchFee(0, price); err != nil || fee != 0 {
		t.Fatalf("no search: %s, %v", fee, err)
	}
	if fee, err := SearchFee(7, 0); err != nil || fee != 0 {
		t.Fatalf("free searches: %s, %v", fee, err)
	}
	if _, err := SearchFee(2, Amount(math.MaxInt64/2+1)); !errors.Is(err, ErrMoneyOverflow) {
		t.Fatalf("overflow: %v", err)
	}
	if _, err := SearchFee(math.MaxInt64, 2); !errors.Is(err, ErrMoneyOverflow) {
		t.Fatalf("overflow of the count: %v", err)
	}
	if _, err := SearchFee(-1, price); err == nil {
		t.Fatal("a negative count was accepted")
	}
	if _, err := SearchFee(1, -price); err == nil {
		t.Fatal("a negative price was accepted")
	}
	// The whole cost of a request with searches adds up exactly.
	tokens, _ := Prices{Input: MustParseRate("0.15"), Output: MustParseRate("0.6")}.Cost(1000, 500)
	total, err := tokens.Add(fee)
	if err != nil || total.String() != "0.01545" {
		t.Fatalf("tokens + searches = %s, %v", total, err)
	}
}

func TestBlendRatesHalfEven(t *testing.T) {
	cases := []struct {
		n, f     string
		ns, all  int64
		expected string
	}{
		{"1", "3", 0, 0, "1"},                      // no traffic: share 1
		{"1", "3", 1, 2, "2"},                      // halfway
		{"1", "3", 3, 4, "1.5"},                    // 0.75
		{"0.000001", "0", 1, 2, "0"},               // 0.0000005 -> half-even to 0
		{"0.000003", "0", 1, 2, "0.000002"},        // 0.0000015 -> 0.000002
		{"0.000001", "0.000002", 2, 3, "0.000001"}, // 1.333... -> 1
		{"0.2", "0.5", 0, 10, "0.5"},
	}
	for _, c := range cases {
		got := BlendRates(MustParseRate(c.n), MustParseRate(c.f), c.ns, c.all)
		if got.String() != c.expected {
			t.Errorf("Blend(%s,%s,%d/%d) = %s, want %s", c.n, c.f, c.ns, c.all, got, c.expected)
		}
	}
}

func TestMoneyJSON(t *testing.T) {
	b, _ := MustParseAmount("1.25").MarshalJSON()
	if string(b) != `"1.25"` {
		t.Fatalf("marshal = %s", b)
	}
	var a Amount
	if err := a.UnmarshalJSON([]byte(`"0.000000000123"`)); err != nil || a != 123 {
		t.Fatalf("unmarshal string = %d, %v", a, err)
	}
	if err := a.UnmarshalJSON([]byte(`2.5`)); err != nil || a.String() != "2.5" {
		t.Fatalf("unmarshal number = %s, %v", a, err)
	}
}
