package console

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/tollgate/tollgate"
)

// Sign-in, sign-out and invitations (docs/decisions.md, "Console sign-in").

type signinData struct {
	Account string
	Notice  string
}

// SigninForm is the sign-in page.
func (c *Console) SigninForm(w http.ResponseWriter, r *http.Request) error {
	v := c.publicView(w, r, "Sign in")
	v.Data = signinData{Account: r.URL.Query().Get("account")}
	if r.URL.Query().Get("welcome") != "" {
		v.Data = signinData{Account: r.URL.Query().Get("account"), Notice: "Your password is set. Sign in with it."}
	}
	return c.render(w, http.StatusOK, "signin", v)
}

// Signin checks an account's password and opens a session.
func (c *Console) Signin(w http.ResponseWriter, r *http.Request) error {
	if err := c.checkFormToken(r); err != nil {
		return err
	}
	now := c.o.Now()
	acctID := strings.TrimSpace(r.PostFormValue("account"))
	password := r.PostFormValue("password")
	again := func(status int, err *tollgate.Error) error {
		v := c.publicView(w, r, "Sign in")
		v.Data, v.Error = signinData{Account: acctID}, err
		return c.render(w, status, "signin", v)
	}
	addr := c.clientAddr(r)
	if !plausibleID(acctID) {
		acctID = "" // not an account id: counted against the client only
	}
	client := addressKey(addr)
	lims := []limited{{c.byAddress, client}}
	if acctID != "" {
		lims = append(lims, limited{c.byAccountClient, acctID + " " + client}, limited{c.byAccount, acctID})
	}
	// The attempt counts before the password is checked (requests sent at
	// once cannot all pass the limit) and is taken back if it succeeds.
	if ok, until := tryAll(now, lims...); !ok {
		w.Header().Set("Retry-After", retryAfter(until, now))
		return again(http.StatusTooManyRequests, tollgate.Errorf(tollgate.CodeRateLimitExceeded,
			"too many failed sign-ins; try again after %s UTC", until.UTC().Format("15:04")))
	}
	forgive := func() {
		for _, l := range lims {
			l.a.forgive(l.key)
		}
	}
	ok, checked := false, ""
	if acctID != "" && len(password) <= MaxPasswordLen {
		encoded, err := c.st.PasswordHash(r.Context(), acctID)
		switch {
		case errors.Is(err, tollgate.ErrNotFound):
			encoded = c.dummyHash // the same time as a wrong password
		case err != nil:
			forgive() // not a guess that was checked
			return err
		}
		if ok, err = c.verify(r.Context(), password, encoded); err != nil {
			forgive()
			return err
		}
		ok = ok && encoded != c.dummyHash
		checked = encoded
	}
	if !ok {
		c.o.Log.Info("console sign-in failed", "account", acctID, "client", addr)
		return again(http.StatusUnauthorized, tollgate.Errorf(tollgate.CodeUnauthorized, "the account id or the password is wrong"))
	}
	forgive()
	acct, err := c.st.Account(r.Context(), acctID)
	if err != nil {
		return err
	}
	// An account that payments disabled signs in to pay what it owes; one
	// the operator disabled does not.
	hold, err := c.paymentHold(r.Context(), acct)
	if err != nil {
		return err
	}
	if acct.Disabled && hold == nil {
		return again(http.StatusForbidden, tollgate.Errorf(tollgate.CodeAccountDisabled, "account %s is disabled; ask the operator", acctID))
	}
	c.byAccountClient.reset(acctID + " " + client)
	token := randomToken()
	now = now.UTC().Truncate(time.Microsecond)
	if err := c.st.CreateSession(r.Context(), tollgate.HashKey(token),
		tollgate.ConsoleSession{AccountID: acctID, Created: now, Expires: now.Add(c.o.SessionTTL)}); err != nil {
		return err
	}
	// A new password set while this one was checked ended the account's
	// sessions before this one existed: the old password must not outlive
	// the reset through it.
	if current, err := c.st.PasswordHash(r.Context(), acctID); err != nil || current != checked {
		if _, derr := c.st.DeleteSession(r.Context(), tollgate.HashKey(token)); derr != nil && !errors.Is(derr, tollgate.ErrNotFound) {
			return derr
		}
		if err != nil {
			return err
		}
		return again(http.StatusUnauthorized, tollgate.Errorf(tollgate.CodeUnauthorized, "the password was changed just now; sign in with the new one"))
	}
	c.o.Log.Info("console sign-in", "account", acctID, "client", addr, "payment_hold", hold != nil)
	c.setCookie(w, r, sessionCookie, token, c.o.SessionTTL, http.SameSiteLaxMode)
	if hold != nil {
		http.Redirect(w, r, paymentsPath, http.StatusSeeOther)
		return nil
	}
	// Sum the overview's past days now, so that the page the browser is
	// sent to reads them from the cache (docs/decisions.md).
	today, _, _, since := overviewDays(now)
	if _, err := c.closed.get(r.Context(), c.st, c.o.Log, acctID, since, today); err != nil {
		c.o.Log.Warn("console: sum the past days at sign-in", "account", acctID, "err", err)
	}
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
	return nil
}

