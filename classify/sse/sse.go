// Package sse frames a text/event-stream (HTML Living Standard §9.2,
// "Server-sent events") into events, for everything in mcpheal that reads
// one: the classifier's first-event peek, the proxy's event relay and every
// request the proxy makes on an agent's behalf, the doctor and the benchmark
// checker. It also writes every event mcpheal sends an agent ([AppendEvent],
// write.go).
//
// It has one rule, kept in one place: an event is complete only at the blank
// line that ends it. A line ends in LF, CRLF or a lone CR, and a CRLF split
// across two reads is still one line end. Nothing here guesses that a
// partial event "looks finished" (one copy of the framing once accepted an
// unfinished event holding "result" and cut answers at 4 KiB).
//
// The package imports only the standard library and allocates only to grow
// a [Framer]'s buffer or the caller's.
package sse

import (
	"bytes"
	"errors"
)

// ErrTooLarge is returned by [Framer.Next] when the event being read has
// grown past the framer's Max without ending.
var ErrTooLarge = errors.New("sse: event exceeds the size limit")

// Lines splits a stream fed in pieces of any size into lines as the bytes
// arrive, holding none of them: it is for relays that pass long lines
// through without buffering them, and the line-ending rule of [Framer].
// The zero value is at the start of a line.
type Lines struct {
	mid bool // inside a line
	cr  bool // the last line ended in a CR that was the last byte seen
}

// Next returns the length n of the next segment of p: the bytes of the
// current line up to and including its line ending (ended true), or all of
// p when the line goes on past it. start reports that the segment begins a
// line. A LF that completes a CRLF whose CR ended the previous piece is a
// segment of its own with start false and ended true: it belongs to the
// line before. p must not be empty.
func (l *Lines) Next(p []byte) (n int, start, ended bool) {
	if l.cr {
		l.cr = false
		if p[0] == '\n' {
			return 1, false, true
		}
	}
	start = !l.mid
	i := lineEnd(p)
	switch {
	case i < 0:
		l.mid = true
		return len(p), start, false
	case p[i] == '\n':
		l.mid = false
		return i + 1, start, true
	case i+1 < len(p):
		l.mid = false
		if p[i+1] == '\n' {
			return i + 2, start, true
		}
		return i + 1, start, true
	}
	l.mid, l.cr = false, true // a CR at the end: a LF may follow
	return i + 1, start, true
}

// AtLineStart reports whether the next byte begins a line (a LF completing
// a CRLF excepted).
func (l *Lines) AtLineStart() bool { return !l.mid }

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

	buf   []byte // buf[off:] is not yet returned by Next
	off   int
	scan  int // next byte of buf to scan
	lines Lines
}

// Feed appends p to the stream. The framer copies p.
func (f *Framer) Feed(p []byte) {
	if f.off > 0 && f.off == len(f.buf) {
		// Everything fed was returned: start over at the front.
		f.buf, f.scan, f.off = f.buf[:0], 0, 0
	} else if f.off > 0 && len(f.buf)+len(p) > cap(f.buf) {
		// Compact before growing, so a buffer holding one unfinished event
		// never doubles for returned bytes.
		n := copy(f.buf, f.buf[f.off:])
		f.buf = f.buf[:n]
		f.scan -= f.off
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
	for f.scan < len(f.buf) {
		n, start, ended := f.lines.Next(f.buf[f.scan:])
		at := f.scan
		f.scan += n
		switch {
		case !start && ended && f.scan-f.off == 1 && f.buf[at] == '\n':
			// The LF of a CRLF whose CR ended the event returned last.
			return f.take(), true, nil
		case start && ended && IsLineEnd(f.buf[at:f.scan]):
			// A blank line: the event ends here.
			return f.take(), true, nil
		}
	}
	if f.Max > 0 && len(f.buf)-f.off > f.Max {
		return nil, false, ErrTooLarge
	}
	return nil, false, nil
}

// IsLineEnd reports whether b is only a line ending: LF, CRLF or a lone CR.
func IsLineEnd(b []byte) bool {
	switch len(b) {
	case 1:
		return b[0] == '\n' || b[0] == '\r'
	case 2:
		return b[0] == '\r' && b[1] == '\n'
	}
	return false
}

// take returns buf[off:scan] as the next event.
func (f *Framer) take() []byte {
	ev := f.buf[f.off:f.scan:f.scan]
	f.off = f.scan
	return ev
}

// Handover ends framing by events: it returns the bytes of the unfinished
// event (as Rest) and the Lines state at their start, so that a relay can
// go on line by line from there. The bytes are valid until the next Feed
// or Reset.
func (f *Framer) Handover() (rest []byte, l Lines) {
	if rest = f.Rest(); len(rest) == 0 {
		return rest, f.lines // a LF may still complete a CRLF
	}
	return rest, Lines{} // an event starts at the start of a line
}

// Rest returns the bytes of an unfinished event: what a stream that ended
// mid-event left behind. They are valid until the next Feed or Reset.
func (f *Framer) Rest() []byte { return f.buf[f.off:] }

// Buffered returns how many bytes the framer holds that Next has not
// returned.
func (f *Framer) Buffered() int { return len(f.buf) - f.off }

// Held returns the bytes of memory the framer's buffer holds: what it
// buffers, and room it grew to for an event that has passed.
func (f *Framer) Held() int { return cap(f.buf) }

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

// lineEnd returns the index of the first CR or LF in b, or -1. It searches
// windows that double in size with two vectorised byte searches each, so
// that it costs about the distance to the line end whatever the stream: a
// whole-buffer search for LF alone would rescan a long tail once per line
// in a stream whose lines end in CR alone.
func lineEnd(b []byte) int {
	for off, w := 0, 64; off < len(b); off, w = off+w, 2*w {
		win := b[off:min(off+w, len(b))]
		i := bytes.IndexByte(win, '\n')
		if i < 0 {
			i = len(win)
		}
		if j := bytes.IndexByte(win[:i], '\r'); j >= 0 {
			i = j
		}
		if i < len(win) {
			return off + i
		}
	}
	return -1
}

// NextLine splits ev after its first line. The line excludes its ending
// (LF, CRLF or CR); rest starts after it.
func NextLine(ev []byte) (line, rest []byte) {
	i := lineEnd(ev)
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
