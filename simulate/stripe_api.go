package simulate

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
)

// idemEntry is what an idempotency key saved: the endpoint and parameters of
// its first request and, once done, the answer to replay.
type idemEntry struct {
	endpoint  string
	params    string
	done      bool
	status    int
	body      []byte
	requestID string // the first request's, sent back as Original-Request
}

// apiResult is what an API handler produced: a status and an object, or an
// error. The events are sent once the answer is written and the lock freed.
type apiResult struct {
	status int
	obj    any
	err    *stripeError
}

func ok(obj any) apiResult            { return apiResult{status: http.StatusOK, obj: obj} }
func fail(err *stripeError) apiResult { return apiResult{status: err.status, err: err} }

func (r apiResult) body() any {
	if r.err != nil {
		return errorBody(r.err)
	}
	return r.obj
}

// apiCall carries one API request through its handler.
type apiCall struct {
	r         *http.Request
	form      stripeForm
	requestID string
	idemKey   string
	base      string // where Checkout pages and receipts live
}

// ServeHTTP routes like api.stripe.com for /v1/, and serves the Checkout
// pages (/c/pay/{id}), receipts (/receipts/payment/{id}) and the operator's
// /_sim/ endpoints beside it.
func (s *Stripe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, "/v1/"):
		s.serveAPI(w, r)
	case strings.HasPrefix(r.URL.Path, "/c/pay/"):
		s.serveCheckoutPage(w, r, strings.TrimPrefix(r.URL.Path, "/c/pay/"))
	case strings.HasPrefix(r.URL.Path, "/receipts/payment/"):
		s.serveReceipt(w, r, strings.TrimPrefix(r.URL.Path, "/receipts/payment/"))
	case strings.HasPrefix(r.URL.Path, "/_sim/"):
		s.serveSim(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (s *Stripe) serveAPI(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	s.recorded.add(Recorded{Method: r.Method, Path: r.URL.RequestURI(), Header: r.Header.Clone(), Body: body})
	requestID := "req_" + randomToken(14)
	w.Header().Set("Request-Id", requestID)
	w.Header().Set("Stripe-Version", s.cfg.APIVersion)
	w.Header().Set("Access-Control-Allow-Origin", "*")

	key, authErr := s.authenticate(r)
	if authErr != nil {
		writeStripeJSON(w, authErr.status, errorBody(authErr))
		return
	}
	values := r.URL.Query()
	if ct := r.Header.Get("Content-Type"); r.Method == http.MethodPost && len(body) > 0 &&
		!strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
		e := invalidRequest("", "", "Invalid request (check that your POST content type is application/x-www-form-urlencoded). If you have any questions, we can help at https://support.stripe.com/.")
		writeStripeJSON(w, e.status, errorBody(e))
		return
	}
	if r.Method == http.MethodPost {
		bv, err := url.ParseQuery(string(body))
		if err != nil {
			e := invalidRequest("", "", "Invalid request body: the parameters must be form-encoded (application/x-www-form-urlencoded).")
			writeStripeJSON(w, e.status, errorBody(e))
			return
		}
		for k, vs := range bv {
			values[k] = append(values[k], vs...)
		}
	}
	call := &apiCall{r: r, form: stripeForm{values}, requestID: requestID, base: s.baseURL(r)}

	if r.Method != http.MethodPost {
		status, out := s.route(call)
		writeStripeJSON(w, status, out)
		return
	}
	call.idemKey = strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if len(call.idemKey) > 255 {
		e := invalidRequest("", "", "Idempotency-Key: keys can be up to 255 characters long (this one has %d).", len(call.idemKey))
		writeStripeJSON(w, e.status, errorBody(e))
		return
	}
	endpoint := r.Method + " " + r.URL.Path
	if call.idemKey != "" {
		replayed, e := s.claimIdempotency(key, call.idemKey, endpoint, call.form.canonical(), w)
		if e != nil {
			writeStripeJSON(w, e.status, errorBody(e))
		}
		if replayed || e != nil {
			return
		}
	}
	status, out := s.route(call)
	writeStripeJSON(w, status, out)
	if call.idemKey != "" {
		s.finishIdempotency(key, call.idemKey, requestID, status, out)
	}
}

