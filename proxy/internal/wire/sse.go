package wire

import (
	"errors"
	"io"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/upstream"
)

// Reading SSE answers. Every read of an upstream event stream goes through
// an eventRewriter and so through one sse.Framer: an event counts only once
// its blank line has arrived, whatever the read sizes.

// PeekLimit caps how much of an SSE answer is held back to find its first
// event. A first event larger than that (a large tool result) is judged on
// its prefix and then streamed: what decides is at the start of a message
// (a result, or an error whose message names the session), and a result's
// isError further on changes only how the answer is counted, never what
// mcpheal does with it.
const PeekLimit = 64 << 10

// errNoEvent: the stream ended before any event with data, so the request
// got no answer (a server that died or dropped the session mid-call).
var errNoEvent = errors.New("stream ended before an answer")

// ErrAnswerTooLarge: an SSE answer read whole passed Config.MaxAnswer.
var ErrAnswerTooLarge = errors.New("SSE answer larger than max_answer")

// ReadBuf is the size of one read from an upstream stream: a relayed
// answer goes to the agent one chunk per read.
const ReadBuf = 64 << 10

// readBufs are readAnswer's buffers: requests mcpheal makes itself (a
// keepalive per quiet session) should not allocate one each.
var readBufs = sync.Pool{New: func() any { b := make([]byte, ReadBuf); return &b }}

// PeekFirst reads r through er until the first event with data is complete,
// appending the rewritten events before it and itself to out. first is that
// event, raw, valid until er is fed again; when the first event outgrows
// peekLimit, first is the prefix read so far (whole false) and stays in
// er's framer; when r reports errQuiet (no event with data for
// stream_keepalive), first is nil and the rest is streamed. ok is false
// when the stream ended or broke first.
func PeekFirst(r io.Reader, er *EventRewriter, out, buf []byte) (_, first []byte, whole, ok bool) {
	for {
		for {
			ev, done, err := er.Next()
			if err != nil || !done {
				break
			}
			out = er.Event(out, ev)
			if HasData(ev) {
				return out, ev, true, true
			}
		}
		if len(out)+er.Fr.Buffered() > PeekLimit {
			// Past the limit without a message (a long first event, or
			// comments and priming events): judge what came, stream the rest.
			return out, er.Fr.Rest(), false, true
		}
		n, err := r.Read(buf)
		er.Fr.Feed(buf[:n])
		switch {
		case errors.Is(err, ErrQuiet):
			// Nothing for a while (a long call): judge what came, stream
			// the rest.
			return out, nil, false, true
		case err != nil && n == 0:
			// Ended or cut before the answer: whatever came goes nowhere.
			return out, nil, false, false
		}
	}
}

// HasData reports whether an event carries a message (data beyond
// whitespace): not a comment, a priming event or a lone line ending.
func HasData(ev []byte) bool {
	return notBlank(sse.Data(nil, ev))
}

// notBlank reports whether b holds a byte other than JSON's whitespace
// (space, tab, CR, LF). It looks at bytes alone, so that a data line read
// in pieces is judged as it is whole (Unicode's spaces, which
// bytes.TrimSpace trims, would be judged otherwise when a read splits
// one).
func notBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return true
		}
	}
	return false
}

// IsResponse reports whether a JSON-RPC message is a response (it has a
// result or an error and no method), as opposed to a notification or a
// server→client request sent before it.
func IsResponse(msg []byte) bool {
	// One pass over the members, where a gjson.Get per key would scan the
	// object up to three times: this runs on every event of every SSE
	// answer until its response.
	r := gjson.Parse(B2s(msg))
	if !r.IsObject() {
		return false
	}
	method, answer := false, false
	r.ForEach(func(k, _ gjson.Result) bool {
		switch k.Str {
		case "method":
			method = true
			return false
		case "result", "error":
			answer = true
		}
		return true
	})
	return answer && !method
}

// ReadAnswer reads the JSON-RPC answer of r whole: the body of a JSON
// answer, or the data of the first event of an SSE answer that is a
// response (events before it, such as progress notifications, are read
// past; the stream is closed after it). The stream's end, which a server
// writes right after the response, is read if it comes within FinishWait
// (upstream.Response.ReadEnd): the connection then serves the next
// exchange (a keepalive ping's, a heal's next upcall) instead of closing
// unread, one new connection each. raw is the answer as the agent
// would get it: the JSON body, or for SSE the events up to the response,
// rewritten by er. Both are valid until r is reset or er reused. An SSE
// answer past limit bytes is errAnswerTooLarge (a JSON body is capped by
// the upstream client).
func ReadAnswer(r *upstream.Response, er *EventRewriter, limit int) (raw, msg []byte, err error) {
	if !r.IsStream() {
		return r.Body(), r.Body(), nil
	}
	defer r.Close()
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	for {
		for {
			ev, done, ferr := er.Next()
			if ferr != nil {
				return nil, nil, ErrAnswerTooLarge
			}
			if !done {
				break
			}
			raw = er.Event(raw, ev)
			if d := sse.Data(nil, ev); IsResponse(d) {
				// The data is a view into the framer: copy it, the raw
				// events may grow past it.
				msg = append([]byte(nil), d...)
				r.ReadEnd(FinishWait, PeekLimit)
				return raw, msg, nil
			}
		}
		if er.Fr.Buffered()+len(raw) > limit {
			return nil, nil, ErrAnswerTooLarge
		}
		n, rerr := r.Read(buf)
		er.Fr.Feed(buf[:n])
		if rerr != nil && n == 0 {
			if errors.Is(rerr, io.EOF) {
				rerr = errNoEvent
			}
			return nil, nil, rerr
		}
	}
}

// FinishWait bounds the reads of an SSE answer's end: the relay's finish
// reads only what has already arrived (and the rest of a chunk that arrived
// in part); ReadAnswer waits that long for a stream's end.
const FinishWait = 20 * time.Millisecond

// EndWait is how long mcpheal waits for more of an SSE answer whose
// response has passed: servers write the stream's end right after the
// response (the Go SDK in one more write; the TypeScript SDK v1's arrives
// with the response itself), so it is almost always on its way. For the
// relay, waiting lets the answer go out as one buffered write instead of
// chunks; a stream that stays open only costs its agent EndWait, then is
// relayed as it comes.
const EndWait = 2 * time.Millisecond

// ErrQuiet ends the peek at an answer's first event when the upstream sent
// none for stream_keepalive: the answer is judged on its head and relayed.
var ErrQuiet = errors.New("no event yet")
