package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Accounts and keys: the CLI's `accounts create|list|disable|enable` and
// `keys create|list|revoke` over HTTP (docs/admin-api.md).

// decodeBody reads a JSON object of at most 64 KiB into v, refusing unknown
// fields; want describes the expected body in the error.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, want string) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return tollgate.Errorf(tollgate.CodeInvalidRequest, "want %s: %v", want, err)
	}
	if dec.More() {
		return tollgate.Errorf(tollgate.CodeInvalidRequest, "want %s and nothing after it", want)
	}
	return nil
}

// accountView is an account with its money as the books say now.
func (a *API) accountView(r *http.Request, acct tollgate.Account) (AccountView, error) {
	b, err := a.st.Balance(r.Context(), acct.ID)
	if err != nil {
		return AccountView{}, notFound("account", acct.ID, err)
	}
	acct.Balance = b.Balance
	return AccountView{Account: acct, Held: b.Held, Free: b.Free}, nil
}

func (a *API) listAccounts(w http.ResponseWriter, r *http.Request) error {
	accts, err := a.st.Accounts(r.Context())
	if err != nil {
		return err
	}
	views := make([]AccountView, 0, len(accts))
	for _, acct := range accts {
		v, err := a.accountView(r, acct)
		if err != nil {
			return err
		}
		views = append(views, v)
	}
	return writeJSON(w, http.StatusOK, list(views))
}

// CreateAccountRequest is the body of POST /admin/v1/accounts.
type CreateAccountRequest struct {
	Name string `json:"name"`
}

func (a *API) createAccount(w http.ResponseWriter, r *http.Request) error {
	var req CreateAccountRequest
	if err := decodeBody(w, r, &req, `{"name": "..."}`); err != nil {
		return err
	}
	acct := tollgate.Account{ID: tollgate.NewID("acct_"), Name: strings.TrimSpace(req.Name), Created: a.opts.Now().UTC().Truncate(time.Microsecond)}
	if err := a.st.CreateAccount(r.Context(), acct); err != nil {
		return err
	}
	a.opts.Log.Info("account created", "account", acct.ID, "name", acct.Name)
	v, err := a.accountView(r, acct)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, v)
}

func (a *API) setDisabled(disabled bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		id := r.PathValue("id")
		if err := a.st.SetAccountDisabled(r.Context(), id, disabled); err != nil {
			return notFound("account", id, err)
		}
		acct, err := a.st.Account(r.Context(), id)
		if err != nil {
			return notFound("account", id, err)
		}
		a.opts.Log.Info("account disabled flag set", "account", id, "disabled", disabled)
		v, err := a.accountView(r, acct)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, v)
	}
}

func (a *API) listKeys(w http.ResponseWriter, r *http.Request) error {
	account := r.URL.Query().Get("account")
	if account != "" {
		if _, err := a.st.Account(r.Context(), account); err != nil {
			return notFound("account", account, err)
		}
	}
	keys, err := a.st.Keys(r.Context(), account)
	if err != nil {
		return err
	}
	if keys == nil {
		keys = []tollgate.Key{}
	}
	return writeJSON(w, http.StatusOK, list(keys))
}

// CreateKeyRequest is the body of POST /admin/v1/keys.
type CreateKeyRequest struct {
	AccountID string `json:"account_id"`
	Name      string `json:"name"`
	// Expires: a duration from now ("720h", "30d") or a time (RFC 3339, or
	// a date: midnight UTC); empty: never.
	Expires string `json:"expires"`
	// Models the key may call (catalogue ids); empty: all.
	Models     []string        `json:"models"`
	SpendLimit tollgate.Amount `json:"spend_limit"`
	RPM        int64           `json:"rpm"`
	TPM        int64           `json:"tpm"`
}

// CreatedKey is the answer to POST /admin/v1/keys: the secret is shown this
// once.
type CreatedKey struct {
	Key    tollgate.Key `json:"key"`
	Secret string       `json:"secret"`
}

