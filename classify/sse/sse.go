// Package sse frames a text/event-stream (HTML Living Standard §9.2,
// "Server-sent events") into events, for everything in mcpheal that reads
// one: the classifier's first-event peek, the proxy's event relay and every
// request the proxy makes on an agent's behalf, the doctor and the benchmark
// checker.
//
// It has one rule, kept in one place: an event is complete only at the blank
// line that ends it. A line ends in LF, CRLF or a lone CR, and a CRLF split
// across two reads is still one line end. Nothing here guesses that a
// partial event "looks finished" (one copy of the framing once accepted an
// unfinished event holding "result" and cut answers at 4 KiB).
//
// The package imports only the standard library and allocates only to grow
// a [Framer]'s buffer.
package sse

import (
	"bytes"
	"errors"
)

// ErrTooLarge is returned by [Framer.Next] when the event being read has
// grown past the framer's Max without ending.
var ErrTooLarge = errors.New("sse: event exceeds the size limit")

// Framer splits a stream fed in pieces of any size into complete events.
// Its cost is linear in the bytes fed: each byte is scanned once, and bytes
// of an unfinished event are moved at most once per event that completes
// before them.
//
// The zero value is ready to use, with no size limit.
type Framer struct {
	// Max caps one event, terminator included; zero means no limit. When the
	// unfinished event grows past it, Next returns ErrTooLarge.
	Max int

	buf  []byte // buf[off:] is not yet returned by Next
	off  int
	scan int  // next byte of buf to scan
	line int  // start of the line being scanned
	cr   bool // buf[scan-1] was a CR ending a line: a following LF is part of it
	// lf: the event returned last ended in a CR that was the last byte fed;
	// an LF arriving next completes that CRLF and is returned alone.
	lf bool
}

// Feed appends p to the stream. The framer copies p.
func (f *Framer) Feed(p []byte) {
	if f.off > 0 && f.off == len(f.buf) {
		// Everything fed was returned: start over at the front.
		f.buf, f.scan, f.line, f.off = f.buf[:0], 0, 0, 0
	} else if f.off > 0 && len(f.buf)+len(p) > cap(f.buf) {
		// Compact before growing, so a buffer holding one unfinished event
		// never doubles for returned bytes.
		n := copy(f.buf, f.buf[f.off:])
		f.buf = f.buf[:n]
		f.scan -= f.off
		f.line -= f.off
		f.off = 0
	}
	f.buf = append(f.buf, p...)
}

// Next returns the next complete event: its bytes as they came, field lines
// and the blank line that ends it. ok is false when no complete event is
// buffered. The bytes are valid until the next Feed or Reset.
//
// A piece that holds no field, such as the LF of a CRLF whose CR ended the
// previous event, is returned as an event of its own; it has no data and
// relays byte for byte.
func (f *Framer) Next() (ev []byte, ok bool, err error) {
	b := f.buf
	if f.lf && f.scan < len(b) {
		f.lf = false
		if b[f.scan] == '\n' {
			f.scan++
			f.line = f.scan
			return f.take(), true, nil
		}
	}
	for i := f.scan; i < len(b); i++ {
		c := b[i]
		if c == '\n' && f.cr {
			f.cr = false // the LF of a CRLF: the line already ended
			f.line = i + 1
			continue
		}
		f.cr = false
		if c != '\n' && c != '\r' {
			// Skip to the next line end at memchr speed.
			j := bytes.IndexAny(b[i+1:], "\r\n")
			if j < 0 {
				break
			}
			i += j
			continue
		}
		f.cr = c == '\r'
		blank := i == f.line
		f.line = i + 1
		if !blank {
			continue
		}
		// A blank line: the event ends here, with the LF of a CRLF if it
		// has arrived.
		end := i + 1
		if c == '\r' {
			if end < len(b) {
				if b[end] == '\n' {
					end++
				}
			} else {
				f.lf = true
			}
			f.cr = false
		}
		f.scan, f.line = end, end
		return f.take(), true, nil
	}
	f.scan = len(b)
	if f.Max > 0 && len(b)-f.off > f.Max {
		return nil, false, ErrTooLarge
	}
	return nil, false, nil
}