// authenticate checks "Authorization: Bearer sk_test_..." (Basic auth with
// the key as user works too, as on Stripe) and returns the key.
func (s *Stripe) authenticate(r *http.Request) (string, *stripeError) {
	h := r.Header.Get("Authorization")
	var key string
	if strings.HasPrefix(h, "Bearer ") {
		key = strings.TrimSpace(strings.TrimPrefix(h, "Bearer "))
	} else if u, _, ok := r.BasicAuth(); ok {
		key = u
	}
	if key == "" {
		return "", &stripeError{status: http.StatusUnauthorized, Type: "invalid_request_error",
			Message: "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY'). See https://stripe.com/docs/api#authentication for details, or we can help at https://support.stripe.com/."}
	}
	valid := strings.HasPrefix(key, "sk_test_") || strings.HasPrefix(key, "rk_test_")
	if s.cfg.SecretKey != "" {
		valid = key == s.cfg.SecretKey
	}
	if !valid {
		return "", &stripeError{status: http.StatusUnauthorized, Type: "invalid_request_error",
			Message: "Invalid API Key provided: " + redactKey(key)}
	}
	return key, nil
}

// redactKey shows a key as Stripe's error does: its sk_test_ prefix, stars,
// its last four characters.
func redactKey(k string) string {
	prefix := ""
	if i := strings.IndexByte(k, '_'); i >= 0 {
		if j := strings.IndexByte(k[i+1:], '_'); j >= 0 {
			prefix = k[:i+j+2]
		}
	}
	rest := k[len(prefix):]
	if len(rest) <= 4 {
		return prefix + strings.Repeat("*", len(rest))
	}
	return prefix + strings.Repeat("*", len(rest)-4) + rest[len(rest)-4:]
}