func (a *API) createKey(w http.ResponseWriter, r *http.Request) error {
	var req CreateKeyRequest
	if err := decodeBody(w, r, &req, `{"account_id": "acct_...", "name", "expires", "models", "spend_limit", "rpm", "tpm"}`); err != nil {
		return err
	}
	k, err := NewKey(req, a.opts.Models, a.opts.Now())
	if err != nil {
		return err
	}
	if _, err := a.st.Account(r.Context(), req.AccountID); err != nil {
		return notFound("account", req.AccountID, err)
	}
	secret := tollgate.NewKeySecret()
	k.Prefix = tollgate.DisplayPrefix(secret)
	if err := a.st.CreateKey(r.Context(), k, tollgate.HashKey(secret)); err != nil {
		return err
	}
	a.opts.Log.Info("key created", "key", k.ID, "account", k.AccountID)
	return writeJSON(w, http.StatusCreated, CreatedKey{Key: k, Secret: secret})
}

// NewKey checks a key's request (account, limits, expiry, models against
// the catalogue's ids, when not nil) and returns the key to store, without
// its prefix: the admin API and the console both create keys with it.
func NewKey(req CreateKeyRequest, catalogue []string, now time.Time) (tollgate.Key, error) {
	now = now.UTC().Truncate(time.Microsecond)
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: req.AccountID, Name: strings.TrimSpace(req.Name), Created: now,
		AllowedModels: []string{}, SpendLimit: req.SpendLimit, RPM: req.RPM, TPM: req.TPM}
	switch {
	case req.AccountID == "":
		return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "account_id", "account_id is required")
	case req.SpendLimit < 0:
		return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "spend_limit", "spend_limit must not be negative (0 or absent: no limit)")
	case req.RPM < 0 || req.TPM < 0:
		return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "rpm", "rpm and tpm must not be negative (0 or absent: no limit)")
	}
	if req.Expires != "" {
		var err error
		if k.Expires, err = tollgate.ParseExpiry(req.Expires, now); err != nil {
			return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "expires", "expires %v", err)
		}
	}
	for _, m := range req.Models {
		if catalogue != nil && !slices.Contains(catalogue, m) {
			return k, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "models", "%q is not in the catalogue (%s)", m, strings.Join(catalogue, ", "))
		}
		if !slices.Contains(k.AllowedModels, m) {
			k.AllowedModels = append(k.AllowedModels, m)
		}
	}
	return k, nil
}

func (a *API) revokeKey(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := a.st.RevokeKey(r.Context(), id, a.opts.Now().UTC().Truncate(time.Microsecond)); err != nil {
		return notFound("key", id, err)
	}
	keys, err := a.st.Keys(r.Context(), "")
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k.ID == id {
			a.opts.Log.Info("key revoked", "key", id, "account", k.AccountID)
			return writeJSON(w, http.StatusOK, k)
		}
	}
	return fmt.Errorf("key %s was revoked but is not listed", id)
}

// Invitation is the answer to POST /admin/v1/accounts/{id}/invite: the
// console path (on the api listener) where the holder sets a password.
type Invitation struct {
	AccountID string    `json:"account_id"`
	Path      string    `json:"path"`
	Expires   time.Time `json:"expires"`
}

func (a *API) invite(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	token, expires, err := tollgate.IssueInvite(r.Context(), a.st, id, a.opts.Now())
	if err != nil {
		return notFound("account", id, err)
	}
	a.opts.Log.Info("console invitation issued", "account", id, "expires", expires)
	return writeJSON(w, http.StatusCreated, Invitation{AccountID: id, Path: tollgate.InvitePath(token), Expires: expires})
}

// listOf is the list envelope the usage report also uses.
type listOf[T any] struct {
	Object string `json:"object"`
	Data   []T    `json:"data"`
}

func list[T any](data []T) listOf[T] { return listOf[T]{Object: "list", Data: data} }
