package console

import (
	"bytes"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/server"
)

// view is what every page's template gets.
type view struct {
	Title string
	Nav   string // the active section
	// Operator: a page of the operator's console (the admin listener).
	Operator bool
	Account  *tollgate.Account
	CSRF     string
	Error    *tollgate.Error
	Notice   string
	Data     any
	// Payments: payments are on (the Payments link shows).
	Payments bool
	// Refresh is a meta refresh's content ("2", "0;url=..."), or "".
	Refresh string
	// Hold: the account is disabled by payments (what it owes, a
	// dispute); the page shows why, and links only to what it may use.
	Hold *tollgate.PaymentHold
}

// publicView is the view of a page shown before sign-in.
func (c *Console) publicView(w http.ResponseWriter, r *http.Request, title string) *view {
	return &view{Title: title, CSRF: c.formToken(w, r)}
}

// accountView is the view of a signed-in page.
func (c *Console) accountView(r *http.Request, title, nav string) *view {
	req := current(r)
	return &view{Title: title, Nav: nav, Account: &req.account, CSRF: sessionCSRF(req.token), Payments: c.o.Payments != nil, Hold: req.hold}
}

// render executes a page into a buffer first, so a template error becomes
// a 500 rather than half a page.
func (c *Console) render(w http.ResponseWriter, status int, page string, v *view) error {
	var buf bytes.Buffer
	if err := c.pages[page].Execute(&buf, v); err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	if h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-store")
	}
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
	return nil
}

// fail renders an error page with the error's status and stable code.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	var te *tollgate.Error
	if !errors.As(err, &te) {
		c.o.Log.Error("console", "path", r.URL.Path, "err", err)
		te = tollgate.Errorf(tollgate.CodeInternal, "something went wrong on our side; try again")
	}
	v := &view{Title: "Error", Error: te}
	if req := current(r); req != nil {
		v.Account = &req.account
		v.CSRF = sessionCSRF(req.token)
		v.Payments = c.o.Payments != nil
		v.Hold = req.hold
	}
	if oq := opCurrent(r); oq != nil {
		v.Operator, v.Nav, v.CSRF = true, "error", sessionCSRF(oq.token)
	}
	if rerr := c.render(w, statusOf(te.Code), "error", v); rerr != nil {
		http.Error(w, te.Message, statusOf(te.Code))
	}
}

var funcs = template.FuncMap{
	"money": money,
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04 UTC")
	},
	"minute": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04") }, // under a "(UTC)" heading
	"date": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.DateOnly)
	},
	"int":  func(n int64) string { return groupDigits(n) },
	"link": link,
}

// link joins a page's path and a query the handler built (its values
// escaped with url.QueryEscape). The template would otherwise escape the
// whole query as one value, "=" and "&" included, and the server would see
// no parameters.
func link(path, query string) template.URL {
	if query == "" {
		return template.URL(path)
	}
	return template.URL(path + "?" + query)
}

// fixed12 is an amount with all 12 decimals: what a request cost exactly.
func fixed12(a tollgate.Amount) string {
	n := int64(a)
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	frac := strconv.FormatInt(n%1_000_000_000_000, 10)
	for len(frac) < 12 {
		frac = "0" + frac
	}
	return sign + strconv.FormatInt(n/1_000_000_000_000, 10) + "." + frac
}

// The console's one rule for money (docs/console.md, "Amounts"): every
// amount is shown rounded to 6 decimals (a millionth of a dollar, half away
// from zero), and the exact amount, to the picodollar, is in its title and
// its <data value>.

// microDecimals is how many decimals a shown amount has.
const microDecimals = 6

// rounded is a to 6 decimals, half away from zero: "4.999850".
func rounded(a tollgate.Amount) string {
	n := int64(a)
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	const unit = 1_000_000        // picodollars in a microdollar
	q := n/unit + (n%unit*2)/unit // n%unit*2 < 2*unit: the half rounds up
	frac := strconv.FormatInt(q%1_000_000, 10)
	for len(frac) < microDecimals {
		frac = "0" + frac
	}
	if q == 0 {
		sign = ""
	}
	return sign + strconv.FormatInt(q/1_000_000, 10) + "." + frac
}

// money is an amount as the pages show it: rounded, with the exact amount
// in its title and value; "rounded" marks one that lost digits.
func money(a tollgate.Amount) template.HTML {
	exact, short := fixed12(a), rounded(a)
	class := "amt"
	if int64(a)%1_000_000 != 0 {
		class = "amt rounded"
	}
	// Both are digits, a dot and a sign: nothing to escape.
	return template.HTML(`<data class="` + class + `" value="` + exact + `" title="` + exact + ` USD exactly">` + short + `</data>`)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// groupDigits writes 1234567 as 1,234,567.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := false
	if n < 0 {
		neg, s = true, s[1:]
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// statusOf is the HTTP status of a code: the API's own mapping.
func statusOf(c tollgate.Code) int { return server.StatusOf(c) }

func asError(err error, te **tollgate.Error) bool { return errors.As(err, te) }

func urlEscape(s string) string { return url.QueryEscape(s) }
