// Package admin is the operator's HTTP API on the admin listener: accounts
// and keys, balances, credits and debits, usage reports and the audit of
// the books (docs/admin-api.md). Every request needs the admin token as a bearer
// token; it is compared in constant time.
//
// The package serves endpoints and does not choose their paths: each is a
// method, served through Authorized on the path cmd/tollgate/routes.go
// declares for it; NotFound answers the rest of /admin/v1/.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/operator"
	"github.com/tollgate/tollgate/server"
)

// Store is what the admin API reads and writes: the operator's operations'
// store and the books (usage, audit).
type Store interface {
	operator.Store
	billing.BooksStore
	Accounts(ctx context.Context) ([]tollgate.Account, error)
}

// Options configure the API.
type Options struct {
	// Token is the admin token; empty refuses every request.
	Token string
	// AuditGrace is how long past its lease a hold may live before the
	// audit calls it orphaned (the sweep interval plus a margin).
	AuditGrace time.Duration
	// Models are the catalogue's model ids, which a key's allow-list may
	// name; nil: not checked.
	Models []string
	Log    *slog.Logger
	Now    func() time.Time
	// Payments serves the payment routes (nil: payments are off).
	Payments Payments
}

// API serves the admin routes, under /admin/v1/ on the admin listener.
type API struct {
	st    Store
	opts  Options
	token [32]byte
}

// New builds the API.
func New(st Store, o Options) *API {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &API{st: st, opts: o, token: sha256.Sum256([]byte(o.Token))}
}

// Authorized serves h to a request with the admin token (401 unauthorized
// otherwise), with h's error in the error envelope.
func (a *API) Authorized(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(r.Header.Get("Authorization")) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate-admin"`)
			writeError(w, a.opts.Log, tollgate.Errorf(tollgate.CodeUnauthorized, "the admin API needs Authorization: Bearer <admin token>"))
			return
		}
		if err := h(w, r); err != nil {
			writeError(w, a.opts.Log, err)
		}
	})
}

// NotFound answers a path under /admin/v1/ that no endpoint is served on.
func (a *API) NotFound(w http.ResponseWriter, r *http.Request) error {
	return tollgate.Errorf(tollgate.CodeNotFound, "%s %s is not an admin API route", r.Method, r.URL.Path)
}

// authorized compares hashes of the presented and the configured token, so
// the comparison takes the same time whatever the lengths.
func (a *API) authorized(header string) bool {
	if a.opts.Token == "" {
		return false
	}
	// The scheme is case-insensitive (RFC 9110 §11.1), as on the API listener.
	scheme, got, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(got)))
	return subtle.ConstantTimeCompare(h[:], a.token[:]) == 1
}

// ShowAccount is one account with its money.
func (a *API) ShowAccount(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	acct, err := a.st.Account(r.Context(), id)
	if err != nil {
		return notFound("account", id, err)
	}
	v, err := operator.View(r.Context(), a.st, acct)
	if err != nil {
		return notFound("account", id, err)
	}
	return writeJSON(w, http.StatusOK, v)
}

// PostRequest is the body of a credit or a debit.
type PostRequest struct {
	Amount tollgate.Amount `json:"amount"`
	Note   string          `json:"note"`
}

// Credit adds money to an account.
func (a *API) Credit(w http.ResponseWriter, r *http.Request) error {
	return a.post(w, r, tollgate.LedgerCredit)
}

// Debit takes money from an account.
func (a *API) Debit(w http.ResponseWriter, r *http.Request) error {
	return a.post(w, r, tollgate.LedgerDebit)
}

func (a *API) post(w http.ResponseWriter, r *http.Request, kind tollgate.LedgerKind) error {
	var req PostRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "amount",
			`want {"amount": "12.50", "note": "..."} with the amount a decimal string of USD: %v`, err)
	}
	id := r.PathValue("id")
	p, err := operator.Post(r.Context(), a.st, kind, id, req.Amount, req.Note, "the admin API from "+clientHost(r), a.opts.Now())
	if err != nil {
		return notFound("account", id, err)
	}
	a.opts.Log.Info("ledger entry posted", "kind", kind, "account", id, "amount", p.Entry.Amount.String(), "entry", p.Entry.ID)
	return writeJSON(w, http.StatusOK, p)
}

// Usage is the usage report, filtered and grouped as the query asks.
func (a *API) Usage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f, err := operator.ParseFilter(q.Get("account"), q.Get("key"), q.Get("model"), q.Get("backend"), q.Get("since"), q.Get("until"), a.opts.Now())
	if err != nil {
		return err
	}
	var by []string
	if v := q.Get("by"); v != "" {
		by = strings.Split(v, ",")
	}
	rows, err := billing.Usage(r.Context(), a.st, f, by, q.Get("period"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, list(rows))
}

// Audit runs the audit of the books and answers its report.
func (a *API) Audit(w http.ResponseWriter, r *http.Request) error {
	rep, err := billing.RunAudit(r.Context(), a.st, a.opts.Now(), a.opts.AuditGrace, tollgate.AuditFromAdminAPI)
	if errors.Is(err, billing.ErrAuditNotRecorded) {
		// The report is whole: the caller gets it, the log gets the failure.
		a.opts.Log.Warn("admin API audit", "ok", rep.OK, "err", err)
	} else if err != nil {
		return err
	}
	rep.Details = nil
	return writeJSON(w, http.StatusOK, rep)
}

func notFound(what, id string, err error) error {
	if errors.Is(err, tollgate.ErrNotFound) {
		return tollgate.Errorf(tollgate.CodeNotFound, "%s %s does not exist", what, id)
	}
	return err
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeError answers with the one error mapper every listener uses.
func writeError(w http.ResponseWriter, log *slog.Logger, err error) {
	server.WriteError(w, log, err)
}

// clientHost is the address the request came from, for the ledger's
// record of who posted an entry.
func clientHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
