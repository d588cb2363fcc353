// Package idempotency makes non-streamed chat completions replay-safe with
// the Idempotency-Key header (docs/idempotency.md, after Stripe's design):
// the first request with a key runs; a duplicate gets 409 while it runs and
// its stored answer afterwards; a failure frees the key for a fresh retry; the
// same key with another request is 422. The claim lives in the store, leased,
// so several instances sharing PostgreSQL agree on who runs, and a dead
// instance's key frees itself when its lease ends. docs/idempotency.md is the
// client's view.
package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/storefail"
)

// Store keeps the claims (sqlite.DB and postgres.DB implement it; the
// conformance suite in internal/storetest states the contract).
type Store interface {
	BeginIdempotency(ctx context.Context, c tollgate.IdempotencyClaim) (tollgate.IdempotencyResult, error)
	RenewIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string, expires time.Time) error
	CompleteIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string, r tollgate.StoredResponse, expires time.Time) error
	ReleaseIdempotency(ctx context.Context, k tollgate.IdempotencyKey, owner string) error
	PurgeIdempotency(ctx context.Context, before, lostExpires time.Time) (int64, error)
}

// Defaults of Options (config `idempotency:`).
const (
	DefaultTTL              = 24 * time.Hour
	DefaultLease            = 6 * time.Minute // > the 5-minute non-streamed limit, plus a margin
	DefaultMaxResponseBytes = 1 << 20
	DefaultPurgeInterval    = 10 * time.Minute
)

// Options tune a Keeper; zero values take the defaults.
type Options struct {
	// TTL is how long a successful response is remembered and replayed.
	TTL time.Duration
	// Lease is how long a claim outlives its instance. The running instance
	// renews it every Lease/3, so a request may run longer than the lease;
	// an instance that dies frees its keys at most Lease later.
	Lease time.Duration
	// MaxResponseBytes bounds a stored body. A larger successful response is
	// delivered but not stored, and its key is released (docs/idempotency.md).
	MaxResponseBytes int
	// Now is the clock (tests inject one).
	Now func() time.Time
	Log *slog.Logger
}

// Keeper runs requests under their Idempotency-Key. Safe for concurrent use.
type Keeper struct {
	store Store
	opts  Options
}

// New returns a Keeper over store.
func New(store Store, o Options) *Keeper {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Keeper{store: store, opts: o}
}

// ReplayedHeaders are the response header fields stored with a response and
// sent again on a replay. X-Request-Id is the original request's id, which
// is also in the completion id and the ledger row of the one charge.
var ReplayedHeaders = []string{
	"Content-Type",
	"X-Request-Id",
	"X-Tollgate-Backend",
	"X-Tollgate-Node",
	"X-Tollgate-Cost",
	"X-Tollgate-Usage-Estimated",
	"X-Tollgate-Emulated",
	"X-Tollgate-Not-Enforced",
}

// Request is one request that carries an Idempotency-Key.
type Request struct {
	Scope string // the account id
	Key   string // the header's value
	Body  []byte
	// ID is the request's id: the owner token of its claim (unique across
	// instances). Empty: a random token.
	ID string
}

// Outcome says what Serve did.
type Outcome uint8

const (
	// Ran: the request ran under the key (or without it: a stream).
	Ran Outcome = iota
	// Replayed: the stored response was sent; nothing ran.
	Replayed
	// Refused: 409 or 422 (the error is returned).
	Refused
)

// Serve runs run at most once per key, or answers without running it. A
// streamed request runs as if it had no key (Streamed). run writes a successful
// response to the writer it is given and returns an error (written by the
// caller) otherwise; Serve stores a 2xx response and releases the key after
// anything else, a panic included. The returned error is run's, or a
// *tollgate.Error for 400, 409 and 422, or a store failure.
func (k *Keeper) Serve(ctx context.Context, w http.ResponseWriter, req Request, run func(http.ResponseWriter) error) (Outcome, error) {
	model, stream := inspect(req.Body)
	if stream {
		// A stream cannot be replayed: the header is ignored (documented),
		// whatever its value.
		return Ran, run(w)
	}
	if err := ValidKey(req.Key); err != nil {
		return Refused, err
	}
	owner := req.ID
	if owner == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		owner = "idem_" + hex.EncodeToString(b[:])
	}
	key := tollgate.IdempotencyKey{Scope: req.Scope, Key: req.Key}
	now := k.opts.Now()
	// Store calls finish even when the client has gone away: a claim made
	// must be answered for.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	res, err := k.store.BeginIdempotency(bctx, tollgate.IdempotencyClaim{
		IdempotencyKey: key, Fingerprint: Fingerprint(model, req.Body), Owner: owner,
		Now: now, Expires: now.Add(k.opts.Lease), LostExpires: now.Add(k.opts.TTL),
	})
	cancel()
	if err != nil {
		return Refused, storefail.Wrap("idempotency_begin", err)
	}
	switch res.State {
	case tollgate.IdempotencyInFlight:
		wait := int(min(max(now.Sub(res.Started).Seconds(), 1), 30))
		return Refused, &tollgate.Error{Code: tollgate.CodeIdempotencyKeyInFlight, RetryAfter: wait,
			Message: "a request with this Idempotency-Key is still running; retry after it finishes to receive its response"}
	case tollgate.IdempotencyMismatch:
		return Refused, tollgate.Errorf(tollgate.CodeIdempotencyKeyReused,
			"this Idempotency-Key was used with a different request in the last %s; send a new key with a new request", k.opts.TTL)
	case tollgate.IdempotencyLost:
		k.opts.Log.Warn("idempotency: the key's request was charged and its answer lost", "request_id", req.ID,
			"original_request_id", res.Owner)
		return Refused, tollgate.Errorf(tollgate.CodeIdempotencyResponseLost,
			"the request first sent with this Idempotency-Key ran and was charged (original request id %s), "+
				"but its answer was lost when the instance serving it stopped; it will not run again under this key. "+
				"Its charge is in your usage under that request id; send a new key to run the request again", res.Owner)
	case tollgate.IdempotencyDone:
		k.replay(w, res.Response)
		k.opts.Log.Info("idempotent replay", "request_id", req.ID, "original_request_id", res.Owner)
		return Replayed, nil
	case tollgate.IdempotencyStarted:
	default:
		return Refused, errors.New("idempotency: store returned state " + res.State.String())
	}
	return Ran, k.runClaimed(w, key, owner, run)
}