func retryAfter(until, now time.Time) string {
	s := int(until.Sub(now)/time.Second) + 1
	return itoa(int64(s))
}

// Signout ends the session (and revokes its playground key). It answers a
// POST with the session's CSRF token; without a live session it just goes
// to the sign-in page.
func (c *Console) Signout(w http.ResponseWriter, r *http.Request) error {
	ck, err := c.cookie(r, sessionCookie)
	if err == nil && ck.Value != "" {
		if !tokensEqual(r.PostFormValue("csrf"), sessionCSRF(ck.Value)) {
			return errCSRF
		}
		sess, err := c.st.DeleteSession(r.Context(), tollgate.HashKey(ck.Value))
		switch {
		case err == nil && sess.PlaygroundKey != "":
			if err := c.st.RevokeKey(r.Context(), sess.PlaygroundKey, c.o.Now().UTC().Truncate(time.Microsecond)); err != nil {
				return err
			}
		case err != nil && !errors.Is(err, tollgate.ErrNotFound):
			return err
		}
	}
	c.clearCookie(w, r, sessionCookie)
	http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
	return nil
}

type inviteData struct {
	Token string
	// Gone says why the link no longer sets a password ("used",
	// "expired", "unknown"); the page then shows no form.
	Gone string
	When time.Time // when it was used, or expired
}

// InviteForm shows the form of a live invitation, or says why the link no
// longer works. Looking an invitation up does not use it, and a made-up
// token learns nothing but that it is unknown.
func (c *Console) InviteForm(w http.ResponseWriter, r *http.Request) error {
	token := r.URL.Query().Get("token")
	v := c.publicView(w, r, "Set your password")
	d := inviteData{Token: token}
	inv, err := c.st.Invite(r.Context(), tollgate.HashKey(token))
	switch {
	case errors.Is(err, tollgate.ErrNotFound):
		d.Gone = "unknown"
	case err != nil:
		return err
	case !inv.Used.IsZero():
		d.Gone, d.When = "used", inv.Used
	case !c.o.Now().Before(inv.Expires):
		d.Gone, d.When = "expired", inv.Expires
	}
	v.Data = d
	status := http.StatusOK
	switch d.Gone {
	case "unknown":
		status, v.Title = http.StatusNotFound, "Unknown invitation"
	case "used", "expired":
		status, v.Title = http.StatusGone, "Invitation "+d.Gone
	}
	return c.render(w, status, "invite", v)
}

// AcceptInvite sets the password an invitation asks for.
func (c *Console) AcceptInvite(w http.ResponseWriter, r *http.Request) error {
	if err := c.checkFormToken(r); err != nil {
		return err
	}
	token := r.PostFormValue("token")
	password, confirm := r.PostFormValue("password"), r.PostFormValue("confirm")
	again := func(status int, err *tollgate.Error) error {
		v := c.publicView(w, r, "Set your password")
		v.Data, v.Error = inviteData{Token: token}, err
		return c.render(w, status, "invite", v)
	}
	switch {
	case len(password) < MinPasswordLen || len(password) > MaxPasswordLen:
		return again(http.StatusBadRequest, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "password",
			"the password must be %d to %d characters long", MinPasswordLen, MaxPasswordLen))
	case password != confirm:
		return again(http.StatusBadRequest, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "confirm", "the two passwords differ"))
	}
	// Every try counts (a holder sets a password once), before the hash,
	// which is what a flood of made-up invitations would make the server
	// compute.
	now := c.o.Now()
	if ok, until := c.invites.try(addressKey(c.clientAddr(r)), now); !ok {
		w.Header().Set("Retry-After", retryAfter(until, now))
		return again(http.StatusTooManyRequests, tollgate.Errorf(tollgate.CodeRateLimitExceeded,
			"too many invitations tried from here; try again after %s UTC", until.UTC().Format("15:04")))
	}
	encoded, err := c.hash(r.Context(), password)
	if err != nil {
		return err
	}
	acct, err := c.st.AcceptInvite(r.Context(), tollgate.HashKey(token), encoded, now.UTC().Truncate(time.Microsecond))
	if errors.Is(err, tollgate.ErrNotFound) {
		return again(http.StatusNotFound, tollgate.Errorf(tollgate.CodeNotFound,
			"this invitation was used already, has expired or does not exist; ask the operator for a new one"))
	}
	if err != nil {
		return err
	}
	c.o.Log.Info("console password set", "account", acct)
	http.Redirect(w, r, "/console/signin?welcome=1&account="+acct, http.StatusSeeOther)
	return nil
}

// verify checks password against encoded in one of the hashing slots.
func (c *Console) verify(ctx context.Context, password, encoded string) (bool, error) {
	if err := c.hashing.acquire(ctx); err != nil {
		return false, err
	}
	defer c.hashing.release()
	return VerifyPassword(password, encoded)
}

// hash hashes a new password in one of the hashing slots.
func (c *Console) hash(ctx context.Context, password string) (string, error) {
	if err := c.hashing.acquire(ctx); err != nil {
		return "", err
	}
	defer c.hashing.release()
	return HashPassword(password, c.o.Password)
}
