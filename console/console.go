// Package console is the web console on the api listener, under /console/:
// an account holder signs in, sees the balance and what it was spent on,
// creates and revokes keys, and reads the prices (docs/console.md). Pages
// are rendered on the server with html/template, the stylesheet and the one
// script are embedded, and every page works without JavaScript except the
// copy buttons.
//
// The package serves pages and does not choose their paths: each page is a
// method, served through Page (or SignedIn, for an account holder's pages)
// on the path cmd/tollgate/routes.go declares for it; NotFound answers the
// rest of /console/. The operator's console (Operator) is the same on the
// admin listener.
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/operator"
	"github.com/tollgate/tollgate/relay"
)

// Store is what the console reads and writes.
type Store interface {
	tollgate.ConsoleStore
	billing.BooksStore
	operator.Keys
}

// UptimeReader returns the requests served over the last 7 days, by the
// network and in all (traffic.Share), which /pricing blends rates with.
type UptimeReader interface {
	Uptime(ctx context.Context) (network, total int64, err error)
}

// Options configure the console.
type Options struct {
	// Catalog returns the current catalogue (relay.Relay.Catalog).
	Catalog func() *relay.Catalog
	Uptime  UptimeReader
	// SessionTTL is how long a sign-in lasts; 0: 12 hours.
	SessionTTL time.Duration
	// TrustedProxies are the addresses whose X-Forwarded-For and
	// X-Forwarded-Proto are believed (a TLS-terminating proxy in front).
	TrustedProxies []netip.Prefix
	// Password is argon2id's cost; zero: DefaultPasswordParams.
	Password PasswordParams
	Log      *slog.Logger
	Now      func() time.Time
	// Payments serves the payment pages (nil: payments are off, and the
	// console shows no payment UI).
	Payments Payments
}

// Prefix is the console's root on the api listener (and the operator's on
// the admin listener): where a sign-in sends the browser, the path of its
// cookies.
const Prefix = "/console/"

const (
	sessionCookie = "tg_console"
	formCookie    = "tg_form" // the pre-session of the forms shown before sign-in (csrf.go)
	// Failed sign-ins allowed per window: to one account from one client
	// address (or IPv6 /64), to one account from anywhere, and from one
	// client address to any account. The first is the one a holder who
	// mistypes meets; the second stops a guesser with many addresses
	// without letting one client lock the holder out (docs/decisions.md).
	accountFailures    = 10
	accountFailuresAll = 100
	addressFailures    = 30
	failureWindow      = 15 * time.Minute
	// Invitations accepted (or tried) per window from one client address.
	addressInvites = 10
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console serves the account holder's pages.
type Console struct {
	st    Store
	o     Options
	pages map[string]*template.Template
	files http.Handler // the embedded static files, under /console/static/

	// Sign-in attempts by (account, client), by account, by client; and
	// invitation attempts by client.
	byAccountClient, byAccount, byAddress, invites *attempts
	hashing                                        hashSlots
	closed                                         closedDays
	dummyHash                                      string // verified against when the account has no password, so both take as long
	// secret signs the pre-sessions of the forms shown before sign-in:
	// ConsoleSecret, the same on every instance.
	secret []byte
}

// New builds the console.
func New(st Store, o Options) (*Console, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.SessionTTL <= 0 {
		o.SessionTTL = 12 * time.Hour
	}
	if o.Password == (PasswordParams{}) {
		o.Password = DefaultPasswordParams
	}
	c := &Console{st: st, o: o, pages: map[string]*template.Template{},
		byAccountClient: newAttempts(accountFailures, failureWindow), byAccount: newAttempts(accountFailuresAll, failureWindow),
		byAddress: newAttempts(addressFailures, failureWindow), invites: newAttempts(addressInvites, failureWindow),
		hashing: make(hashSlots, max(2, runtime.GOMAXPROCS(0)))}
	var err error
	if c.dummyHash, err = HashPassword(randomToken(), o.Password); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c.secret, err = st.ConsoleSecret(ctx, randomSecret()); err != nil {
		return nil, err
	}
	for _, name := range []string{"signin", "invite", "overview", "keys", "activity", "playground", "error", "payments"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		c.pages[name] = t
	}
	if c.files, err = staticFiles(); err != nil {
		return nil, err
	}
	return c, nil
}

// staticFiles serves the embedded stylesheet, script and images under
// /console/static/.
func staticFiles() (http.Handler, error) {
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	return http.StripPrefix("/console/static/", http.FileServerFS(static)), nil
}

// Page serves h as a console page: with the headers every console answer
// carries, after the check that a form comes from the console's own origin,
// and with h's error as an HTML page with its code.
func (c *Console) Page(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.headers(w, r)
		err := c.sameOrigin(r)
		if err == nil {
			err = h(w, r)
		}
		if err != nil {
			c.fail(w, r, err)
		}
	})
}

// SignedIn is Page for a page of a signed-in account holder: without a
// live session the browser is sent to the sign-in page, and a POST without
// the session's CSRF token is refused. An account that payments disabled
// (what it owes, a dispute) is sent to the Payments page instead, and its
// forms are refused.
func (c *Console) SignedIn(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return c.Page(c.signedIn(h, false))
}

