package console

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/tollgate/tollgate"
)

// The playground: the page sends a chat request through the public API
// (/v1/chat/completions, streamed) with a key made for the session, with an
// image attached (a data: URL read in the page) when the model takes images,
// and a demo tool (get_time, which the page answers itself and sends back)
// when the model takes tools. No
// stored key's secret can be shown again, so the page asks for a fresh one
// (POST /console/playground/key); it lives until the session ends, is
// replaced (and the previous one revoked) when the page asks again, and is
// revoked at sign-out (docs/decisions.md).

// playgroundKeyName marks the session keys in the key list.
const playgroundKeyName = "console playground"

type playgroundData struct {
	Models []playgroundModel
}

type playgroundModel struct {
	ID   string
	Caps string
	// Tools and Images: the page offers its demo tool, and an image to
	// attach, only to a model that takes them.
	Tools, Images bool
}

// Playground is the page that chats with a model.
func (c *Console) Playground(w http.ResponseWriter, r *http.Request) error {
	var d playgroundData
	if c.o.Catalog != nil {
		for _, m := range c.o.Catalog().Models {
			caps := ""
			for i, cp := range m.Caps.List() {
				if i > 0 {
					caps += ", "
				}
				caps += string(cp)
			}
			d.Models = append(d.Models, playgroundModel{ID: m.ID, Caps: caps,
				Tools: m.Caps.Has(tollgate.CapTools), Images: m.Caps.Has(tollgate.CapImageInput)})
		}
	}
	v := c.accountView(r, "Playground", "playground")
	v.Data = d
	return c.render(w, http.StatusOK, "playground", v)
}

// PlaygroundKey creates the session's playground key and answers its secret
// as JSON to the page's script (the CSRF token comes in X-CSRF-Token).
func (c *Console) PlaygroundKey(w http.ResponseWriter, r *http.Request) error {
	req := current(r)
	now := c.o.Now().UTC().Truncate(time.Microsecond)
	secret := tollgate.NewKeySecret()
	k := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: req.account.ID, Name: playgroundKeyName, Prefix: tollgate.DisplayPrefix(secret),
		Created: now, Expires: req.session.Expires, AllowedModels: []string{}}
	if err := c.st.CreateKey(r.Context(), k, tollgate.HashKey(secret)); err != nil {
		return err
	}
	h := tollgate.HashKey(req.token)
	old, err := c.st.SetSessionKey(r.Context(), h, k.ID)
	if err != nil {
		// The session ended meanwhile (signed out, a new password): the
		// key it would have held must not stay live.
		if rerr := c.st.RevokeKey(r.Context(), k.ID, now); rerr != nil {
			c.o.Log.Warn("console: revoke a playground key whose session ended", "key", k.ID, "err", rerr)
		}
		return err
	}
	if old != "" {
		if err := c.st.RevokeKey(r.Context(), old, now); err != nil {
			c.o.Log.Warn("console: revoke the previous playground key", "key", old, "err", err)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	return json.NewEncoder(w).Encode(struct {
		KeyID   string    `json:"key_id"`
		Secret  string    `json:"secret"`
		Expires time.Time `json:"expires"`
	}{k.ID, secret, k.Expires})
}
