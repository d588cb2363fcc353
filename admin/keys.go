package admin

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/operator"
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
func (a *API) accountView(r *http.Request, acct tollgate.Account) (operator.AccountView, error) {
	v, err := operator.View(r.Context(), a.st, acct)
	if err != nil {
		return v, notFound("account", acct.ID, err)
	}
	return v, nil
}

// ListAccounts lists the accounts with their money.
func (a *API) ListAccounts(w http.ResponseWriter, r *http.Request) error {
	accts, err := a.st.Accounts(r.Context())
	if err != nil {
		return err
	}
	views := make([]operator.AccountView, 0, len(accts))
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

// CreateAccount creates an account.
func (a *API) CreateAccount(w http.ResponseWriter, r *http.Request) error {
	var req CreateAccountRequest
	if err := decodeBody(w, r, &req, `{"name": "..."}`); err != nil {
		return err
	}
	acct, err := operator.CreateAccount(r.Context(), a.st, req.Name, a.opts.Now())
	if err != nil {
		return err
	}
	a.opts.Log.Info("account created", "account", acct.ID, "name", acct.Name)
	v, err := a.accountView(r, acct)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, v)
}

// Disable refuses the account's keys and ends its console sessions.
func (a *API) Disable(w http.ResponseWriter, r *http.Request) error { return a.setDisabled(w, r, true) }

// Enable lets a disabled account spend again.
func (a *API) Enable(w http.ResponseWriter, r *http.Request) error { return a.setDisabled(w, r, false) }

func (a *API) setDisabled(w http.ResponseWriter, r *http.Request, disabled bool) error {
	id := r.PathValue("id")
	acct, err := operator.SetDisabled(r.Context(), a.st, id, disabled)
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

// ListKeys lists the keys; ?account= one account's.
func (a *API) ListKeys(w http.ResponseWriter, r *http.Request) error {
	account := r.URL.Query().Get("account")
	keys, err := operator.ListKeys(r.Context(), a.st, account)
	if err != nil {
		return notFound("account", account, err)
	}
	return writeJSON(w, http.StatusOK, list(keys))
}

// CreateKey creates a key with its limits and answers its secret, the
// only time it is shown.
func (a *API) CreateKey(w http.ResponseWriter, r *http.Request) error {
	var req operator.KeyRequest
	if err := decodeBody(w, r, &req, `{"account_id": "acct_...", "name", "expires", "models", "spend_limit", "rpm", "tpm"}`); err != nil {
		return err
	}
	created, err := operator.CreateKey(r.Context(), a.st, req, a.opts.Models, a.opts.Now())
	if err != nil {
		return notFound("account", req.AccountID, err)
	}
	a.opts.Log.Info("key created", "key", created.Key.ID, "account", created.Key.AccountID)
	return writeJSON(w, http.StatusCreated, created)
}

// RevokeKey revokes a key.
func (a *API) RevokeKey(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	k, err := operator.RevokeKey(r.Context(), a.st, "", id, a.opts.Now())
	if err != nil {
		return notFound("key", id, err)
	}
	a.opts.Log.Info("key revoked", "key", id, "account", k.AccountID)
	return writeJSON(w, http.StatusOK, k)
}

// Invite issues an invitation to set the account's console password.
func (a *API) Invite(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	inv, err := operator.Invite(r.Context(), a.st, id, a.opts.Now())
	if err != nil {
		return notFound("account", id, err)
	}
	a.opts.Log.Info("console invitation issued", "account", id, "expires", inv.Expires)
	return writeJSON(w, http.StatusCreated, inv)
}

// listOf is the list envelope the usage report also uses.
type listOf[T any] struct {
	Object string `json:"object"`
	Data   []T    `json:"data"`
}

func list[T any](data []T) listOf[T] { return listOf[T]{Object: "list", Data: data} }
