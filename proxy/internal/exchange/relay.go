package exchange

import (
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/upstream"
)

// How eachEvent ended.
const (
	EventsDone       = iota // fn said the answer is complete
	EventsGone              // fn could not write to the agent
	EventsCut               // the upstream stream ended first
	EventsTooLarge          // an upstream event passed max_sse_line
	EventsOverBudget        // holding an upstream event whole would pass memory_budget
	EventsQuiet             // nothing came before the read deadline fn set, or a wake
)

// peek reads a POST's SSE answer up to its first event with data, through
// the rewriter set up for it (peekFirst); false when the stream ended or
// broke first.
func (st *answerStream) peek() bool {
	st.Rw.Gen, st.Rw.Max = st.Gen, st.S.Cfg.MaxSSELine
	st.Rw.Meter.Mem = st.S.Mem
	if !st.Heals {
		st.Rw.Gen = 1 // nothing to renumber: no session, or the bridge's own
	}
	st.Rw.Watch = st.Msg.Method == "tools/list" && st.Sess != nil
	if st.Heals && st.Msg.IsRequest() && !st.Msg.Batch && st.S.Cfg.ResumeBuffer > 0 {
		st.Rw.Own = ownStreams.Add(1) // its agent may resume it (answerlog.go)
	}
	// A call that sends nothing for stream_keepalive is judged on its head
	// and streamed, so that its agent gets keepalive comments (idle.go): a
	// session error comes at once, never after that long.
	st.quiet = st.Msg.IsRequest()
	var ok bool
	st.Out, st.First, st.FirstWhole, ok = wire.PeekFirst((*upstreamStream)(st), &st.Rw, st.Out[:0], st.readBuf())
	if st.quietArmed {
		_ = st.Resp.SetReadDeadline(time.Time{})
	}
	st.quiet, st.quietArmed = false, false
	return ok
}

// peeked returns, once, the whole events the first exchange's peek read
// (judge), for a route that reads the events itself (the bridge).
func (st *answerStream) peeked() [][]byte {
	if len(st.Out) == 0 {
		return nil
	}
	var fr sse.Framer
	fr.Feed(st.Out)
	st.Out = st.Out[:0]
	var evs [][]byte
	for {
		ev, ok, _ := fr.Next()
		if !ok {
			return evs
		}
		evs = append(evs, ev)
	}
}

// EachEvent reads the SSE answer's events, the first exchange's peek
// first, and gives fn the data of each that has any, until fn reports the
// answer done (done) or the agent gone (!ok), or the stream ends. It is how
// a route that reads the events itself (the bridges) reads them; data is
// valid until fn returns. A stream of a session mcpheal holds that ends
// before its response is resumed upstream as the relay resumes it
// (resume.go), from the last event id it read.
func (st *answerStream) EachEvent(fn func(data []byte) (done, ok bool)) int {
	fr := &st.Rw.Fr // it holds what the attempt's peek read past its first events
	fr.Max = st.S.Cfg.MaxSSELine
	var data []byte
	st.Rw.Meter.Mem = st.S.Mem
	// The peek's events were rewritten (their ids noted by the rewriter
	// then); those framed here are the upstream's own, noted here.
	feed := func(ev []byte) (int, bool) {
		if data = sse.Data(data[:0], ev); len(data) == 0 {
			return 0, false
		}
		done, ok := fn(data)
		if cap(data) > wire.FreeHold {
			data = nil // a large event's copy is not kept for the next
		}
		switch {
		case !ok:
			return EventsGone, true
		case done:
			return EventsDone, true
		}
		return 0, false
	}
	for {
		for _, ev := range st.peeked() {
			if end, stop := feed(ev); stop {
				return end
			}
		}
		for {
			ev, ok, ferr := fr.Next()
			if ferr != nil {
				return EventsTooLarge
			}
			if !ok {
				break
			}
			st.Rw.NoteEvent(ev)
			if end, stop := feed(ev); stop {
				return end
			}
		}
		if st.Resp.TakeWake() {
			return EventsQuiet // a route's own reason to look up (held_call.go inject)
		}
		if fr.Buffered() == 0 && fr.Held() > wire.FreeHold {
			fr.Reset(wire.FreeHold) // a large event has passed: its room is not kept
		}
		n, err := st.Resp.Read(st.readBuf())
		fr.Feed(st.Buf[:n])
		// An event is held whole until it ends, then copied for fn (data)
		// and translated by it: counted past freeHold, with its copies.
		if !st.Rw.Meter.Hold(fr.Held() + 2*max(cap(data), fr.Buffered())) {
			return EventsOverBudget
		}
		if err != nil && n == 0 {
			if err != io.EOF && upstream.IsTimeout(err) { // IsTimeout allocates: not on every stream's end
				st.Resp.TakeWake()
				return EventsQuiet // only a route that set a deadline, or woke it, sees it
			}
			if us := (*upstreamStream)(st); us.resumable() && us.resume(err) {
				continue // the rest of the answer, on a GET with Last-Event-ID
			}
			return EventsCut
		}
	}
}

