// Package operator holds what an operator does to accounts and keys:
// create an account, credit and debit it, disable and enable it, invite its
// holder to the console, create keys with their limits and revoke them, and
// read a usage filter. Each is written once here; the CLI (cmd/tollgate),
// the admin API (admin), the operator's console and the account holder's
// console (console, for the holder's own keys) are faces that parse their
// input, call these and word the answer their own way.
//
// Bad input is a *tollgate.Error with code invalid_request; a key's field
// at fault is its Param, and its Message starts with that field's name (the
// CLI puts its flag's name in its place). A record that does not exist is
// the store's error, wrapping tollgate.ErrNotFound.
package operator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Accounts is what the account operations read and write.
type Accounts interface {
	CreateAccount(ctx context.Context, a tollgate.Account) error
	Account(ctx context.Context, id string) (tollgate.Account, error) // tollgate.ErrNotFound
	SetAccountDisabled(ctx context.Context, id string, disabled bool) error
}

// Keys is what the key operations read and write.
type Keys interface {
	Account(ctx context.Context, id string) (tollgate.Account, error) // tollgate.ErrNotFound
	CreateKey(ctx context.Context, k tollgate.Key, h tollgate.KeyHash) error
	Keys(ctx context.Context, accountID string) ([]tollgate.Key, error) // every account's when accountID == ""
	RevokeKey(ctx context.Context, id string, at time.Time) error
}

// Books is what crediting, debiting and reading an account's money need.
type Books interface {
	// PostEntry records a credit or a debit and changes the balance, atomically.
	PostEntry(ctx context.Context, e *tollgate.LedgerEntry) error
	Balance(ctx context.Context, accountID string) (tollgate.Balance, error)
}

// Inviter keeps console invitations.
type Inviter interface {
	CreateInvite(ctx context.Context, h tollgate.KeyHash, inv tollgate.ConsoleInvite) error
}

// Store is every operation's store: what a face that does them all holds.
type Store interface {
	Accounts
	Keys
	Books
	Inviter
}

// stamp is now as the stores keep times: UTC, to the microsecond.
func stamp(now time.Time) time.Time { return now.UTC().Truncate(time.Microsecond) }

// CreateAccount creates an account with a zero balance, named name (spaces
// around it trimmed). Whether a name is required is the face's rule.
func CreateAccount(ctx context.Context, st Accounts, name string, now time.Time) (tollgate.Account, error) {
	a := tollgate.Account{ID: tollgate.NewID("acct_"), Name: strings.TrimSpace(name), Created: stamp(now)}
	if err := st.CreateAccount(ctx, a); err != nil {
		return tollgate.Account{}, err
	}
	return a, nil
}

// SetDisabled disables the account (every key of it is refused with 403
// account_disabled) or enables it again, and returns it as it is now.
func SetDisabled(ctx context.Context, st Accounts, id string, disabled bool) (tollgate.Account, error) {
	if err := st.SetAccountDisabled(ctx, id, disabled); err != nil {
		return tollgate.Account{}, err
	}
	return st.Account(ctx, id)
}

// AccountView is an account with its money as the books say now.
type AccountView struct {
	tollgate.Account
	Held tollgate.Amount `json:"held"`
	Free tollgate.Amount `json:"free"`
}

// View reads a's money: its balance (in place of the one a was read with),
// what requests in flight hold of it, and what is free.
func View(ctx context.Context, st Books, a tollgate.Account) (AccountView, error) {
	b, err := st.Balance(ctx, a.ID)
	if err != nil {
		return AccountView{}, err
	}
	a.Balance = b.Balance
	return AccountView{Account: a, Held: b.Held, Free: b.Free}, nil
}

// Posted is a credit or a debit and the account's money after it.
type Posted struct {
	Entry   tollgate.LedgerEntry `json:"entry"`
	Balance tollgate.Balance     `json:"balance"`
}

// Post credits (kind credit) or debits (kind debit) the account amount
// (more than zero) with a note and who made it (tollgate.LedgerEntry.Actor:
// "the CLI as ops@host", "the admin API from 10.0.0.2"), kept in the
// ledger. A debit may not take
// more than the free balance: the store refuses it with
// insufficient_balance and nothing changes.
func Post(ctx context.Context, st Books, kind tollgate.LedgerKind, accountID string, amount tollgate.Amount, note, actor string, now time.Time) (Posted, error) {
	if kind != tollgate.LedgerCredit && kind != tollgate.LedgerDebit {
		return Posted{}, tollgate.Errorf(tollgate.CodeInvalidRequest, "an operator posts a credit or a debit, not a %s", kind)
	}
	if amount <= 0 {
		return Posted{}, tollgate.Errorf(tollgate.CodeInvalidRequest, "the amount must be positive, got %s", amount)
	}
	e := tollgate.LedgerEntry{ID: tollgate.NewID("le_"), Kind: kind, AccountID: accountID, Amount: amount, Note: note, Actor: actor, Time: stamp(now)}
	if err := st.PostEntry(ctx, &e); err != nil {
		return Posted{}, err
	}
	b, err := st.Balance(ctx, accountID)
	if err != nil {
		return Posted{}, err
	}
	return Posted{Entry: e, Balance: b}, nil
}

