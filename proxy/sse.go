package proxy

import (
	"bytes"
	"errors"
	"io"
)

// errPeekTooLarge is returned when a first SSE event exceeds the peek cap.
var errPeekTooLarge = errors.New("first event exceeds peek limit")

// errNoEvent: the stream ended before any event with data, so the request
// got no answer (a server that died or dropped the session mid-call).
var errNoEvent = errors.New("stream ended before an answer")

// peekEvent reads from r into buf until buf holds one complete SSE event
// with a non-empty data field (skipping comments and priming events), the
// stream ends, or limit bytes were read. It returns the grown buffer; the
// caller forwards those bytes before streaming the rest.
func peekEvent(r io.Reader, buf []byte, limit int) ([]byte, error) {
	scanned := 0
	for {
		if end := dataEventEnd(buf, &scanned); end >= 0 {
			return buf, nil
		}
		if len(buf) >= limit {
			return buf, errPeekTooLarge
		}
		if cap(buf)-len(buf) < 4096 {
			nb := make([]byte, len(buf), 2*cap(buf)+4096)
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return buf, err
			}
			if len(eventData(buf[scanned:])) > 0 {
				return buf, nil // a last event without its blank line
			}
			return buf, errNoEvent
		}
	}
}

// dataEventEnd returns the offset just past the first complete event in b
// that has a non-empty data line, or -1. *from remembers where whole events
// without data ended, so a rescan skips them.
func dataEventEnd(b []byte, from *int) int {
	for {
		rest := b[*from:]
		n := eventLen(rest)
		if n < 0 {
			return -1
		}
		ev := rest[:n]
		*from += n
		if len(eventData(ev)) > 0 {
			return *from
		}
	}
}

// eventLen returns the length of the first event in b including its blank
// terminating line, or -1 if b holds no complete event. Lines end in \n,
// \r\n or \r (WHATWG HTML §9.2.5).
func eventLen(b []byte) int {
	lineStart := 0
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\n' && c != '\r' {
			continue
		}
		end := i + 1
		if c == '\r' {
			if i+1 >= len(b) {
				return -1 // may be the first half of \r\n
			}
			if b[i+1] == '\n' {
				end++
			}
		}
		if i == lineStart {
			return end // an empty line closes the event
		}
		lineStart = end
		i = end - 1
	}
	return -1
}

// eventData returns the value of the first non-empty data field of one
// event (multi-line data is rare in MCP; the first line decides).
func eventData(ev []byte) []byte {
	for len(ev) > 0 {
		i := bytes.IndexAny(ev, "\r\n")
		line := ev
		if i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		if bytes.HasPrefix(line, []byte("data:")) {
			v := bytes.TrimPrefix(line[5:], []byte(" "))
			if len(bytes.TrimSpace(v)) > 0 {
				return v
			}
		}
	}
	return nil
}

// findResponse returns the data of the first event in an SSE body that is a
// JSON-RPC response (has "result" or "error"), or nil.
func findResponse(b []byte) []byte {
	from := 0
	for from < len(b) {
		n := eventLen(b[from:])
		if n < 0 {
			n = len(b) - from // a final event without its blank line
		}
		d := eventData(b[from : from+n])
		from += n
		if len(d) > 0 && (bytes.Contains(d, []byte(`"result"`)) || bytes.Contains(d, []byte(`"error"`))) {
			return d
		}
	}
	return nil
}
