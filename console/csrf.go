package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Cross-site request forgery (docs/decisions.md, "Console forms"). Three
// defences, each enough against the attack it is named for:
//
//   - Every state-changing request whose browser says it came from another
//     origin is refused before any handler runs (sameOrigin): the
//     Sec-Fetch-Site header, or the Origin header where a browser sends no
//     Sec-Fetch-Site. A page on another port of the same host, or on a
//     sibling subdomain, is same-site but not same-origin, and cookies do
//     not tell those apart.
//   - A signed-in form carries the session's token (sessionCSRF), which a
//     page that cannot read the HttpOnly session cookie cannot compute.
//   - A form shown before sign-in (sign-in, invitation) carries a token
//     bound to a pre-session the server issued: the tg_form cookie holds a
//     random nonce, an expiry and the server's HMAC of both, and the form's
//     token is another HMAC of that cookie, both under the console's
//     secret. A cookie the server did not sign, or past its expiry, is
//     refused, and no page hands out a token for one.
//
// Over TLS the cookies carry the __Host- prefix: the browser then keeps
// only a cookie this very host set over https with Path=/, so no sibling
// subdomain nor plain-http port can plant one.

// formTTL is how long a pre-session lasts; a page served with less than
// half of it left starts a new one.
const formTTL = 12 * time.Hour

var errCSRF = &tollgate.Error{Code: tollgate.CodeInvalidRequest, Param: "csrf",
	Message: "the form is out of date or was not sent from this console; reload the page and try again"}

var errCrossOrigin = &tollgate.Error{Code: tollgate.CodeInvalidRequest, Param: "csrf",
	Message: "this request came from another site, not from a page of this console; open the console and try again there"}

// sameOrigin refuses a request that changes something when the browser
// says it came from another origin. Sec-Fetch-Site is set by the browser
// alone; where it is missing (older browsers, programs), a present Origin
// must name this host. A request with neither is not from a browser's
// cross-origin form and goes on to the token checks.
func (c *Console) sameOrigin(r *http.Request) error {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		if site == "same-origin" || site == "none" {
			return nil
		}
		c.o.Log.Warn("console: a cross-origin request refused", "path", r.URL.Path, "sec_fetch_site", site,
			"origin", r.Header.Get("Origin"), "client", c.clientAddr(r))
		return errCrossOrigin
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	_, host, ok := strings.Cut(origin, "://")
	if ok && strings.EqualFold(host, c.host(r)) {
		return nil
	}
	c.o.Log.Warn("console: a cross-origin request refused", "path", r.URL.Path, "origin", origin, "client", c.clientAddr(r))
	return errCrossOrigin
}

// host is the host (and port) the browser addressed: the Host header, or
// X-Forwarded-Host from a trusted proxy.
func (c *Console) host(r *http.Request) string {
	if c.trusted(r) {
		if h := r.Header.Get("X-Forwarded-Host"); h != "" {
			return strings.TrimSpace(strings.Split(h, ",")[0])
		}
	}
	return r.Host
}

// sessionCSRF is the CSRF token of a session: an HMAC of the session's own
// secret, so it needs no storage and a page from another site, which cannot
// read the HttpOnly cookie, cannot compute it.
func sessionCSRF(sessionToken string) string {
	m := hmac.New(sha256.New, []byte(sessionToken))
	m.Write([]byte("tollgate console csrf"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func tokensEqual(got, want string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// randomSecret is a fresh key for the pre-sessions' HMAC.
func randomSecret() []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return b
}

// mac is HMAC-SHA256 under the console's secret of purpose and text.
func (c *Console) mac(purpose, text string) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("tollgate console " + purpose + "\x00"))
	m.Write([]byte(text))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// formMAC is the form token of a pre-session cookie's value.
func (c *Console) formMAC(cookie string) string { return c.mac("form", cookie) }

// newPreSession is a tg_form cookie's value: "nonce.expiry.signature",
// the expiry in unix seconds, the signature the server's over both.
func (c *Console) newPreSession(expires time.Time) string {
	v := randomToken() + "." + strconv.FormatInt(expires.Unix(), 10)
	return v + "." + c.mac("pre-session", v)
}

// preSession checks a tg_form cookie's value and reports when it expires;
// ok is false for a value the server did not sign.
func (c *Console) preSession(v string) (expires time.Time, ok bool) {
	i := strings.LastIndexByte(v, '.')
	if i < 0 || !tokensEqual(v[i+1:], c.mac("pre-session", v[:i])) {
		return time.Time{}, false
	}
	_, exp, _ := strings.Cut(v[:i], ".")
	sec, err := strconv.ParseInt(exp, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

// formToken returns the token for the forms shown before sign-in: bound
// to the browser's pre-session, which it starts (sets its cookie) when the
// browser has none or one with less than half its life left.
func (c *Console) formToken(w http.ResponseWriter, r *http.Request) string {
	now := c.o.Now()
	if ck, err := c.cookie(r, formCookie); err == nil {
		if exp, ok := c.preSession(ck.Value); ok && exp.Sub(now) > formTTL/2 {
			return c.formMAC(ck.Value)
		}
	}
	v := c.newPreSession(now.Add(formTTL))
	c.setCookie(w, r, formCookie, v, formTTL, http.SameSiteStrictMode)
	return c.formMAC(v)
}

// checkFormToken checks a form shown before sign-in: its pre-session
// cookie is live and the form's token is that cookie's HMAC.
func (c *Console) checkFormToken(r *http.Request) error {
	ck, err := c.cookie(r, formCookie)
	if err != nil {
		return errCSRF
	}
	exp, ok := c.preSession(ck.Value)
	if !ok || !c.o.Now().Before(exp) || !tokensEqual(r.PostFormValue("csrf"), c.formMAC(ck.Value)) {
		return errCSRF
	}
	return nil
}

// cookieName is name with the __Host- prefix over TLS.
func (c *Console) cookieName(r *http.Request, name string) string {
	if c.secure(r) {
		return "__Host-" + name
	}
	return name
}

// cookie reads one of the console's cookies under its name for this
// request (cookieName).
func (c *Console) cookie(r *http.Request, name string) (*http.Cookie, error) {
	return r.Cookie(c.cookieName(r, name))
}

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value string, ttl time.Duration, site http.SameSite) {
	http.SetCookie(w, c.newCookie(r, name, value, int(ttl/time.Second), site))
}

func (c *Console) setCookieNamed(w http.ResponseWriter, r *http.Request, name, value string, ttl time.Duration) {
	c.setCookie(w, r, name, value, ttl, http.SameSiteLaxMode)
}

func (c *Console) clearCookie(w http.ResponseWriter, r *http.Request, name string) {
	http.SetCookie(w, c.newCookie(r, name, "", -1, http.SameSiteLaxMode))
}

// newCookie is an HttpOnly cookie for the console's pages; over TLS it is
// Secure and a __Host- cookie, which must have Path=/.
func (c *Console) newCookie(r *http.Request, name, value string, maxAge int, site http.SameSite) *http.Cookie {
	ck := &http.Cookie{Name: c.cookieName(r, name), Value: value, Path: Prefix, MaxAge: maxAge, HttpOnly: true, SameSite: site}
	if c.secure(r) {
		ck.Secure, ck.Path = true, "/"
	}
	return ck
}