// Invitation is a one-time invitation to set an account's console
// password: Path is the page on the api listener that takes it.
type Invitation struct {
	AccountID string    `json:"account_id"`
	Path      string    `json:"path"`
	Expires   time.Time `json:"expires"`
}

// Invite issues a one-time invitation for the account's holder
// (tollgate.InviteTTL long).
func Invite(ctx context.Context, st Inviter, accountID string, now time.Time) (Invitation, error) {
	token, expires, err := tollgate.IssueInvite(ctx, st, accountID, now)
	if err != nil {
		return Invitation{}, err
	}
	return Invitation{AccountID: accountID, Path: tollgate.InvitePath(token), Expires: expires}, nil
}

// KeyRequest asks for a key (the body of POST /admin/v1/keys).
type KeyRequest struct {
	AccountID string `json:"account_id"`
	Name      string `json:"name"`
	// Expires: a duration from now ("720h", "30d") or a time (RFC 3339, or
	// a date: midnight UTC); empty: never.
	Expires string `json:"expires"`
	// Models the key may call (catalogue ids); empty: all.
	Models []string `json:"models"`
	// SpendLimit, RPM and TPM: 0, no limit.
	SpendLimit tollgate.Amount `json:"spend_limit"`
	RPM        int64           `json:"rpm"`
	TPM        int64           `json:"tpm"`
}

// CreatedKey is a new key and its secret, which is shown this once (only
// its hash is stored).
type CreatedKey struct {
	Key    tollgate.Key `json:"key"`
	Secret string       `json:"secret"`
}

// NewKey checks a key's request (account, limits, expiry, models against
// the catalogue's ids when catalogue is not nil) and returns the key to
// store, without its prefix. Repeated models are kept once.
func NewKey(req KeyRequest, catalogue []string, now time.Time) (tollgate.Key, error) {
	now = stamp(now)
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: req.AccountID, Name: strings.TrimSpace(req.Name), Created: now,
		AllowedModels: []string{}, SpendLimit: req.SpendLimit, RPM: req.RPM, TPM: req.TPM}
	switch {
	case req.AccountID == "":
		return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "account_id", "account_id is required")
	case req.SpendLimit < 0:
		return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "spend_limit", "spend_limit must not be negative (0 or absent: no limit)")
	case req.RPM < 0:
		return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "rpm", "rpm must not be negative (0 or absent: no limit)")
	case req.TPM < 0:
		return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "tpm", "tpm must not be negative (0 or absent: no limit)")
	}
	if req.Expires != "" {
		var err error
		if k.Expires, err = tollgate.ParseExpiry(req.Expires, now); err != nil {
			return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "expires", "expires %v", err)
		}
	}
	for _, m := range req.Models {
		if catalogue != nil && !slices.Contains(catalogue, m) {
			return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "models", "models: %q is not in the catalogue (%s)", m, strings.Join(catalogue, ", "))
		}
		if !slices.Contains(k.AllowedModels, m) {
			k.AllowedModels = append(k.AllowedModels, m)
		}
	}
	return k, nil
}

// CreateKey checks the request (NewKey), that its account exists, and
// stores a new key for it.
func CreateKey(ctx context.Context, st Keys, req KeyRequest, catalogue []string, now time.Time) (CreatedKey, error) {
	k, err := NewKey(req, catalogue, now)
	if err != nil {
		return CreatedKey{}, err
	}
	if _, err := st.Account(ctx, req.AccountID); err != nil {
		return CreatedKey{}, err
	}
	secret := tollgate.NewKeySecret()
	k.Prefix = tollgate.DisplayPrefix(secret)
	if err := st.CreateKey(ctx, k, tollgate.HashKey(secret)); err != nil {
		return CreatedKey{}, err
	}
	return CreatedKey{Key: k, Secret: secret}, nil
}

// ListKeys returns the account's keys, oldest first, or every account's
// when accountID is "" (never nil); tollgate.ErrNotFound when there is no
// such account.
func ListKeys(ctx context.Context, st Keys, accountID string) ([]tollgate.Key, error) {
	if accountID != "" {
		if _, err := st.Account(ctx, accountID); err != nil {
			return nil, err
		}
	}
	keys, err := st.Keys(ctx, accountID)
	if keys == nil && err == nil {
		keys = []tollgate.Key{}
	}
	return keys, err
}

// RevokeKey revokes key id and returns it revoked. With accountID not "",
// only that account's key: another account's key is not found, whether or
// not it exists. Revoking twice keeps the first time.
func RevokeKey(ctx context.Context, st Keys, accountID, id string, now time.Time) (tollgate.Key, error) {
	keys, err := st.Keys(ctx, accountID)
	if err != nil {
		return tollgate.Key{}, err
	}
	i := slices.IndexFunc(keys, func(k tollgate.Key) bool { return k.ID == id })
	if i < 0 {
		return tollgate.Key{}, fmt.Errorf("key %s: %w", id, tollgate.ErrNotFound)
	}
	now = stamp(now)
	if err := st.RevokeKey(ctx, id, now); err != nil {
		return tollgate.Key{}, err
	}
	k := keys[i]
	if k.Revoked.IsZero() {
		k.Revoked = now
	}
	return k, nil
}