// SignedInHeld is SignedIn for the pages an account that payments disabled
// may use too: those it needs to pay what it owes (docs/payments.md, "An
// account that owes").
func (c *Console) SignedInHeld(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return c.Page(c.signedIn(h, true))
}

// Static serves the embedded files under /console/static/, which browsers
// may keep for an hour.
func (c *Console) Static(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Cache-Control", "public, max-age=3600")
	c.files.ServeHTTP(w, r)
	return nil
}

// NotFound answers a path under /console/ that no page is served on.
func (c *Console) NotFound(w http.ResponseWriter, r *http.Request) error {
	return tollgate.Errorf(tollgate.CodeNotFound, "there is no console page %s %s", r.Method, r.URL.Path)
}

// Favicon serves the console's icon at /favicon.ico, where a browser looks
// for it whatever page it shows.
func Favicon(w http.ResponseWriter, r *http.Request) error {
	b, err := staticFS.ReadFile("static/favicon.ico")
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "image/x-icon")
	w.Header().Set("Cache-Control", "public, max-age=86400")
	_, _ = w.Write(b)
	return nil
}

// maxFormBytes bounds a console form's body (the largest is a key's).
const maxFormBytes = 64 << 10

func (c *Console) headers(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// An invitation's token is in its link: no page sends it to another
	// origin as a referrer. (Not no-referrer: under it a browser sends
	// "Origin: null" with a form, which sameOrigin could not tell from a
	// sandboxed page's.)
	h.Set("Referrer-Policy", "same-origin")
}

// request is a signed-in request: the session and its account.
type request struct {
	token   string // the session cookie's value
	session tollgate.ConsoleSession
	account tollgate.Account
	// hold is what keeps the account disabled by payments; nil while it
	// is enabled.
	hold *tollgate.PaymentHold
}

type ctxKey struct{}

func current(r *http.Request) *request { v, _ := r.Context().Value(ctxKey{}).(*request); return v }

// signedIn runs h with the request's session, or sends the browser to the
// sign-in page. Every POST must carry the session's CSRF token. An account
// that payments disabled reaches h only if held allows it; otherwise a page
// sends it to the Payments page, and a form is refused.
func (c *Console) signedIn(h func(http.ResponseWriter, *http.Request) error, held bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		now := c.o.Now()
		ck, err := c.cookie(r, sessionCookie)
		if err != nil || ck.Value == "" {
			return c.toSignin(w, r)
		}
		sess, err := c.st.Session(r.Context(), tollgate.HashKey(ck.Value), now)
		if errors.Is(err, tollgate.ErrNotFound) {
			c.clearCookie(w, r, sessionCookie)
			return c.toSignin(w, r)
		}
		if err != nil {
			return err
		}
		acct, err := c.st.Account(r.Context(), sess.AccountID)
		if err != nil {
			return err
		}
		req := &request{token: ck.Value, session: sess, account: acct}
		if acct.Disabled {
			if req.hold, err = c.paymentHold(r.Context(), acct); err != nil {
				return err
			}
			if req.hold == nil {
				return tollgate.Errorf(tollgate.CodeAccountDisabled, "account %s is disabled; ask the operator", acct.ID)
			}
		}
		if r.Method == http.MethodPost {
			got := r.Header.Get("X-CSRF-Token") // the playground's script
			if got == "" {
				got = r.PostFormValue("csrf")
			}
			if !tokensEqual(got, sessionCSRF(ck.Value)) {
				return errCSRF
			}
		}
		w.Header().Set("Cache-Control", "no-store")
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, req))
		if req.hold != nil && !held {
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, paymentsPath, http.StatusSeeOther)
				return nil
			}
			c.fail(w, r, tollgate.Errorf(tollgate.CodeAccountDisabled, "%s", holdMessage(req.hold)))
			return nil
		}
		return h(w, r)
	}
}

func (c *Console) toSignin(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return tollgate.Errorf(tollgate.CodeUnauthorized, "your session has ended; sign in again")
	}
	http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
	return nil
}

// randomToken is 32 random bytes, base64url: sessions, form tokens.
func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// secure reports whether the browser reached us over TLS: directly, or
// through a trusted proxy that says so.
func (c *Console) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	return c.trusted(r) && strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (c *Console) trusted(r *http.Request) bool {
	if len(c.o.TrustedProxies) == 0 {
		return false
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	for _, p := range c.o.TrustedProxies {
		if p.Contains(ap.Addr().Unmap()) {
			return true
		}
	}
	return false
}

// clientAddr is the address sign-in attempts are counted against: the
// peer, or the last hop a trusted proxy appended to X-Forwarded-For.
func (c *Console) clientAddr(r *http.Request) string {
	if c.trusted(r) {
		if xff := r.Header.Get("X-Forwarded-For"); xff != "" {
			parts := strings.Split(xff, ",")
			return strings.TrimSpace(parts[len(parts)-1])
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
