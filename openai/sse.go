package openai

import (
	"bytes"
	"errors"
	"io"
)

// Server-sent events, as upstream servers send them and as tollgate writes them.
//
// The reader follows the WHATWG event-stream rules (lines end in \n, \r\n or
// \r; a line starting with ':' is a comment; "field: value" with one optional
// space after the colon; data lines of one event are joined with \n; a blank
// line dispatches the event) with two deliberate departures, both documented
// in docs/streams.md:
//
//   - A line "error: {...}" is llama.cpp's way of reporting a failure inside a
//     stream (its server writes an SSE field literally named "error"). The
//     standard says to ignore unknown fields; tollgate must not ignore a
//     failure, so the reader reports it as an event named "error".
//   - At the end of the input, an event that was not closed by a blank line is
//     still dispatched (a truncated final line included), so that a stream cut
//     short surfaces as malformed JSON rather than vanishing silently.

// Event is one dispatched server-sent event.
type Event struct {
	// Name is the event type ("" when the stream gave none; "error" for
	// "event: error" and for llama.cpp's "error:" field).
	Name string
	// Data is the event's data without the "data: " prefix; several data
	// lines are joined with "\n". For a comment it is the comment text. It
	// aliases the reader's buffer and is valid only until the next call to Next.
	Data []byte
	// Comment is true for a comment line (": keep-alive",
	// ": OPENROUTER PROCESSING"). Comments are reported one by one, so that a
	// caller can treat them as a sign of life from the upstream.
	Comment bool
}

// DefaultMaxLineBytes is the longest line an EventReader accepts by default
// (tool-call arguments and inline images can make one data line very long).
const DefaultMaxLineBytes = 32 << 20

// ErrLineTooLong is returned by EventReader.Next when a line exceeds the limit.
var ErrLineTooLong = errors.New("openai: server-sent event line too long")

// EventReader reads server-sent events from an upstream response body.
// It never waits for more input once a whole event is buffered, so each event
// can be forwarded as soon as it arrives. Not safe for concurrent use.
type EventReader struct {
	r       io.Reader
	buf     []byte // read buffer; buf[start:end] is unread input
	start   int
	end     int
	max     int
	eof     bool
	err     error // sticky read error (other than io.EOF)
	skipLF  bool  // the previous line ended in \r: a following \n belongs to it
	data    []byte
	name    []byte
	hasData bool
	// LastEventID is the value of the last "id:" field seen (kept for
	// completeness; tollgate does not resume streams).
	LastEventID string
	// OnWait, when set, is called just before the reader reads from its
	// source, which may block: everything already received has been handed
	// out. The relay flushes its client there, so chunks that arrived
	// together go out in one write and none waits for the next one.
	OnWait func()
}

// NewEventReader returns a reader with DefaultMaxLineBytes as its line limit.
func NewEventReader(r io.Reader) *EventReader {
	return NewEventReaderSize(r, DefaultMaxLineBytes)
}

// NewEventReaderSize returns a reader that rejects lines longer than maxLine bytes.
func NewEventReaderSize(r io.Reader, maxLine int) *EventReader {
	if maxLine < 64 {
		maxLine = 64
	}
	return &EventReader{r: r, buf: make([]byte, 4096), max: maxLine}
}

// Reset makes the reader read from r, keeping its buffers.
func (er *EventReader) Reset(r io.Reader) {
	*er = EventReader{r: r, buf: er.buf, data: er.data[:0], name: er.name[:0], max: er.max, OnWait: er.OnWait}
}

// BufferSize is the size of the reader's buffer (it grows for long lines).
func (er *EventReader) BufferSize() int { return cap(er.buf) + cap(er.data) }