// storeTimeout bounds each store call made after the request ran.
const storeTimeout = 10 * time.Second

func (k *Keeper) runClaimed(w http.ResponseWriter, key tollgate.IdempotencyKey, owner string, run func(http.ResponseWriter) error) (err error) {
	stop := k.renewEvery(key, owner)
	rec := &recorder{ResponseWriter: w, max: k.opts.MaxResponseBytes}
	done := false
	defer func() {
		stop()
		if done {
			return
		}
		// Failed, panicked, or too large to keep: free the key.
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		if rerr := storefail.Wrap("idempotency_release", k.store.ReleaseIdempotency(ctx, key, owner)); rerr != nil {
			k.opts.Log.Error("idempotency: release key", "request_id", owner, "err", rerr)
		}
	}()
	err = run(rec)
	if err != nil || rec.status/100 != 2 {
		return err
	}
	if rec.over {
		k.opts.Log.Warn("idempotency: response larger than idempotency.max_response_bytes: delivered, not stored, key released",
			"request_id", owner, "limit", k.opts.MaxResponseBytes)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	resp := tollgate.StoredResponse{Status: rec.status, Header: rec.header, Body: rec.body}
	if cerr := storefail.Wrap("idempotency_complete", k.store.CompleteIdempotency(ctx, key, owner, resp, k.opts.Now().Add(k.opts.TTL))); cerr != nil {
		// The client has its answer; the key stays claimed until the lease
		// ends (a retry gets 409 until then), then runs afresh.
		k.opts.Log.Error("idempotency: store response", "request_id", owner, "err", cerr)
	}
	done = true // completed, or lost to a takeover: never release another owner's claim
	return nil
}

// renewEvery renews the claim's lease every Lease/3 until the returned stop
// is called, so that a request may outlive one lease while its instance lives.
func (k *Keeper) renewEvery(key tollgate.IdempotencyKey, owner string) (stop func()) {
	every := k.opts.Lease / 3
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	renew := func() {
		ctx, cancel := context.WithTimeout(context.Background(), every)
		err := k.store.RenewIdempotency(ctx, key, owner, k.opts.Now().Add(k.opts.Lease))
		cancel()
		if errors.Is(err, tollgate.ErrNotFound) {
			k.opts.Log.Warn("idempotency: lease lost while running", "request_id", owner)
			return
		}
		if err != nil {
			k.opts.Log.Error("idempotency: renew lease", "request_id", owner, "err", storefail.Wrap("idempotency_renew", err))
		}
		mu.Lock()
		if !stopped {
			t.Reset(every)
		}
		mu.Unlock()
	}
	mu.Lock()
	t = time.AfterFunc(every, renew)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// replay writes a stored response: its status, stored header fields and
// body byte for byte, plus Idempotent-Replayed: true.
func (k *Keeper) replay(w http.ResponseWriter, r tollgate.StoredResponse) {
	h := w.Header()
	for line := range strings.SplitSeq(r.Header, "\n") {
		if name, value, ok := strings.Cut(line, ": "); ok {
			h.Set(name, value)
		}
	}
	h.Set("Idempotent-Replayed", "true")
	h.Set("Content-Length", strconv.Itoa(len(r.Body)))
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

// recorder passes a response through to the client and keeps its status,
// the replayed header fields and up to max bytes of its body.
type recorder struct {
	http.ResponseWriter
	max    int
	status int
	header string
	body   []byte
	over   bool
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
		h := r.ResponseWriter.Header()
		var b strings.Builder
		for _, name := range ReplayedHeaders {
			if v := h.Get(name); v != "" {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(name)
				b.WriteString(": ")
				b.WriteString(v)
			}
		}
		r.header = b.String()
		if n, err := strconv.Atoi(h.Get("Content-Length")); err == nil && n <= r.max {
			r.body = make([]byte, 0, n)
		}
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.over {
		if len(r.body)+len(p) > r.max {
			r.over, r.body = true, nil
		} else {
			r.body = append(r.body, p...)
		}
	}
	return r.ResponseWriter.Write(p)
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Purge deletes what has expired (forgotten responses, leases of dead
// instances) and returns how many keys. A dead instance's key whose request
// was charged is kept, as lost, for the TTL.
func (k *Keeper) Purge(ctx context.Context) (int64, error) {
	now := k.opts.Now()
	return k.store.PurgeIdempotency(ctx, now, now.Add(k.opts.TTL))
}

// RunPurge purges every interval until ctx ends (the sweeper of Main).
func (k *Keeper) RunPurge(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultPurgeInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, err := k.Purge(ctx)
			if err != nil && ctx.Err() == nil {
				k.opts.Log.Error("idempotency: purge", "err", err)
			} else if n > 0 {
				k.opts.Log.Debug("idempotency: purged expired keys", "keys", n)
			}
		}
	}
}

// Streamed reports whether body asks for a stream ("stream": true at its top
// level): such a request ignores Idempotency-Key, however many it carries
// and whatever their values.
func Streamed(body []byte) bool {
	_, stream := inspect(body)
	return stream
}