// Cut is the error that ends an SSE answer whose upstream stream ended
// before its response: the request is safe to send again (-32010), or it
// may have run and was not (-32011).
func (st *answerStream) Cut() Failure {
	if st.replaySafe {
		return Failure{Code: wire.CodeUpstreamDown, Msg: "upstream connection lost before the answer; " + st.Msg.Method + " is safe to retry"}
	}
	st.S.Count.ReplaysRefused.Add(1)
	return Failure{Code: wire.CodeMaybeExecuted, Msg: (*upstreamStream)(st).ended() + ", after " + st.Msg.Method +
		" was sent; it may or may not have run and was not retried"}
}

// OverBudget is the error that ends an answer stream whose next event
// mcpheal would have to hold whole past memory_budget (holdMeter). The
// request ran, or may have: it is not sent again.
func (st *answerStream) OverBudget() Failure {
	st.S.Log.Warn().Str(obs.LogMethod, obs.LogText(st.Msg.Method)).Int64("budget", st.S.Mem.Limit).
		Msg("answer stream cut: an event to hold whole would pass the memory budget")
	return Failure{Code: wire.CodeBudget, Msg: "an upstream event of " + st.Msg.Method + "'s answer would pass mcpheal's " +
		"memory_budget held whole; the answer was cut, and the request was not sent again"}
}

// streamBegan reports whether the answer in resp is a POST's event
// stream that the upstream began with status 200 and events (out).
func (st *answerStream) streamBegan() bool {
	return !st.Msg.Get && len(st.Out) > 0 && (st.head != nil || st.Resp.IsStream() && st.Resp.StatusCode() == fasthttp.StatusOK)
}

// learn learns the tools of a tools/list answer whose response event has
// passed through the relay.
func (st *answerStream) learn() {
	if st.Rw.Response != nil {
		heal.LearnTools(st.Sess, st.Rw.Response)
		st.Rw.Response = nil
	}
}

// finish reads what has arrived of an SSE answer whose response has passed
// (a server SHOULD end the stream after it, MCP 2025-11-25 §Sending
// Messages to the Server), waiting up to wire.EndWait for the first of it. It
// reports whether that included the stream's end: the answer then goes out
// as one buffered write. What has not arrived is streamed.
func (st *answerStream) finish() bool {
	r := st.Resp
	if !r.Arrived(wire.EndWait) || r.SetReadDeadline(time.Now().Add(wire.FinishWait)) != nil {
		return false
	}
	buf := st.readBuf()
	for first := true; len(st.Out) < wire.PeekLimit && (first || r.Buffered() > 0 || r.Complete()); first = false {
		n, err := r.Read(buf)
		// A read that times out here stopped inside the chunked framing
		// and cannot go on: the answer ends with what came. Its response
		// has passed, so the agent loses at most a trailing notification.
		res, aliased := st.relay(st.Out, buf[:n], err)
		if aliased {
			res = append(st.Out, res...)
		}
		if st.Out = res; st.eof {
			return true
		}
	}
	_ = r.SetReadDeadline(time.Time{})
	return false
}

// relay turns p, read from the upstream stream with rerr, into the agent's
// bytes: an unchanged prefix of p itself (aliased), or out with them
// appended. It is the one step of every relay loop (finish, sseBody).
func (st *answerStream) relay(out, p []byte, rerr error) (res []byte, aliased bool) {
	res, aliased, serr := st.Rw.Stream(out, p)
	if serr == nil && rerr == nil {
		st.learn()
		return res, aliased
	}
	if aliased {
		res = append(out, res...)
	}
	return st.settle(res, serr, rerr), false
}

// settle ends the relay of an answer whose upstream stream ended or broke,
// or whose line passed max_sse_line: it sets eof, learns the tools of a
// tools/list answer, and ends an answer that has no response yet with
// mcpheal's error event.
func (st *answerStream) settle(res []byte, serr, rerr error) []byte {
	st.eof = true
	inject := !st.Rw.Answered && st.Msg.IsRequest()
	res, midLine := st.Rw.EndStream(res, !inject)
	st.learn()
	if !inject {
		return res
	}
	// The stream ended before the answer: without one the agent's call
	// would wait for its own timeout. It gets mcpheal's error instead.
	f := st.Cut()
	switch {
	case errors.Is(serr, wire.ErrHoldBudget):
		f = st.OverBudget()
	case serr != nil:
		f = Failure{Code: wire.CodeTooLarge, Msg: "upstream answer has an SSE line larger than mcpheal's limit of " +
			strconv.Itoa(st.Rw.Max) + " bytes (max_sse_line); the answer was cut"}
	}
	st.S.Log.Warn().Str(obs.LogMethod, obs.LogText(st.Msg.Method)).Str(obs.LogTool, obs.LogText(st.Msg.Tool)).Int("code", f.Code).AnErr("cut", rerr).
		AnErr("too_large", serr).Msg("SSE answer ended before its response")
	// End the agent's current event first: a blank line, after ending a
	// line cut mid-way (its event is lost either way).
	if midLine {
		res = append(res, '\n')
	}
	res = append(res, '\n')
	return sse.AppendEvent(res, "message", wire.AppendError(nil, f.Code, st.Msg.IdOrNull(), f.Msg))
}

// handedOn runs when what the relay made of the stream so far has gone to
// the agent (or its log): a large output buffer is not kept, and what the
// memory budget counted of a line held whole is given back
// (eventRewriter.handedOn).
func (st *answerStream) handedOn() {
	if cap(st.Out) > wire.FreeHold {
		st.Out = nil
	}
	st.Rw.HandedOn()
}
