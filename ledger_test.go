package tollgate

import (
	"math"
	"testing"
	"time"
)

func TestOperatorEntryRules(t *testing.T) {
	e := LedgerEntry{ID: "le_1", AccountID: "a", Time: time.Now(), Kind: LedgerDebit, Amount: MustParseAmount("2")}
	if got, err := e.OperatorAmount(); err != nil || got != -MustParseAmount("2") {
		t.Fatalf("debit of 2 = %s, %v", got, err)
	}
	e.Kind, e.Amount = LedgerCredit, -MustParseAmount("3")
	if got, err := e.OperatorAmount(); err != nil || got != MustParseAmount("3") {
		t.Fatalf("credit given as -3 = %s, %v", got, err)
	}
	e.Amount = 0
	if _, err := e.OperatorAmount(); ErrorCode(err) != CodeInvalidRequest {
		t.Fatalf("zero amount: %v", err)
	}
	e.Kind, e.Amount = LedgerCharge, 1
	if _, err := e.OperatorAmount(); ErrorCode(err) != CodeInvalidRequest {
		t.Fatalf("an operator charge: %v", err)
	}
	// A debit may take the free balance (10 - 4 held = 6) and no more.
	if err := CheckOperatorEntry(-Dollars(6), Dollars(10), Dollars(4)); err != nil {
		t.Fatalf("debit of exactly the free balance: %v", err)
	}
	if err := CheckOperatorEntry(-Dollars(6)-1, Dollars(10), Dollars(4)); ErrorCode(err) != CodeInsufficientBalance {
		t.Fatalf("debit above the free balance: %v", err)
	}
	if err := CheckOperatorEntry(1, Amount(math.MaxInt64), 0); ErrorCode(err) != CodeInvalidRequest {
		t.Fatalf("a credit past the largest balance: %v", err)
	}
}
