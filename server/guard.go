package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/tollgate/tollgate"
)

// RequireBearer serves h only to requests with `Authorization: Bearer
// <token>` (scheme in any case); others get 401 unauthorized. An empty token
// refuses everyone. The comparison is of hashes, in constant time.
func (s *Server) RequireBearer(token string, h http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		g := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if token == "" || !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(g[:], want[:]) != 1 {
			WriteError(w, s.Log, tollgate.Errorf(tollgate.CodeUnauthorized, "this path needs the admin token: Authorization: Bearer <token>"))
			return
		}
		h.ServeHTTP(w, r)
	})
}
