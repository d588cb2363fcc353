package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
)

type evOut struct {
	name, data string
	comment    bool
}

func readAll(t *testing.T, r io.Reader) ([]evOut, error) {
	t.Helper()
	er := NewEventReader(r)
	var out []evOut
	for {
		ev, err := er.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, evOut{ev.Name, string(ev.Data), ev.Comment})
	}
}

func TestEventReaderLineEndings(t *testing.T) {
	want := []evOut{
		{data: `{"a":1}`},
		{comment: true, data: "keep-alive"},
		{data: "line1\nline2"},
		{name: "error", data: `{"x":2}`},
		{data: "[DONE]"},
	}
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		in := strings.Join([]string{
			`data: {"a":1}`, "", ": keep-alive", "", "data:line1", "data: line2", "id: 7", "retry: 100", "",
			"event: error", `data: {"x":2}`, "", "", "data: [DONE]", "", "",
		}, eol)
		for name, r := range map[string]io.Reader{
			"whole":   strings.NewReader(in),
			"onebyte": iotest.OneByteReader(strings.NewReader(in)),
			"half":    iotest.HalfReader(strings.NewReader(in)),
		} {
			got, err := readAll(t, r)
			if err != nil {
				t.Fatalf("%q %s: %v", eol, name, err)
			}
			if len(got) != len(want) {
				t.Fatalf("%q %s: got %+v", eol, name, got)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("%q %s: event %d = %+v, want %+v", eol, name, i, got[i], want[i])
				}
			}
		}
	}
}

func TestEventReaderLlamaCppErrorField(t *testing.T) {
	got, err := readAll(t, strings.NewReader("data: {\"a\":1}\n\nerror: {\"code\":500,\"message\":\"boom\"}\n\n"))
	if err != nil || len(got) != 2 || got[1].name != "error" || got[1].data != `{"code":500,"message":"boom"}` {
		t.Fatalf("%+v %v", got, err)
	}
}

func TestEventReaderEOFWithoutBlankLine(t *testing.T) {
	got, err := readAll(t, strings.NewReader("data: {\"a\":1}\n\ndata: {\"b\""))
	if err != nil || len(got) != 2 || got[1].data != `{"b"` {
		t.Fatalf("%+v %v", got, err)
	}
	got, err = readAll(t, strings.NewReader("data: x\n"))
	if err != nil || len(got) != 1 || got[0].data != "x" {
		t.Fatalf("%+v %v", got, err)
	}
	got, err = readAll(t, strings.NewReader(""))
	if err != nil || len(got) != 0 {
		t.Fatalf("%+v %v", got, err)
	}
}

func TestEventReaderNoWaitAfterEvent(t *testing.T) {
	// The first event must come out without reading past its blank line.
	pr, pw := io.Pipe()
	go func() { pw.Write([]byte("data: one\n\n")) }()
	er := NewEventReader(pr)
	ev, err := er.Next()
	if err != nil || string(ev.Data) != "one" {
		t.Fatalf("%+v %v", ev, err)
	}
	pw.Close()
	if _, err := er.Next(); err != io.EOF {
		t.Fatalf("got %v, want EOF", err)
	}
}

func TestEventReaderLongLines(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 20<<20) // 20 MiB of tool arguments
	in := append(append([]byte("data: "), big...), "\n\ndata: after\n\n"...)
	er := NewEventReader(bytes.NewReader(in))
	ev, err := er.Next()
	if err != nil || len(ev.Data) != len(big) {
		t.Fatalf("len %d err %v", len(ev.Data), err)
	}
	ev, err = er.Next()
	if err != nil || string(ev.Data) != "after" {
		t.Fatalf("%q %v", ev.Data, err)
	}

	er = NewEventReaderSize(bytes.NewReader(in), 1<<20)
	if _, err := er.Next(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("got %v, want ErrLineTooLong", err)
	}
	er = NewEventReaderSize(bytes.NewReader(big), 1<<20) // no line end at all
	if _, err := er.Next(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("got %v, want ErrLineTooLong", err)
	}
}

