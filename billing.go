package tollgate

import (
	"context"
	"time"
)

// HoldRequest asks to reserve balance for one request before its backend is
// called (docs/billing.md): an upper bound of its cost at the rates of
// the backend chosen to serve it.
type HoldRequest struct {
	RequestID string
	AccountID string
	KeyID     string
	Model     string
	Class     BackendClass
	Amount    Amount
	// TokenBound is prompt bound + output cap × n: what a tokens-per-minute limit counts.
	TokenBound int64
	Time       time.Time
}

// Charge is the settled cost of one request: the ledger row.
type Charge struct {
	RequestID        string
	AccountID        string
	KeyID            string
	Model            string
	Class            BackendClass
	Node             string
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64 // 0 when the backend did not report them
	ReasoningTokens  int64 // 0 when the backend did not report them
	Prices           Prices
	// Searches is the number of web searches that ran for the request and
	// SearchPrice the price of one; their product (SearchFee) is part of
	// Cost: prompt × input + completion × output + Searches × SearchPrice.
	Searches    int64
	SearchPrice Amount
	Cost        Amount
	Estimated   bool // the backend reported no usage: tokens were counted locally
	Time        time.Time
}

// Biller reserves and settles money for requests. The relay calls Hold after
// routing and before the backend, then exactly one of Settle or Release.
type Biller interface {
	// Hold reserves req.Amount. It fails with *Error insufficient_balance,
	// key_limit_reached or rate_limit_exceeded, and then nothing runs.
	Hold(ctx context.Context, req HoldRequest) (holdID string, err error)
	// Settle charges c.Cost, releases the rest of the hold and writes the
	// ledger row, atomically. It returns the amount actually charged.
	Settle(ctx context.Context, holdID string, c Charge) (charged Amount, err error)
	// Release frees the hold without a charge.
	Release(ctx context.Context, holdID string) error
}