// Next returns the next event or comment. It returns io.EOF at the end of the
// input, ErrLineTooLong for an over-long line, or the underlying read error.
func (er *EventReader) Next() (Event, error) {
	for {
		line, ok, err := er.readLine()
		if err != nil {
			return Event{}, err
		}
		if !ok { // end of input
			if er.hasData || len(er.name) > 0 {
				return er.dispatch(), nil
			}
			return Event{}, io.EOF
		}
		if len(line) == 0 {
			if er.hasData || string(er.name) == "error" {
				return er.dispatch(), nil
			}
			er.name = er.name[:0]
			continue
		}
		if line[0] == ':' {
			if er.hasData {
				continue // a comment inside an event: nothing to report
			}
			c := line[1:]
			if len(c) > 0 && c[0] == ' ' {
				c = c[1:]
			}
			return Event{Data: c, Comment: true}, nil
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "data":
			if er.hasData {
				er.data = append(er.data, '\n')
			}
			er.data = append(er.data, value...)
			er.hasData = true
		case "event":
			er.name = append(er.name[:0], value...)
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				er.LastEventID = string(value)
			}
		case "error": // llama.cpp: "error: {json}"
			er.name = append(er.name[:0], "error"...)
			if er.hasData {
				er.data = append(er.data, '\n')
			}
			er.data = append(er.data, value...)
			er.hasData = true
		default: // "retry" and unknown fields are ignored
		}
	}
}

func (er *EventReader) dispatch() Event {
	ev := Event{Data: er.data}
	switch string(er.name) {
	case "":
	case "error":
		ev.Name = "error"
	case "message":
		ev.Name = "message"
	default:
		ev.Name = string(er.name)
	}
	er.data = er.data[:0]
	er.name = er.name[:0]
	er.hasData = false
	return ev
}

// readLine returns the next line without its terminator. ok is false at the
// end of the input (after a final unterminated line has been returned).
// The line aliases the read buffer until the next call.
func (er *EventReader) readLine() (line []byte, ok bool, err error) {
	scanFrom := 0
	for {
		if er.skipLF && er.start < er.end {
			if er.buf[er.start] == '\n' {
				er.start++
			}
			er.skipLF = false
		}
		b := er.buf[er.start:er.end]
		if i := indexEOL(b[scanFrom:]); i >= 0 {
			i += scanFrom
			line = b[:i]
			er.start += i + 1
			if b[i] == '\r' {
				er.skipLF = true
			}
			if len(line) > er.max {
				return nil, false, ErrLineTooLong
			}
			return line, true, nil
		}
		scanFrom = len(b)
		if er.eof {
			if len(b) == 0 {
				return nil, false, nil
			}
			er.start = er.end
			if len(b) > er.max {
				return nil, false, ErrLineTooLong
			}
			return b, true, nil
		}
		if er.err != nil {
			return nil, false, er.err
		}
		if len(b) > er.max {
			return nil, false, ErrLineTooLong
		}
		er.fill()
	}
}

// indexEOL finds the first \n or \r.
func indexEOL(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	s := b
	if i >= 0 {
		s = b[:i]
	}
	if j := bytes.IndexByte(s, '\r'); j >= 0 {
		return j
	}
	return i
}

// fill reads more input, compacting or growing the buffer as needed.
func (er *EventReader) fill() {
	if er.start > 0 {
		n := copy(er.buf, er.buf[er.start:er.end])
		er.start, er.end = 0, n
	}
	if er.end == len(er.buf) {
		size := 2 * len(er.buf)
		if size > er.max+2 {
			size = er.max + 2
		}
		if size <= len(er.buf) {
			size = len(er.buf) + 4096
		}
		nb := make([]byte, size)
		copy(nb, er.buf[:er.end])
		er.buf = nb
	}
	if er.OnWait != nil {
		er.OnWait()
	}
	for tries := 0; tries < 100; tries++ {
		n, err := er.r.Read(er.buf[er.end:])
		er.end += n
		if err == io.EOF {
			er.eof = true
			return
		}
		if err != nil {
			er.err = err
			return
		}
		if n > 0 {
			return
		}
	}
	er.err = io.ErrNoProgress
}

// AppendData appends one SSE event carrying data: "data: " + data + "\n\n".
// data must not contain a line break (JSON from this package never does).
func AppendData(dst, data []byte) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	return append(dst, '\n', '\n')
}

// DoneEvent is the last event of a successful stream.
var DoneEvent = []byte("data: [DONE]\n\n")

// KeepAliveComment is the comment tollgate sends while the upstream is silent.
var KeepAliveComment = []byte(": keep-alive\n\n")
