package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

// parseRaw reads one answer from src through a 16 KiB bufio.Reader, as the
// pool's connections do.
func parseRaw(src io.Reader) (*http.Response, *h1Body, error) {
	return readResponse(bufio.NewReaderSize(src, 16<<10))
}

type wantAnswer struct {
	code    int
	status  string
	minor   int
	ct, ra  string
	cl      int64
	chunked bool
	close   bool
	body    string
}

var goodAnswers = []struct {
	name string
	raw  string
	want wantAnswer
}{
	{"chunked with extensions and trailers",
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"5;name=val\r\nhello\r\n7 ; x=\"q\"\r\n, world\r\n0;last\r\nX-Trailer: 1\r\nY:2\r\n\r\n",
		wantAnswer{code: 200, status: "200 OK", minor: 1, ct: "text/event-stream", cl: -1, chunked: true, body: "hello, world"}},
	{"chunked, upper-case hex, bare LF size lines",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\nA\n0123456789\r\n0\n\n",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: -1, chunked: true, body: "0123456789"}},
	{"content-length",
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}",
		wantAnswer{code: 200, status: "200 OK", minor: 1, ct: "application/json", cl: 11, body: `{"ok":true}`}},
	{"content-length 0",
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: 0}},
	{"bare LF header",
		"HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: 2, body: "hi"}},
	{"until close",
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"a\":1}",
		wantAnswer{code: 200, status: "200 OK", minor: 1, ct: "application/json", cl: -1, close: true, body: `{"a":1}`}},
	{"connection close",
		"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nok",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: 2, close: true, body: "ok"}},
	{"chunked, connection close",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: -1, chunked: true, close: true, body: "ok"}},
	{"HTTP/1.0",
		"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
		wantAnswer{code: 200, status: "200 OK", minor: 0, cl: 2, close: true, body: "ok"}},
	{"HTTP/1.0 keep-alive",
		"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok",
		wantAnswer{code: 200, status: "200 OK", minor: 0, cl: 2, body: "ok"}},
	{"HTTP/1.0 keep-alive until close",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\nok",
		wantAnswer{code: 200, status: "200 OK", minor: 0, cl: -1, close: true, body: "ok"}},
	{"interim answers",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\nContent-Type: text/html\r\n\r\n" +
			"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: 2, body: "ok"}},
	{"204",
		"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
		wantAnswer{code: 204, status: "204 No Content", minor: 1, cl: 0}},
	{"304 chunked",
		"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
		wantAnswer{code: 304, status: "304 Not Modified", minor: 1, cl: 0, chunked: true}},
	{"content-type and retry-after kept",
		"HTTP/1.1 429 Too Many Requests\r\ncontent-type:  application/problem+json \t\r\nRETRY-AFTER: 7\r\nX-Other: y\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}",
		wantAnswer{code: 429, status: "429 Too Many Requests", minor: 1, ct: "application/problem+json", ra: "7", cl: 2, body: "{}"}},
	{"content-length repeated and listed",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3 , 03\r\n\r\nabc",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: 3, body: "abc"}},
	{"transfer-encoding and content-length",
		"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: -1, chunked: true, close: true, body: "ok"}},
	{"transfer-encoding list over lines",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip,\r\nTransfer-Encoding: , chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: -1, chunked: true, body: "ok"}},
	{"transfer-encoding not chunked",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\nContent-Length: 1\r\n\r\n2\r\nok",
		wantAnswer{code: 200, status: "200 OK", minor: 1, cl: -1, close: true, body: "2\r\nok"}},
	{"empty reason",
		"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n",
		wantAnswer{code: 200, status: "200 ", minor: 1, cl: 0}},
	{"no reason",
		"HTTP/1.1 599\r\nContent-Length: 0\r\n\r\n",
		wantAnswer{code: 599, status: "599", minor: 1, cl: 0}},
	{"odd reason",
		"HTTP/1.1 200 Fine Thanks\r\nContent-Length: 0\r\n\r\n",
		wantAnswer{code: 200, status: "200 Fine Thanks", minor: 1, cl: 0}},
}

func TestReadResponse(t *testing.T) {
	sources := map[string]func(string) io.Reader{
		"whole":    func(s string) io.Reader { return strings.NewReader(s) },
		"one byte": func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"half":     func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) },
		"data+EOF": func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) },
	}
	for _, c := range goodAnswers {
		for sname, src := range sources {
			t.Run(c.name+"/"+sname, func(t *testing.T) {
				resp, _, err := parseRaw(src(c.raw))
				if err != nil {
					t.Fatal(err)
				}
				w := c.want
				got := wantAnswer{code: resp.StatusCode, status: resp.Status, minor: resp.ProtoMinor,
					ct: resp.Header.Get("Content-Type"), ra: resp.Header.Get("Retry-After"),
					cl: resp.ContentLength, chunked: len(resp.TransferEncoding) > 0, close: resp.Close}
				body, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatalf("body: %v", err)
				}
				got.body = string(body)
				if got != w {
					t.Fatalf("got  %+v\nwant %+v", got, w)
				}
				if resp.ProtoMajor != 1 || resp.Proto != "HTTP/1."+strconv.Itoa(w.minor) {
					t.Fatalf("proto %q %d.%d", resp.Proto, resp.ProtoMajor, resp.ProtoMinor)
				}
				for k := range resp.Header {
					if k != "Content-Type" && k != "Retry-After" {
						t.Fatalf("header %q kept", k)
					}
				}
				if n, err := resp.Body.Read(make([]byte, 8)); n != 0 || err != io.EOF {
					t.Fatalf("read after the end: %d %v", n, err)
				}
			})
		}
		// iotest.TestReader checks the io.Reader contract with reads of
		// various sizes.
		t.Run(c.name+"/contract", func(t *testing.T) {
			resp, _, err := parseRaw(strings.NewReader(c.raw))
			if err != nil {
				t.Fatal(err)
			}
			if err := iotest.TestReader(resp.Body, []byte(c.want.body)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The answer after this one on the connection is left unread.
func TestReadResponseStopsAtTheEnd(t *testing.T) {
	next := "HTTP/1.1 200 OK\r\n"
	for _, c := range goodAnswers {
		if c.want.close {
			continue
		}
		br := bufio.NewReader(strings.NewReader(c.raw + next))
		resp, _, err := readResponse(br)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		if rest, _ := io.ReadAll(br); string(rest) != next {
			t.Errorf("%s: left %q", c.name, rest)
		}
	}
}

var badHeaders = []struct {
	name string
	raw  string
	err  error
}{
	{"nothing", "", io.EOF},
	{"cut in status line", "HTTP/1.1 20", io.ErrUnexpectedEOF},
	{"cut in header", "HTTP/1.1 200 OK\r\nContent-Le", io.ErrUnexpectedEOF},
	{"no empty line", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", io.ErrUnexpectedEOF},
	{"cut after interim", "HTTP/1.1 100 Continue\r\n\r\n", io.ErrUnexpectedEOF},
	{"HTTP/2.0", "HTTP/2.0 200 OK\r\n\r\n", errVersion},
	{"HTTP/2", "HTTP/2 200 OK\r\n\r\n", errVersion},
	{"HTTP/1.2", "HTTP/1.2 200 OK\r\n\r\n", errVersion},
	{"HTTP/0.9", "HTTP/0.9 200 OK\r\n\r\n", errVersion},
	{"ICY", "ICY 200 OK\r\n\r\n", errStatusLine},
	{"lower-case http", "http/1.1 200 OK\r\n\r\n", errStatusLine},
	{"2-digit status", "HTTP/1.1 20 OK\r\n\r\n", errStatusLine},
	{"4-digit status", "HTTP/1.1 2000 OK\r\n\r\n", errStatusLine},
	{"letters", "HTTP/1.1 abc OK\r\n\r\n", errStatusLine},
	{"signed status", "HTTP/1.1 +20 OK\r\n\r\n", errStatusLine},
	{"0xx status", "HTTP/1.1 099 OK\r\n\r\n", errStatusLine},
	{"two spaces", "HTTP/1.1  200 OK\r\n\r\n", errStatusLine},
	{"tab", "HTTP/1.1\t200 OK\r\n\r\n", errStatusLine},
	{"no status", "HTTP/1.1\r\n\r\n", errStatusLine},
	{"101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", errSwitching},
	{"folding", "HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", errFolding},
	{"folding first", "HTTP/1.1 200 OK\r\n\tX: a\r\n\r\n", errFolding},
	{"no colon", "HTTP/1.1 200 OK\r\nX a\r\n\r\n", errNoColon},
	{"empty name", "HTTP/1.1 200 OK\r\n: a\r\n\r\n", errFieldName},
	{"bad name", "HTTP/1.1 200 OK\r\nX(y): a\r\n\r\n", errFieldName},
	{"non-ASCII name", "HTTP/1.1 200 OK\r\nX\xc3\xa9: a\r\n\r\n", errFieldName},
	{"space before colon", "HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok", errNameSpace},
	{"CR in value", "HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n", errStrayCR},
	{"CR at the end", "HTTP/1.1 200 OK\r\nX: a\r\r\n\r\n", errStrayCR},
	{"CTL in value", "HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n", errFieldValue},
	{"DEL in value", "HTTP/1.1 200 OK\r\nX: a\x7f\r\n\r\n", errFieldValue},
	{"content-length garbage", "HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", errContentLength},
	{"content-length empty", "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n", errContentLength},
	{"content-length negative", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", errContentLength},
	{"content-length signed", "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx", errContentLength},
	{"content-length spaced", "HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n", errContentLength},
	{"content-length overflow", "HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775808\r\n\r\n", errContentLength},
	{"content-length differing", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", errContentLength},
	{"content-length list differing", "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n", errContentLength},
	{"content-length empty element", "HTTP/1.1 200 OK\r\nContent-Length: 5,,5\r\n\r\n", errContentLength},
	{"content-length on 204 checked", "HTTP/1.1 204 No Content\r\nContent-Length: x\r\n\r\n", errContentLength},
	{"chunked twice", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", errTransferEncoding},
	{"chunked twice over lines", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", errTransferEncoding},
	{"empty transfer-encoding", "HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\n", errTransferEncoding},
	{"transfer-encoding commas", "HTTP/1.1 200 OK\r\nTransfer-Encoding: , ,\r\n\r\n", errTransferEncoding},
	{"transfer-encoding not a token", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chun ked\r\n\r\n", errTransferEncoding},
	{"HTTP/1.0 transfer-encoding", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nok", errTE10},
	{"line over the buffer", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 17<<10) + "\r\n\r\n", errLineTooLong},
	{"header over 64 KiB", "HTTP/1.1 200 OK\r\n" + strings.Repeat("X: "+strings.Repeat("a", 1000)+"\r\n", 70) + "\r\n", errHeaderTooLarge},
	{"interim headers over 64 KiB", strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: "+strings.Repeat("a", 1000)+"\r\n\r\n", 70), errHeaderTooLarge},
}

func TestReadResponseRejects(t *testing.T) {
	for _, c := range badHeaders {
		t.Run(c.name, func(t *testing.T) {
			for _, src := range []io.Reader{strings.NewReader(c.raw), iotest.OneByteReader(strings.NewReader(c.raw))} {
				resp, b, err := parseRaw(src)
				if !errors.Is(err, c.err) {
					t.Fatalf("err %v, want %v", err, c.err)
				}
				if resp != nil || b != nil {
					t.Fatal("a response with the error")
				}
			}
		})
	}
}

var badBodies = []struct {
	name string
	raw  string // after "HTTP/1.1 200 OK\r\n"
	body string // what comes out before the error
	err  error
}{
	{"bad hex", "Transfer-Encoding: chunked\r\n\r\nzz\r\n", "", errChunkLine},
	{"empty size", "Transfer-Encoding: chunked\r\n\r\n\r\nhello\r\n0\r\n\r\n", "", errChunkLine},
	{"size then junk", "Transfer-Encoding: chunked\r\n\r\n5x\r\nhello\r\n0\r\n\r\n", "", errChunkLine},
	{"CR in chunk line", "Transfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n", "", errChunkLine},
	{"chunk line too long", "Transfer-Encoding: chunked\r\n\r\n5;" + strings.Repeat("x", 5000) + "\r\nhello\r\n0\r\n\r\n", "", errChunkLine},
	{"chunk line over the buffer", "Transfer-Encoding: chunked\r\n\r\n5;" + strings.Repeat("x", 20000) + "\r\nhello\r\n0\r\n\r\n", "", errChunkLine},
	{"chunk too large", "Transfer-Encoding: chunked\r\n\r\n20000000000\r\nhello\r\n0\r\n\r\n", "", errChunkTooLarge},
	{"17 digits", "Transfer-Encoding: chunked\r\n\r\n00000000000000005\r\nhello\r\n0\r\n\r\n", "", errChunkTooLarge},
	{"data then junk", "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", "hello", errChunkEnd},
	{"data then bare LF", "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n", "hello", errChunkEnd},
	{"malformed trailer", "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nbad\r\n\r\n", "hello", errNoColon},
	{"folded trailer", "Transfer-Encoding: chunked\r\n\r\n0\r\nA: b\r\n c\r\n\r\n", "", errFolding},
	{"trailer over 64 KiB", "Transfer-Encoding: chunked\r\n\r\n0\r\n" + strings.Repeat("X: "+strings.Repeat("a", 1000)+"\r\n", 70) + "\r\n", "", errHeaderTooLarge},
	{"cut in chunk data", "Transfer-Encoding: chunked\r\n\r\n5\r\nhel", "hel", io.ErrUnexpectedEOF},
	{"cut in chunk size", "Transfer-Encoding: chunked\r\n\r\n5", "", io.ErrUnexpectedEOF},
	{"cut before chunk size", "Transfer-Encoding: chunked\r\n\r\n", "", io.ErrUnexpectedEOF},
	{"cut in CRLF", "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r", "hello", io.ErrUnexpectedEOF},
	{"no last chunk", "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", "hello", io.ErrUnexpectedEOF},
	{"cut in trailer", "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n", "hello", io.ErrUnexpectedEOF},
	{"cut in trailer field", "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nA: b\r\n", "hello", io.ErrUnexpectedEOF},
	{"cut in content-length", "Content-Length: 10\r\n\r\nabc", "abc", io.ErrUnexpectedEOF},
	{"nothing of content-length", "Content-Length: 10\r\n\r\n", "", io.ErrUnexpectedEOF},
}

func TestReadResponseBodyErrors(t *testing.T) {
	for _, c := range badBodies {
		t.Run(c.name, func(t *testing.T) {
			raw := "HTTP/1.1 200 OK\r\n" + c.raw
			for _, src := range []io.Reader{strings.NewReader(raw), iotest.OneByteReader(strings.NewReader(raw))} {
				resp, _, err := parseRaw(src)
				if err != nil {
					t.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				if !errors.Is(err, c.err) || string(body) != c.body {
					t.Fatalf("read %q, %v; want %q, %v", body, err, c.body, c.err)
				}
				// Errors stick.
				if _, err2 := resp.Body.Read(make([]byte, 8)); err2 != err {
					t.Fatalf("then %v", err2)
				}
			}
		})
	}
}

// failAfter returns data, then fails: a body that wanted more than the
// data would return the failure.
type failAfter struct{ data []byte }

var errWouldBlock = errors.New("read past what the server sent so far")

func (r *failAfter) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, errWouldBlock
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// A chunk's bytes come out as soon as they are here, whatever of the next
// chunk came with them: an event stream can't wait for the next event.
func TestChunkedReadDoesNotWait(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	const first = "data: {\"n\":1}\n\n"
	rest := "\r\n" + "10;ext=1\r\n" + "data: {\"n\":22}\n\n" + "\r\n0\r\n\r\n"
	dataAt := strings.Index(rest, "data:")
	for cut := 0; cut <= dataAt; cut++ {
		raw := head + fmt.Sprintf("%x", len(first)) + "\r\n" + first + rest[:cut]
		for _, whole := range []bool{true, false} {
			var src io.Reader = &failAfter{data: []byte(raw)}
			if !whole {
				src = iotest.OneByteReader(src)
			}
			resp, _, err := parseRaw(src)
			if err != nil {
				t.Fatal(err)
			}
			var got []byte
			buf := make([]byte, 4096)
			for len(got) < len(first) {
				n, err := resp.Body.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					t.Fatalf("cut %d: after %q: %v", cut, got, err)
				}
			}
			if string(got) != first {
				t.Fatalf("cut %d: %q", cut, got)
			}
		}
	}
	// With everything there, one Read returns the whole body and its end.
	raw := head + fmt.Sprintf("%x", len(first)) + "\r\n" + first + rest
	resp, _, err := parseRaw(strings.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := resp.Body.Read(buf)
	if err != io.EOF || string(buf[:n]) != first+"data: {\"n\":22}\n\n" {
		t.Fatalf("%q %v", buf[:n], err)
	}
}

// The body hands the connection back at its end if the answer allows, and
// closes it otherwise.
func TestH1BodyConnection(t *testing.T) {
	cases := []struct {
		raw    string
		read   bool // to the end, else Close first
		pooled bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true, true},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", true, true},
		{"HTTP/1.1 204 No Content\r\n\r\n", true, true},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", true, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", true, false},
		{"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", true, false},
		{"HTTP/1.1 200 OK\r\n\r\nok", true, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok", true, false}, // cut short
	}
	for i, c := range cases {
		nc := &closeRecorder{}
		p := &Pool{maxIdle: 4}
		conn := &h1Conn{c: nc, br: bufio.NewReader(strings.NewReader(c.raw))}
		resp, b, err := readResponse(conn.br)
		if err != nil {
			t.Fatal(err)
		}
		b.c, b.p, b.stop = conn, p, func() bool { return true }
		if c.read {
			io.Copy(io.Discard, resp.Body)
		}
		resp.Body.Close()
		if pooled := len(p.idle) == 1; pooled != c.pooled {
			t.Errorf("case %d: pooled %v, want %v", i, pooled, c.pooled)
		}
		if nc.closed == c.pooled {
			t.Errorf("case %d: connection closed %v", i, nc.closed)
		}
		if !c.read {
			if _, err := resp.Body.Read(make([]byte, 1)); err != http.ErrBodyReadAfterClose {
				t.Errorf("case %d: read after close: %v", i, err)
			}
		}
	}
}

// closeRecorder is a connection that only notes being closed.
type closeRecorder struct {
	net.Conn
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// FuzzResponseReader reads the same bytes with readResponse and with
// http.ReadResponse (skipping 1xx answers as the transport does) and
// compares what the gateway would see: status, Content-Type, Retry-After,
// framing, the decoded body, whether reading it fails, and reuse.
//
// Deliberate differences, skipped below, each with its reason:
//   - Rejected here, accepted by net/http (stricter, for a pooled
//     connection's safety or because the gateway never wants it):
//     HTTP versions other than 1.0/1.1; a status line with more than one
//     space before the code or a code below 100 or with a sign; 101 (we
//     never ask to switch); obsolete line folding; whitespace in a field name
//     ("Content-Length : 5", which net/http keeps as another field); a CR
//     inside a header line (textproto trims CRs at a line's ends);
//     Transfer-Encoding in an HTTP/1.0 answer (RFC 9112 §6.1: faulty
//     framing; net/http ignores it); a line over the 16 KiB buffer or header
//     blocks over 64 KiB (net/http's limits are the transport's, 1 MiB); an
//     empty Content-Length (net/http takes it as none; RFC 9110 §8.6 wants
//     digits).
//   - Accepted here, rejected by net/http (RFC 9112 allows them):
//     Content-Length as a list of equal values or repeated with equal
//     values spelled differently ("3, 03"); Transfer-Encoding other than
//     one field "chunked" (a list ending in chunked is chunked, else the
//     body runs to the close); a bare LF ending a chunk-size or trailer
//     line; whitespace between a chunk size and ';'; chunk extensions that
//     outweigh the data (net/http's "too much non-data" limit).
//   - Both accept, reuse differs: with both Transfer-Encoding and
//     Content-Length we don't reuse the connection; net/http does.
func FuzzResponseReader(f *testing.F) {
	for _, c := range goodAnswers {
		f.Add([]byte(c.raw))
	}
	for _, c := range badHeaders {
		if len(c.raw) < 4096 {
			f.Add([]byte(c.raw))
		}
	}
	for _, c := range badBodies {
		if len(c.raw) < 4096 {
			f.Add([]byte("HTTP/1.1 200 OK\r\n" + c.raw))
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ours, b, ourErr := parseRaw(bytes.NewReader(raw))
		theirs, theirErr := netReadResponse(raw)
		switch {
		case ourErr != nil && theirErr != nil:
			return
		case ourErr != nil:
			if !deliberateReject(ourErr, theirs) {
				t.Fatalf("we reject what net/http accepts: %v\n%q", ourErr, raw)
			}
			return
		case theirErr != nil:
			if !deliberateAccept(b.lax, theirErr) {
				t.Fatalf("we accept what net/http rejects: %v\n%q", theirErr, raw)
			}
			return
		}
		if ours.StatusCode != theirs.StatusCode || ours.Status != theirs.Status || ours.Proto != theirs.Proto ||
			ours.ProtoMinor != theirs.ProtoMinor {
			t.Fatalf("status %q %q, net/http %q %q\n%q", ours.Proto, ours.Status, theirs.Proto, theirs.Status, raw)
		}
		for _, k := range []string{"Content-Type", "Retry-After"} {
			if ours.Header.Get(k) != theirs.Header.Get(k) {
				t.Fatalf("%s %q, net/http %q\n%q", k, ours.Header.Get(k), theirs.Header.Get(k), raw)
			}
		}
		if ours.ContentLength != theirs.ContentLength ||
			(len(ours.TransferEncoding) > 0) != (len(theirs.TransferEncoding) > 0) {
			t.Fatalf("framing %d %v, net/http %d %v\n%q", ours.ContentLength, ours.TransferEncoding,
				theirs.ContentLength, theirs.TransferEncoding, raw)
		}
		if ours.Close != theirs.Close && b.lax&laxTEAndCL == 0 {
			t.Fatalf("close %v, net/http %v\n%q", ours.Close, theirs.Close, raw)
		}
		ourBody, ourErr := io.ReadAll(ours.Body)
		theirBody, theirErr := io.ReadAll(theirs.Body)
		switch {
		case ourErr != nil && theirErr != nil:
		case ourErr != nil:
			if !deliberateReject(ourErr, theirs) {
				t.Fatalf("body: we fail where net/http does not: %v\n%q", ourErr, raw)
			}
		case theirErr != nil:
			if !deliberateAccept(b.lax, theirErr) && !strings.Contains(theirErr.Error(), "too much non-data") {
				t.Fatalf("body: net/http fails where we do not: %v\n%q", theirErr, raw)
			}
		case !bytes.Equal(ourBody, theirBody):
			t.Fatalf("body %q, net/http %q\n%q", ourBody, theirBody, raw)
		}
	})
}

// netReadResponse reads an answer as net/http's transport does: interim
// answers other than 101 are skipped.
func netReadResponse(raw []byte) (*http.Response, error) {
	br := bufio.NewReaderSize(bytes.NewReader(raw), 16<<10)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == 101 {
			return resp, nil
		}
	}
}

// deliberateReject: we reject (theirs is net/http's answer, nil if it
// failed on the body), and that is one of the documented differences.
func deliberateReject(err error, theirs *http.Response) bool {
	var ae *answerError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.kind {
	case errVersion, errSwitching, errFolding, errNameSpace, errStrayCR, errTE10,
		errLineTooLong, errHeaderTooLarge:
		return true
	case errContentLength:
		// net/http takes an empty Content-Length as none.
		_, v, _ := strings.Cut(ae.line, ":")
		return strings.Trim(v, " \t") == ""
	case errStatusLine:
		// net/http takes "HTTP/1.1  200", "HTTP/1.1 012", "HTTP/1.1 +12",
		// "HTTP/1.0 -00" (a code of 0).
		l := ae.line
		return len(l) > 9 && (l[9] == ' ' || l[9] == '0' || l[9] == '+' || l[9] == '-')
	}
	return false
}

// deliberateAccept: net/http failed on what we accepted using leniencies
// lax, and its error is the one those leniencies explain.
func deliberateAccept(lax uint8, err error) bool {
	msg := err.Error()
	switch {
	case lax&laxContentLength != 0 && strings.Contains(msg, "Content-Length"):
		return true
	case lax&laxTE != 0 && strings.Contains(msg, "transfer encoding"):
		return true
	case lax&laxBareLF != 0 && (strings.Contains(msg, "bare LF") || strings.Contains(msg, "trailer")):
		return true
	case lax&laxChunkBWS != 0 && strings.Contains(msg, "invalid byte in chunk length"):
		return true
	}
	return false
}

// A 19-event vLLM stream: one event per chunk, as uvicorn writes them.
func vllmStream() []byte {
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 200 OK\r\ndate: Tue, 03 Jun 2025 10:00:00 GMT\r\nserver: uvicorn\r\n" +
		"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n")
	const pre = `data: {"id":"chatcmpl-8f3a1c2e9b7d4e6f","object":"chat.completion.chunk","created":1748944800,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":`
	events := []string{pre + `{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`}
	for _, w := range strings.Fields("The capital of France is Paris, known for its art, food, wine and rich history.") {
		events = append(events, pre+`{"content":" `+w+`"},"logprobs":null,"finish_reason":null}]}`)
	}
	events = append(events, pre+`{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`)
	events = append(events, `data: {"id":"chatcmpl-8f3a1c2e9b7d4e6f","object":"chat.completion.chunk","created":1748944800,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":14,"total_tokens":31,"completion_tokens":17}}`)
	events = append(events, "data: [DONE]")
	for _, e := range events {
		e += "\n\n"
		fmt.Fprintf(&b, "%x\r\n%s\r\n", len(e), e)
	}
	b.WriteString("0\r\n\r\n")
	if len(events) != 19 {
		panic(len(events))
	}
	return b.Bytes()
}

func BenchmarkReadResponse(b *testing.B) {
	raw := vllmStream()
	src := bytes.NewReader(raw)
	br := bufio.NewReaderSize(src, 16<<10)
	buf := make([]byte, 4096)
	drain := func(b *testing.B, body io.Reader) {
		for {
			_, err := body.Read(buf)
			if err == io.EOF {
				return
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	lean := func(br *bufio.Reader) (*http.Response, error) {
		resp, _, err := readResponse(br)
		return resp, err
	}
	for _, r := range []struct {
		name string
		read func(*bufio.Reader) (*http.Response, error)
	}{
		{"net_http", func(br *bufio.Reader) (*http.Response, error) { return http.ReadResponse(br, nil) }},
		{"lean", lean},
	} {
		b.Run(r.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				src.Reset(raw)
				br.Reset(src)
				resp, err := r.read(br)
				if err != nil {
					b.Fatal(err)
				}
				drain(b, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
