package config

import "time"

// Idempotency configures Idempotency-Key on non-streamed chat completions
// (docs/idempotency.md).
type Idempotency struct {
	// TTL is how long a successful response is remembered and replayed. Default 24h.
	TTL Duration `yaml:"ttl"`
	// Lease is how long a key stays claimed after its instance stops renewing
	// it (renewed every lease/3 while the request runs). Default 6m.
	Lease Duration `yaml:"lease"`
	// MaxResponseBytes bounds a stored response body; a larger one is
	// delivered but not stored, and its key is released. Default 1 MiB.
	MaxResponseBytes int `yaml:"max_response_bytes"`
	// Purge is how often expired keys are deleted; "off" leaves it to
	// another instance. Default 10m.
	Purge Duration `yaml:"purge"`
}

// maxStoredResponse caps max_response_bytes: a stored response is one
// database row, read whole on every replay.
const maxStoredResponse = 64 << 20

func (i *Idempotency) setDefaults() {
	def := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	def(&i.TTL, 24*time.Hour)
	def(&i.Lease, 6*time.Minute)
	def(&i.Purge, 10*time.Minute)
	if i.MaxResponseBytes == 0 {
		i.MaxResponseBytes = 1 << 20
	}
}

func (i *Idempotency) validate(bad func(key, format string, args ...any)) {
	if i.TTL < Duration(time.Minute) {
		bad("idempotency.ttl", "must be at least 1m")
	}
	if i.Lease < Duration(time.Second) {
		bad("idempotency.lease", "must be at least 1s")
	}
	if i.Purge != Off && i.Purge < Duration(time.Second) {
		bad("idempotency.purge", `must be at least 1s, or "off"`)
	}
	if i.MaxResponseBytes < 1024 || i.MaxResponseBytes > maxStoredResponse {
		bad("idempotency.max_response_bytes", "must be between 1024 and %d bytes", maxStoredResponse)
	}
}
