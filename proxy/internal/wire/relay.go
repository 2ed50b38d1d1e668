package wire

import (
	"bytes"

	"github.com/mcpheal/mcpheal/classify/sse"
)

// Relaying a stream line by line. Once the first event of an answer has
// been judged, the rest of the stream goes to the agent as it arrives: a
// line passes through untouched, with no copy, unless the eventRewriter
// must see it whole (see mustHold). So a long data line, such as a 12 MB
// tool result in one event, costs no buffer and no rescan, and memory per
// stream stays bounded by the longest line held (Config.MaxSSELine).

// lineMode is where the relay is within the current line.
type lineMode uint8

const (
	// lineDone: at a line boundary (the zero value); a piece that does not
	// start a line is the LF of a CRLF split across reads.
	lineDone lineMode = iota
	// lineOpen: the line's first bytes are held until its field name is
	// known.
	lineOpen
	lineHeld
	LinePassing
)

// StartStream hands what the framer holds of an unfinished event over to
// the line relay; out receives what of it can go to the agent now.
func (er *EventRewriter) StartStream(out []byte) ([]byte, error) {
	rest, lines := er.Fr.Handover()
	er.lines, er.Mode, er.Held = lines, lineDone, er.Held[:0]
	res, aliased, err := er.Stream(out, rest)
	if aliased {
		res = append(out, res...)
	}
	er.Fr.Reset(64 << 10)
	return res, err
}

// Stream relays p. The output is either a prefix of p itself (aliased
// true: nothing in it changed, and the rest of p is held), or out with the
// output appended. err is sse.ErrTooLarge when a held line outgrows
// er.max, errHoldBudget when the memory budget has no room for it (it is
// counted past freeHold, with its rewritten copy); the stream is then to
// be cut.
func (er *EventRewriter) Stream(out, p []byte) (res []byte, aliased bool, err error) {
	e := emitter{p: p, out: out, aliased: true}
	e.bytes(er.cut)
	er.cut = nil
	for pos := 0; pos < len(p); {
		n, start, ended := er.lines.Next(p[pos:])
		if start {
			er.Mode, er.Held = lineOpen, er.Held[:0]
		}
		seg := p[pos : pos+n]
		if start {
			e.bytes(er.startLine(ended && sse.IsLineEnd(seg)))
		}
		if er.Mode == lineDone {
			e.raw(pos, pos+n)
			pos += n
			continue
		}
		if er.Mode == lineOpen {
			er.Held = append(er.Held, seg...)
			if hold, known := er.mustHold(er.Held, ended); known {
				er.Mode = lineHeld
				if !hold {
					er.Mode = LinePassing
					er.startHead()
					if len(er.Held) == n {
						e.raw(pos, pos+n) // the whole line so far is in p
					} else {
						e.bytes(er.Held)
					}
				}
			}
		} else if er.Mode == lineHeld {
			er.Held = append(er.Held, seg...)
		} else {
			e.raw(pos, pos+n)
			er.addHead(seg)
		}
		if er.Mode == lineHeld {
			if er.Max > 0 && len(er.Held) > er.Max {
				r, _ := e.result()
				return r, e.aliased, sse.ErrTooLarge
			}
			if len(er.Held) > FreeHold && !er.Meter.Hold(2*cap(er.Held)) {
				r, _ := e.result()
				return r, e.aliased, ErrHoldBudget
			}
			if ended {
				er.emitHeld(&e)
			}
		}
		if ended {
			if er.Mode == LinePassing {
				er.endHead()
			}
			er.Mode = lineDone
		}
		pos += n
	}
	r, _ := e.result()
	return r, e.aliased, nil
}

// emitHeld emits the line held whole, now that it ended, rewritten.
func (er *EventRewriter) emitHeld(e *emitter) {
	line, _ := sse.NextLine(er.Held)
	if name, v, comment := sse.Field(line); !comment && string(name) == "data" && !er.Answered {
		er.Answered = IsResponse(v)
	}
	e.copyMode()
	e.out = er.line(e.out, line)
	e.out = append(e.out, er.Held[len(line):]...) // its line ending
	er.Held = er.Held[:0]
	if cap(er.Held) > FreeHold {
		er.Held = nil // counted while it held a line: not pinned after
	}
	// The charge stays while its rewritten copy waits in the output, until
	// the relay has handed that on (handedOn).
}

// HandedOn runs when the relay has handed its output to the agent: the
// copy of a line held past freeHold is gone from the count, unless a line
// is held now.
func (er *EventRewriter) HandedOn() {
	if er.Mode != lineHeld {
		er.Meter.Release()
	}
}

