package search

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// maxBody bounds a provider's answer: a SearXNG page of ~20 results or a
// Brave page of 20 is well under 1 MiB.
const maxBody = 4 << 20

// userAgent is sent to every provider.
const userAgent = "tollgate"

// statusError is a provider's non-2xx answer. hint explains a status that
// has a known cause (SearXNG's 403); snippet is the start of the body.
type statusError struct {
	status  int
	hint    string
	snippet string
}

func (e *statusError) Error() string {
	s := fmt.Sprintf("HTTP %d", e.status)
	if e.hint != "" {
		s += ": " + e.hint
	}
	if e.snippet != "" {
		s += fmt.Sprintf(" (body: %q)", e.snippet)
	}
	return s
}

// decodeError is an answer that could not be read as the provider's JSON.
type decodeError struct{ err error }

func (e *decodeError) Error() string { return "unreadable answer: " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

// getJSON sends req and decodes a 2xx JSON answer of at most maxBody bytes
// into v. Redirects are not followed (the client is built that way): a
// redirect could carry a subscription key to another host.
func getJSON(ctx context.Context, client *http.Client, req *http.Request, v any, hint func(status int) string) error {
	req = req.WithContext(ctx)
	req.Header.Set("User-Agent", userAgent)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		e := &statusError{status: resp.StatusCode, snippet: strings.ToValidUTF8(string(snippet), "")}
		if hint != nil {
			e.hint = hint(resp.StatusCode)
		}
		return e
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return err
	}
	if len(body) > maxBody {
		return &decodeError{fmt.Errorf("larger than %d bytes", maxBody)}
	}
	if err := json.Unmarshal(body, v); err != nil {
		return &decodeError{err}
	}
	return nil
}

// noRedirects makes a client that returns a redirect as the answer
// instead of following it (a non-2xx, so a provider failure).
func noRedirects(c *http.Client) *http.Client {
	if c == nil {
		c = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	cc := *c
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cc
}