// claimIdempotency handles a POST's Idempotency-Key: a finished request with
// the same endpoint and parameters is replayed (Idempotent-Replayed: true,
// written to w), other parameters or another endpoint get 400
// idempotency_error, one still running gets 409. Neither lets the request
// run.
func (s *Stripe) claimIdempotency(apiKey, idemKey, endpoint, params string, w http.ResponseWriter) (replayed bool, _ *stripeError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := apiKey + "\x00" + idemKey
	e, found := s.idem[k]
	if !found {
		s.idem[k] = &idemEntry{endpoint: endpoint, params: params}
		return false, nil
	}
	if e.endpoint != endpoint {
		return false, &stripeError{status: http.StatusBadRequest, Type: "idempotency_error",
			Message: "Keys for idempotent requests can only be used for the same endpoint they were first used for ('" +
				strings.TrimPrefix(endpoint, "POST ") + "' vs '" + strings.TrimPrefix(e.endpoint, "POST ") +
				"'). Try using a key other than '" + idemKey + "' if you meant to execute a different request."}
	}
	if e.params != params {
		return false, &stripeError{status: http.StatusBadRequest, Type: "idempotency_error",
			Message: "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '" +
				idemKey + "' if you meant to execute a different request."}
	}
	if !e.done {
		return false, &stripeError{status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotency_key_in_use",
			DocURL:  docURL("idempotency_key_in_use"),
			Message: "There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): " + idemKey + ". Please try again later."}
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.Header().Set("Original-Request", e.requestID)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	w.Write(e.body)
	return true, nil
}

// finishIdempotency saves the answer of a request that ran; a request
// refused before it ran (400 validation, 404) saves nothing, as on Stripe,
// so the key can be used again.
func (s *Stripe) finishIdempotency(apiKey, idemKey, requestID string, status int, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := apiKey + "\x00" + idemKey
	if status == http.StatusOK || status == http.StatusPaymentRequired || status >= 500 {
		if e := s.idem[k]; e != nil {
			e.done, e.status, e.body, e.requestID = true, status, bytes.Clone(body), requestID
		}
		return
	}
	delete(s.idem, k)
}

// route runs one API request's handler with s.mu held (the handlers read
// and change the objects freely) and encodes its answer before letting go,
// so that the answer is a snapshot.
func (s *Stripe) route(c *apiCall) (int, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := s.handle(c)
	return res.status, encodeStripeJSON(res.body())
}

// handle dispatches one API request. Called with s.mu held.
func (s *Stripe) handle(c *apiCall) apiResult {
	parts := strings.Split(strings.Trim(strings.TrimPrefix(c.r.URL.Path, "/v1/"), "/"), "/")
	get, post := c.r.Method == http.MethodGet, c.r.Method == http.MethodPost
	n := len(parts)
	switch {
	case n == 2 && parts[0] == "checkout" && parts[1] == "sessions" && post:
		return s.createSession(c)
	case n == 3 && parts[0] == "checkout" && parts[1] == "sessions" && get:
		return s.retrieve(c, "checkout.session", "session", parts[2])
	case n == 4 && parts[0] == "checkout" && parts[1] == "sessions" && parts[3] == "expire" && post:
		return s.expireSession(c, parts[2])
	case n == 4 && parts[0] == "checkout" && parts[1] == "sessions" && parts[3] == "line_items" && get:
		return s.sessionLineItems(parts[2])
	case n == 1 && parts[0] == "payment_intents" && post:
		return s.createIntent(c)
	case n == 2 && parts[0] == "payment_intents" && get:
		return s.retrieve(c, "payment_intent", "intent", parts[1])
	case n == 2 && parts[0] == "charges" && get:
		return s.retrieve(c, "charge", "charge", parts[1])
	case n == 1 && parts[0] == "refunds" && post:
		return s.createRefund(c)
	case n == 2 && parts[0] == "refunds" && get:
		return s.retrieve(c, "refund", "refund", parts[1])
	case n == 2 && parts[0] == "disputes" && get:
		return s.retrieve(c, "dispute", "dispute", parts[1])
	case n == 1 && parts[0] == "customers" && post:
		return s.createCustomer(c)
	case n == 2 && parts[0] == "customers" && get:
		return s.retrieve(c, "customer", "customer", parts[1])
	case n == 3 && parts[0] == "customers" && parts[2] == "payment_methods" && get:
		return s.listMethods(c, parts[1])
	case n == 1 && parts[0] == "payment_methods" && get:
		return s.listMethods(c, c.form.str("customer"))
	case n == 2 && parts[0] == "payment_methods" && get:
		return s.retrieve(c, "payment_method", "payment_method", parts[1])
	case n == 2 && parts[0] == "events" && get:
		return s.retrieveEvent(parts[1])
	case n == 1 && parts[0] == "events" && get:
		return s.listEvents(c)
	}
	return fail(&stripeError{status: http.StatusNotFound, Type: "invalid_request_error",
		Message: "Unrecognized request URL (" + c.r.Method + ": " + c.r.URL.Path + "). Please see https://stripe.com/docs or we can help at https://support.stripe.com/."})
}

// retrieve answers GET /v1/<objects>/{id}, expanding what expand[] asks.
func (s *Stripe) retrieve(c *apiCall, kind, param, id string) apiResult {
	if kind == "checkout.session" {
		if sess := s.sessions[id]; sess != nil {
			s.expireIfDue(sess)
		}
	}
	obj := s.objectByID(id)
	if obj == nil || objectKind(obj) != kind {
		return fail(noSuch(kind, param, id))
	}
	return s.expanded(obj, c.form.list("expand"))
}

// objectByID finds any object by its id. Called with s.mu held.
func (s *Stripe) objectByID(id string) any {
	var obj any
	switch {
	case strings.HasPrefix(id, "cs_"):
		if v := s.sessions[id]; v != nil {
			obj = v
		}
	case strings.HasPrefix(id, "pi_"):
		if v := s.intents[id]; v != nil {
			obj = v
		}
	case strings.HasPrefix(id, "ch_"), strings.HasPrefix(id, "py_"):
		if v := s.charges[id]; v != nil {
			obj = v
		}
	case strings.HasPrefix(id, "re_"):
		if v := s.refunds[id]; v != nil {
			obj = v
		}
	case strings.HasPrefix(id, "dp_"), strings.HasPrefix(id, "du_"):
		if v := s.disputes[id]; v != nil {
			obj = v
		}
	case strings.HasPrefix(id, "cus_"):
		if v := s.customers[id]; v != nil {
			obj = v
		}
	case strings.HasPrefix(id, "pm_"):
		if v := s.methods[id]; v != nil {
			obj = v
		}
	}
	return obj
}

func objectKind(obj any) string {
	switch obj.(type) {
	case *stripeSession:
		return "checkout.session"
	case *stripeIntent:
		return "payment_intent"
	case *stripeCharge:
		return "charge"
	case *stripeRefund:
		return "refund"
	case *stripeDispute:
		return "dispute"
	case *stripeCustomer:
		return "customer"
	case *stripeMethod:
		return "payment_method"
	}
	return ""
}

// expanded renders obj with the expand[] paths ("payment_intent",
// "payment_intent.latest_charge", "line_items") replaced by the objects
// they name. Called with s.mu held.
func (s *Stripe) expanded(obj any, paths []string) apiResult {
	if len(paths) == 0 {
		return ok(obj)
	}
	m, err := toMap(obj)
	if err != nil {
		panic(err)
	}
	for _, p := range paths {
		if e := s.expandPath(m, obj, p, p); e != nil {
			return fail(e)
		}
	}
	return ok(m)
}

func toMap(obj any) (map[string]any, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(raw, &m)
}

func (s *Stripe) expandPath(m map[string]any, obj any, path, full string) *stripeError {
	field, rest, _ := strings.Cut(path, ".")
	cannot := invalidRequest("", "expand", "This property cannot be expanded (%s).", full)
	if field == "line_items" {
		sess, isSession := obj.(*stripeSession)
		if !isSession || rest != "" {
			return cannot
		}
		m["line_items"] = stripeList{Object: "list", Data: sess.items, URL: "/v1/checkout/sessions/" + sess.ID + "/line_items"}
		return nil
	}
	id, isID := m[field].(string)
	if _, present := m[field]; !present {
		return cannot
	}
	if !isID {
		if m[field] == nil {
			return nil // a null stays null
		}
		sub, isMap := m[field].(map[string]any)
		if !isMap || rest == "" {
			return nil // already expanded
		}
		return s.expandPath(sub, s.objectByID(sub["id"].(string)), rest, full)
	}
	if !expandable(field) {
		return cannot
	}
	target := s.objectByID(id)
	if target == nil {
		return nil
	}
	sub, err := toMap(target)
	if err != nil {
		panic(err)
	}
	m[field] = sub
	if rest != "" {
		return s.expandPath(sub, target, rest, full)
	}
	return nil
}

func expandable(field string) bool {
	switch field {
	case "customer", "payment_intent", "latest_charge", "payment_method", "charge":
		return true
	}
	return false
}

// retrieveEvent answers an event as delivered, but for pending_webhooks,
// which counts the endpoints still to accept it now.
func (s *Stripe) retrieveEvent(id string) apiResult {
	ev := s.events[id]
	if ev == nil {
		return fail(noSuch("event", "id", id))
	}
	return ok(ev.current())
}

// listEvents answers GET /v1/events: newest first, `limit` (1 to 100,
// default 10), `starting_after` / `ending_before` (event ids), `type` (a
// type, or a prefix with "*": "charge.dispute.*"), `types[]`,
// `created[gt|gte|lt|lte]` (or `created=`), `delivery_success`.
func (s *Stripe) listEvents(c *apiCall) apiResult {
	f := c.form
	limit := int64(10)
	if n, present, e := f.int("limit"); e != nil {
		return fail(e)
	} else if present {
		if n < 1 || n > 100 {
			return fail(invalidRequest("", "limit", "Invalid limit: must be between 1 and 100"))
		}
		limit = n
	}
	types := f.list("types")
	if t := f.str("type"); t != "" {
		types = append(types, t)
	}
	var bounds [4]*int64 // gt, gte, lt, lte
	for i, op := range []string{"gt", "gte", "lt", "lte"} {
		n, present, e := f.int("created[" + op + "]")
		if e != nil {
			return fail(e)
		}
		if present {
			bounds[i] = &n
		}
	}
	if n, present, e := f.int("created"); e != nil {
		return fail(e)
	} else if present {
		bounds[1], bounds[3] = &n, &n
	}
	delivered, filterDelivery := false, f.has("delivery_success")
	if filterDelivery {
		var e *stripeError
		if delivered, e = f.bool("delivery_success"); e != nil {
			return fail(e)
		}
	}
	after, before := f.str("starting_after"), f.str("ending_before")
	for _, id := range []string{after, before} {
		if id != "" && s.events[id] == nil {
			return fail(noSuch("event", "starting_after", id))
		}
	}
	matches := func(ev *stripeEvent) bool {
		if len(types) > 0 {
			found := false
			for _, t := range types {
				if t == ev.Type || strings.HasSuffix(t, "*") && strings.HasPrefix(ev.Type, strings.TrimSuffix(t, "*")) {
					found = true
				}
			}
			if !found {
				return false
			}
		}
		c := ev.Created
		if bounds[0] != nil && c <= *bounds[0] || bounds[1] != nil && c < *bounds[1] ||
			bounds[2] != nil && c >= *bounds[2] || bounds[3] != nil && c > *bounds[3] {
			return false
		}
		return !filterDelivery || (ev.PendingWebhooks == 0) == delivered
	}
	// Newest first; starting_after takes the older ones after an id,
	// ending_before the newer ones before it (still newest first).
	var newestFirst []*stripeEvent
	for i := len(s.eventOrder) - 1; i >= 0; i-- {
		newestFirst = append(newestFirst, s.events[s.eventOrder[i]])
	}
	var window []*stripeEvent
	switch {
	case after != "":
		for i, ev := range newestFirst {
			if ev.ID == after {
				window = newestFirst[i+1:]
			}
		}
	case before != "":
		for i, ev := range newestFirst {
			if ev.ID == before {
				window = newestFirst[:i]
			}
		}
	default:
		window = newestFirst
	}
	var picked []*stripeEvent
	for _, ev := range window {
		if matches(ev) {
			picked = append(picked, ev)
		}
	}
	hasMore := int64(len(picked)) > limit
	if hasMore {
		if before != "" {
			picked = picked[len(picked)-int(limit):]
		} else {
			picked = picked[:limit]
		}
	}
	data := make([]json.RawMessage, len(picked))
	for i, ev := range picked {
		data[i] = ev.current()
	}
	return ok(stripeList{Object: "list", Data: data, HasMore: hasMore, URL: "/v1/events"})
}

// sessionLineItems answers GET /v1/checkout/sessions/{id}/line_items.
func (s *Stripe) sessionLineItems(id string) apiResult {
	sess := s.sessions[id]
	if sess == nil {
		return fail(noSuch("checkout.session", "session", id))
	}
	return ok(stripeList{Object: "list", Data: sess.items, URL: "/v1/checkout/sessions/" + id + "/line_items"})
}

// listMethods answers a customer's saved payment methods, newest first.
func (s *Stripe) listMethods(c *apiCall, customer string) apiResult {
	if customer == "" {
		return fail(missingParam("customer"))
	}
	if s.customers[customer] == nil {
		return fail(noSuch("customer", "customer", customer))
	}
	typ := c.form.str("type")
	data := []*stripeMethod{}
	for _, pm := range s.methods {
		if pm.Customer != nil && *pm.Customer == customer && (typ == "" || pm.Type == typ) {
			data = append(data, pm)
		}
	}
	sort.Slice(data, func(i, j int) bool { return data[i].seq > data[j].seq })
	return ok(stripeList{Object: "list", Data: data, URL: "/v1/customers/" + customer + "/payment_methods"})
}
