package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The listeners are net/http's server. These tests pin what tollgate itself
// promises on top of it (the parsing of HTTP is net/http's).

// Requests the server cannot read get the error envelope and an
// X-Request-Id, and the connection is closed.
func TestMalformedRequestsGetTheEnvelope(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, c := range []struct {
		name, raw  string
		wantStatus int
		wantCode   string
	}{
		{"no Host in HTTP/1.1", "GET /v1/models HTTP/1.1\r\n\r\n", 400, "invalid_request"},
		{"header line without a colon", "GET /v1/models HTTP/1.1\r\nHost: x\r\nbroken\r\n\r\n", 400, "invalid_request"},
		{"unsupported Transfer-Encoding", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "invalid_request"},
		{"HTTP/3.0", "GET /v1/models HTTP/3.0\r\nHost: x\r\n\r\n", 505, "invalid_request"},
	} {
		conn, err := net.Dial("tcp", h.main.Addr("api"))
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, c.raw); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			conn.Close()
			t.Fatalf("%s: %v", c.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		expectError(t, resp.StatusCode, b, c.wantStatus, c.wantCode, "")
		if !strings.HasPrefix(resp.Header.Get("X-Request-Id"), "req_") {
			t.Errorf("%s: X-Request-Id %q", c.name, resp.Header.Get("X-Request-Id"))
		}
		// Nothing more is read from the connection: it is closed.
		if _, err := io.WriteString(conn, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); err == nil {
			if n, _ := br.Read(make([]byte, 1)); n != 0 {
				t.Errorf("%s: the connection served another request", c.name)
			}
		}
		conn.Close()
	}
}

// A request body trickled in (a byte every 100 ms) is cut off after
// timeouts.request_body with 408 request_timeout; the backend never sees it.
func TestRequestBodyTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{timeouts: "timeouts:\n  request_body: 500ms\n"})
	body := `{"model":"flav-vllm",` + hiMessages + `}`
	conn, err := net.Dial("tcp", h.main.Addr("api"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", h.key, len(body))
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := 0; i < len(body); i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a trickled body: %v", err)
	}
	took := time.Since(start)
	b, _ := io.ReadAll(resp.Body)
	expectError(t, resp.StatusCode, b, 408, "request_timeout", "")
	if took < 400*time.Millisecond || took > 3*time.Second {
		t.Errorf("answered after %s, want about the 500ms limit", took)
	}
	if n := len(h.sim("vllm").Requests()); n != 0 {
		t.Errorf("the backend saw %d requests", n)
	}
	// A body sent at once is not affected, and neither is a stream that
	// runs longer than the limit after its body arrived.
	status, _, sb := h.post("/v1/chat/completions", `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim tokens=8 gap=100ms]"}]}`, nil)
	if status != 200 || !bytes.HasSuffix(sb, []byte("data: [DONE]\n\n")) {
		t.Errorf("a stream longer than request_body: %d %s", status, sb)
	}
}

