package admin

import "testing"

// The Authorization scheme is case-insensitive (RFC 9110 §11.1), as on the
// API listener; the token is not.
func TestAuthorizationSchemeAnyCase(t *testing.T) {
	a := New(nil, Options{Token: "s3cret"})
	for h, want := range map[string]bool{
		"Bearer s3cret":     true,
		"bearer s3cret":     true,
		"BEARER s3cret":     true,
		"  beaRer  s3cret ": true,
		"Bearer S3CRET":     false,
		"Basic s3cret":      false,
		"Bearers3cret":      false,
		"s3cret":            false,
		"":                  false,
	} {
		if got := a.authorized(h); got != want {
			t.Errorf("authorized(%q) = %v, want %v", h, got, want)
		}
	}
	if New(nil, Options{}).authorized("Bearer ") {
		t.Error("an empty configured token must refuse everything")
	}
}