// take returns buf[off:scan] as the next event.
func (f *Framer) take() []byte {
	ev := f.buf[f.off:f.scan:f.scan]
	f.off = f.scan
	return ev
}

// Rest returns the bytes of an unfinished event: what a stream that ended
// mid-event left behind. They are valid until the next Feed or Reset.
func (f *Framer) Rest() []byte { return f.buf[f.off:] }

// Buffered returns how many bytes the framer holds that Next has not
// returned.
func (f *Framer) Buffered() int { return len(f.buf) - f.off }

// Reset empties the framer, keeping its buffer (up to keep bytes of
// capacity; a larger one is dropped so that a pooled framer does not pin
// the memory of one large event).
func (f *Framer) Reset(keep int) {
	b := f.buf[:0]
	if cap(b) > keep {
		b = nil
	}
	*f = Framer{Max: f.Max, buf: b}
}

// NextLine splits ev after its first line. The line excludes its ending
// (LF, CRLF or CR); rest starts after it.
func NextLine(ev []byte) (line, rest []byte) {
	i := bytes.IndexAny(ev, "\r\n")
	if i < 0 {
		return ev, nil
	}
	line, rest = ev[:i], ev[i+1:]
	if ev[i] == '\r' && len(rest) > 0 && rest[0] == '\n' {
		rest = rest[1:]
	}
	return line, rest
}

// Field splits one line into its field name and value (§9.2.6): the value
// starts after the first colon and one space after it is dropped; a line
// with no colon is a field with an empty value; a line starting with a
// colon is a comment (comment true).
func Field(line []byte) (name, value []byte, comment bool) {
	i := bytes.IndexByte(line, ':')
	switch {
	case i == 0:
		return nil, line[1:], true
	case i < 0:
		return line, nil, false
	}
	name, value = line[:i], line[i+1:]
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	return name, value, false
}

// Data returns the event's data (§9.2.6): the value of its one data line as
// a view into ev, or, when the event has several data lines, their values
// joined by LF and appended to dst. An event without a data line (a
// comment, a lone line ending) has nil data; a data line with no value
// (the 2025-11-25 priming event) gives empty, non-nil data.
func Data(dst, ev []byte) []byte {
	var first []byte
	n := 0
	for rest := ev; len(rest) > 0; {
		var line []byte
		line, rest = NextLine(rest)
		name, v, comment := Field(line)
		if comment || string(name) != "data" {
			continue
		}
		switch n++; n {
		case 1:
			first = v
			if first == nil {
				first = line[len(line):] // empty but present
			}
		case 2:
			dst = append(append(append(dst, first...), '\n'), v...)
		default:
			dst = append(append(dst, '\n'), v...)
		}
	}
	if n <= 1 {
		return first
	}
	return dst
}

// ID returns the value of the event's last id field, and whether it has
// one (§9.2.6: a value holding NUL is ignored).
func ID(ev []byte) (id []byte, ok bool) {
	for rest := ev; len(rest) > 0; {
		var line []byte
		line, rest = NextLine(rest)
		if name, v, comment := Field(line); !comment && string(name) == "id" && bytes.IndexByte(v, 0) < 0 {
			id, ok = v, true
		}
	}
	return id, ok
}

// Retry returns the event's retry field in milliseconds, if it holds only
// ASCII digits (§9.2.6).
func Retry(ev []byte) (ms int, ok bool) {
	for rest := ev; len(rest) > 0; {
		var line []byte
		line, rest = NextLine(rest)
		name, v, comment := Field(line)
		if comment || string(name) != "retry" || len(v) == 0 || len(v) > 9 {
			continue
		}
		n, digits := 0, true
		for _, c := range v {
			if c < '0' || c > '9' {
				digits = false
				break
			}
			n = n*10 + int(c-'0')
		}
		if digits {
			ms, ok = n, true
		}
	}
	return ms, ok
}