// Expect: 100-continue: a request refused before its body is wanted (a bad
// key) is answered without waiting for the body.
func TestExpectContinueRefusedWithoutTheBody(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	conn, err := net.Dial("tcp", h.main.Addr("api"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-tg-00000000000000000000000000000000\r\nContent-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer before the body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	expectError(t, resp.StatusCode, b, 401, "invalid_api_key", "")
}

// countingDialer counts the connections a client opens.
type countingDialer struct{ n atomic.Int32 }

func (d *countingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.n.Add(1)
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// concurrentStreams runs n streams at once through client and checks that
// each is whole and came over HTTP/2.
func concurrentStreams(t *testing.T, h *harness, client *http.Client, url string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim tokens=20 gap=10ms]"}]}`
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+h.key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			switch {
			case err != nil:
				errs <- err
			case resp.ProtoMajor != 2:
				errs <- fmt.Errorf("answered over %s", resp.Proto)
			case resp.StatusCode != 200 || !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")):
				errs <- fmt.Errorf("status %d: %s", resp.StatusCode, b)
			case !strings.HasPrefix(resp.Header.Get("X-Request-Id"), "req_"):
				errs <- fmt.Errorf("no X-Request-Id")
			case resp.Trailer.Get("X-Tollgate-Cost") == "":
				errs <- fmt.Errorf("no X-Tollgate-Cost trailer: %v", resp.Trailer)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// h2c: HTTP/2 with prior knowledge on the API listener, many streams over
// one connection.
func TestH2CManyStreamsOneConnection(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	d := &countingDialer{}
	tr := &http.Transport{DialContext: d.dial, Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	// One stream first: concurrent first requests would each dial.
	concurrentStreams(t, h, client, "http://"+h.main.Addr("api"), 1)
	concurrentStreams(t, h, client, "http://"+h.main.Addr("api"), 32)
	if n := d.n.Load(); n != 1 {
		t.Errorf("32 concurrent streams opened %d connections, want 1", n)
	}
	// An HTTP/1.1 client on the same listener still works.
	if status, _, b := h.post("/v1/chat/completions", `{"model":"flav-vllm",`+hiMessages+`}`, nil); status != 200 {
		t.Errorf("HTTP/1.1 beside h2c: %d %s", status, b)
	}
}

// writeCert writes a self-signed certificate for 127.0.0.1 and its key.
func writeCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tollgate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// listen.tls: the API listener serves TLS, with HTTP/2 by ALPN (many
// streams over one connection) and HTTP/1.1 for clients that ask for it;
// the admin listener, not named in listen.tls.listeners, stays plain.
func TestTLSListenerWithHTTP2(t *testing.T) {
	certFile, keyFile, pool := writeCert(t, t.TempDir())
	h := newHarness(t, harnessOptions{listen: fmt.Sprintf("  admin: 127.0.0.1:0\n  tls: {cert_file: %q, key_file: %q, listeners: [api]}\n", certFile, keyFile)})
	url := "https://" + h.main.Addr("api")

	d := &countingDialer{}
	tr := &http.Transport{DialContext: d.dial, TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	concurrentStreams(t, h, client, url, 1)
	concurrentStreams(t, h, client, url, 32)
	if n := d.n.Load(); n != 1 {
		t.Errorf("32 concurrent streams opened %d connections, want 1", n)
	}

	h1 := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer h1.CloseIdleConnections()
	resp, err := (&http.Client{Transport: h1, Timeout: 10 * time.Second}).Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 1 || resp.TLS == nil {
		t.Errorf("HTTP/1.1 over TLS: %d %s", resp.StatusCode, resp.Proto)
	}
	if resp, err := http.Get("http://" + h.main.Addr("api") + "/v1/models"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("plain HTTP on the TLS listener: %d", resp.StatusCode)
		}
	}
	resp, err = http.Get("http://" + h.main.Addr("admin") + "/healthz")
	if err != nil {
		t.Fatalf("plain admin listener: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("admin /healthz: %d", resp.StatusCode)
	}
}

// A client that goes away mid-stream over HTTP/2 cancels the backend call
// at once, as over HTTP/1.1 (TestDisconnectCancelsBackend).
func TestH2CDisconnectCancelsBackend(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	sim := h.sim("vllm")
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+h.main.Addr("api")+"/v1/chat/completions",
		strings.NewReader(`{"model":"flav-vllm","stream":true,"messages":[{"role":"user","content":"x [sim tokens=2000 gap=20ms]"}]}`))
	req.Header.Set("Authorization", "Bearer "+h.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 64)); err != nil || resp.ProtoMajor != 2 {
		t.Fatalf("first bytes over %s: %v", resp.Proto, err)
	}
	cancel()
	resp.Body.Close()
	if err := sim.WaitStats(10*time.Second, func(s simStats) bool { return s.Cancelled >= 1 && s.OpenStreams == 0 }); err != nil {
		t.Fatalf("backend call not cancelled: %v (stats %+v)", err, sim.Stats())
	}
}