// EndStream ends the relay of a stream that ended or broke. The bytes of a
// line it held unfinished go to out when keep is set (the agent's parser
// drops an unfinished event at the end of a stream, as it would without
// mcpheal), and are dropped otherwise (an error event follows, which must
// not complete them). It reports whether a line was cut after part of it
// had gone to the agent.
func (er *EventRewriter) EndStream(out []byte, keep bool) (_ []byte, midLine bool) {
	switch er.Mode {
	case lineOpen, lineHeld:
		if keep {
			out = append(out, er.Held...)
		}
	case LinePassing:
		midLine = true
	}
	er.Held, er.Mode = er.Held[:0], lineDone
	if cap(er.Held) > FreeHold {
		er.Held = nil // do not pin a long line's buffer
	}
	er.Meter.Release()
	return out, midLine
}

// mustHold decides, from the first bytes b of a line, whether the line
// must be seen whole: an id (rewritten), a retry (read), and a data line
// that may carry a server→client request to renumber (from generation 2)
// or the tools/list answer to learn from. known is false while b is too
// short to tell.
func (er *EventRewriter) mustHold(b []byte, ended bool) (hold, known bool) {
	name := b
	if i := bytes.IndexByte(b, ':'); i >= 0 {
		name = b[:i]
	} else if ended {
		name, _ = sse.NextLine(b)
	} else if len(b) < len("retry:") {
		return false, false
	}
	switch string(name) {
	case "id", "retry":
		return true, true
	case "data":
		switch {
		case er.Watch:
			return true, true // the tools/list answer, to learn from
		case er.Gen <= 1:
			return false, true
		case ended || len(b) >= headLen:
			// From generation 2 only server→client requests are renumbered,
			// and their "method" comes early (in every server's output): a
			// response, however large, passes once its head shows it is one.
			return bytes.Contains(b, []byte(`"method"`)), true
		}
		return false, false
	}
	return false, true
}

// emitter builds the relay's output for one piece p: as long as the output
// is an unchanged prefix of p it stays in p (no copy); from the first
// change on it is copied into out.
type emitter struct {
	p       []byte
	out     []byte
	aliased bool
	end     int // aliased: the output is p[:end]
}

// raw emits p[from:to].
func (e *emitter) raw(from, to int) {
	if e.aliased && from == e.end {
		e.end = to
		return
	}
	e.copyMode()
	e.out = append(e.out, e.p[from:to]...)
}

// bytes emits b, which is not in p (nothing, when b is empty).
func (e *emitter) bytes(b []byte) {
	if len(b) == 0 {
		return
	}
	e.copyMode()
	e.out = append(e.out, b...)
}

func (e *emitter) copyMode() {
	if e.aliased {
		e.out = append(e.out, e.p[:e.end]...)
		e.aliased = false
	}
}

func (e *emitter) result() ([]byte, bool) {
	if e.aliased {
		return e.p[:e.end], true
	}
	return e.out, false
}

// headLen is how much of a data line passing through is kept to tell a
// response from a notification or a request: their "method", "result" or
// "error" member comes first after "jsonrpc" and "id" in every server's
// output.
const headLen = 256

// startHead starts keeping the head of a line that passes through, from
// the bytes held to decide it.
func (er *EventRewriter) startHead() {
	name, _, comment := sse.Field(er.Held)
	er.data = !comment && string(name) == "data"
	er.headN = 0
	if er.data {
		_, v, _ := sse.Field(er.Held)
		er.hasData = er.hasData || notBlank(v)
		er.headN = copy(er.head[:], er.Held)
	}
}

// addHead keeps the head of a data line that passes through.
func (er *EventRewriter) addHead(seg []byte) {
	if er.data && !er.hasData {
		er.hasData = notBlank(seg)
	}
	if er.data && er.headN < headLen {
		er.headN += copy(er.head[er.headN:], seg)
	}
}

// endHead marks the stream answered when the data line that passed
// through was a JSON-RPC response: its head has "result" or "error" and no
// "method".
func (er *EventRewriter) endHead() {
	if !er.data || er.Answered {
		return
	}
	h := er.head[:er.headN]
	er.Answered = !bytes.Contains(h, []byte(`"method"`)) &&
		(bytes.Contains(h, []byte(`"result"`)) || bytes.Contains(h, []byte(`"error"`)))
}

// Resumed readies the rewriter for the events of a resumed stream: the
// framer's unfinished event is dropped (the server sends it again whole,
// after the last event that ended), and a line or event cut half-way on
// its way to the agent is ended first, so that the resumed events are not
// spliced onto it.
func (er *EventRewriter) Resumed() {
	er.Fr.Reset(64 << 10)
	_, midLine := er.EndStream(nil, false)
	switch {
	case midLine:
		er.cut = endLineAndEvent // the agent drops the event cut in its data: its JSON does not parse
	case er.inEvent:
		er.cut = endEvent
	}
	er.inEvent, er.setID = false, false
	er.lines = sse.Lines{}
}

// What ends, for the agent, a line or an event that a resumed stream cut.
var (
	endLineAndEvent = []byte("\n\n")
	endEvent        = []byte("\n")
)
