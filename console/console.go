// Package console is the web console on the api listener, under /console/:
// an account holder signs in, sees the balance and what it was spent on,
// creates and revokes keys, and reads the prices (docs/console.md). Pages
// are rendered on the server with html/template, the stylesheet and the one
// script are embedded, and every page works without JavaScript except the
// copy buttons.
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

// Prefix is where the console is mounted on the api listener.
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
	mux   *http.ServeMux

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
	c := &Console{st: st, o: o, pages: map[string]*template.Template{}, mux: http.NewServeMux(),
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
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	fileServer := http.StripPrefix("/console/static/", http.FileServerFS(static))
	c.mux.Handle("GET /console/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		fileServer.ServeHTTP(w, r)
	}))
	c.mux.HandleFunc("GET /favicon.ico", favicon)
	c.mux.HandleFunc("GET /console/signin", c.page(c.signinForm))
	c.mux.HandleFunc("POST /console/signin", c.page(c.signin))
	c.mux.HandleFunc("POST /console/signout", c.page(c.signout))
	c.mux.HandleFunc("GET /console/invite", c.page(c.inviteForm))
	c.mux.HandleFunc("POST /console/invite", c.page(c.acceptInvite))
	c.mux.HandleFunc("GET /console/{$}", c.page(c.signedIn(c.overview)))
	c.mux.HandleFunc("GET /console/keys", c.page(c.signedIn(c.keys)))
	c.mux.HandleFunc("POST /console/keys", c.page(c.signedIn(c.createKey)))
	c.mux.HandleFunc("POST /console/keys/{id}/revoke", c.page(c.signedIn(c.revokeKey)))
	c.mux.HandleFunc("GET /console/activity", c.page(c.signedIn(c.activity)))
	c.mux.HandleFunc("GET /console/activity.csv", c.page(c.signedIn(c.activityCSV)))
	c.mux.HandleFunc("GET /console/playground", c.page(c.signedIn(c.playground)))
	c.mux.HandleFunc("POST /console/playground/key", c.page(c.signedIn(c.playgroundKey)))
	c.paymentRoutes()
	c.mux.HandleFunc("/console/", c.page(func(w http.ResponseWriter, r *http.Request) error {
		return tollgate.Errorf(tollgate.CodeNotFound, "there is no console page %s %s", r.Method, r.URL.Path)
	}))
	return c, nil
}

// Routes is the map the api listener mounts: the console, and the icon
// browsers ask every site for.
func (c *Console) Routes() map[string]http.Handler {
	return map[string]http.Handler{Prefix: c, "/favicon.ico": c}
}

// favicon serves the console's icon at /favicon.ico, where a browser looks
// for it whatever page it shows.
func favicon(w http.ResponseWriter, r *http.Request) {
	b, err := staticFS.ReadFile("static/favicon.ico")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "image/x-icon")
	w.Header().Set("Cache-Control", "public, max-age=86400")
	_, _ = w.Write(b)
}

// ServeHTTP sets the headers every console answer carries, then routes.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.headers(w, r)
	if err := c.sameOrigin(r); err != nil {
		c.fail(w, r, err)
		return
	}
	c.mux.ServeHTTP(w, r)
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
}

type ctxKey struct{}

func current(r *http.Request) *request { v, _ := r.Context().Value(ctxKey{}).(*request); return v }

// page turns a handler's error into an HTML error page with its code.
func (c *Console) page(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			c.fail(w, r, err)
		}
	}
}

// signedIn runs h with the request's session, or sends the browser to the
// sign-in page. Every POST must carry the session's CSRF token.
func (c *Console) signedIn(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
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
		if acct.Disabled {
			return tollgate.Errorf(tollgate.CodeAccountDisabled, "account %s is disabled; ask the operator", acct.ID)
		}
		req := &request{token: ck.Value, session: sess, account: acct}
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
		return h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, req)))
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