func TestEventReaderReadError(t *testing.T) {
	boom := errors.New("connection reset")
	er := NewEventReader(io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom)))
	if ev, err := er.Next(); err != nil || string(ev.Data) != "a" {
		t.Fatalf("%v", err)
	}
	if _, err := er.Next(); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the read error", err)
	}
}

func TestEventReaderReset(t *testing.T) {
	er := NewEventReader(strings.NewReader("data: a\n\n"))
	er.Next()
	er.Reset(strings.NewReader("event: x\ndata: b\n\n"))
	ev, err := er.Next()
	if err != nil || ev.Name != "x" || string(ev.Data) != "b" {
		t.Fatalf("%+v %v", ev, err)
	}
}

func TestAppendData(t *testing.T) {
	if got := string(AppendData([]byte("x"), []byte(`{"a":1}`))); got != "xdata: {\"a\":1}\n\n" {
		t.Fatalf("%q", got)
	}
	if string(DoneEvent) != "data: [DONE]\n\n" || string(KeepAliveComment) != ": keep-alive\n\n" {
		t.Fatal("constants changed")
	}
}

func FuzzEventReader(f *testing.F) {
	files, _ := filepath.Glob("testdata/synthetic/*.sse")
	caps, _ := filepath.Glob("testdata/captures/*/*.http")
	for _, p := range append(files, caps...) {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if _, body, ok := bytes.Cut(b, []byte("\r\n\r\n")); ok {
			b = body
		}
		f.Add(b)
	}
	f.Add([]byte("data: a\r\rdata: b\r\n: c\n\nevent: error\n\nerror: x\n\ndata"))
	f.Fuzz(func(t *testing.T, in []byte) {
		n := &StreamNormalizer{ID: testID, Model: testModel, Flavour: LlamaCpp}
		r := NewEventReaderSize(iotest.HalfReader(bytes.NewReader(in)), 1<<16)
		total := 0
		for i := 0; ; i++ {
			ev, err := r.Next()
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrLineTooLong) {
					t.Fatalf("unexpected error %v", err)
				}
				break
			}
			if i > len(in)+1 {
				t.Fatalf("more events than input bytes")
			}
			total += len(ev.Data)
			if total > len(in) {
				t.Fatalf("more data out (%d) than in (%d)", total, len(in))
			}
			out, err := n.Event(ev)
			if out != nil && (err != nil || !json.Valid(out)) {
				t.Fatalf("bad chunk %q (err %v)", out, err)
			}
		}
	})
}

// OnWait runs before every read from the source and never while whole
// events are still buffered.
func TestEventReaderOnWait(t *testing.T) {
	src := &chunkedReader{parts: []string{"data: a\n\ndata: b\n\n", "data: c\n", "\n"}}
	er := NewEventReader(src)
	waits := 0
	er.OnWait = func() { waits++ }
	var got []string
	var waitsBefore []int
	for {
		ev, err := er.Next()
		if err != nil {
			break
		}
		got = append(got, string(ev.Data))
		waitsBefore = append(waitsBefore, waits)
	}
	if strings.Join(got, ",") != "a,b,c" {
		t.Fatalf("events = %v", got)
	}
	// a: one read; b: already buffered (no wait); c: two more reads.
	if waitsBefore[0] != 1 || waitsBefore[1] != 1 || waitsBefore[2] != 3 {
		t.Fatalf("waits before each event = %v, want [1 1 3]", waitsBefore)
	}
}

type chunkedReader struct{ parts []string }

func (c *chunkedReader) Read(p []byte) (int, error) {
	if len(c.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.parts[0])
	c.parts[0] = c.parts[0][n:]
	if c.parts[0] == "" {
		c.parts = c.parts[1:]
	}
	return n, nil
}
