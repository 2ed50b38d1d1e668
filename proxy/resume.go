package proxy

import (
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/upstream"
)

// Resuming an answer stream upstream (docs/streams.md "Streams"). A session-era
// server may end a POST's event stream before its response, on purpose
// (MCP 2025-11-25 SSE polling: a priming event with an id and retry:, then
// the connection closed) or not (a load balancer's idle timeout, a reset):
// either way, once an event id has passed, the rest of the answer can be
// fetched with GET and Last-Event-ID on the same upstream session. mcpheal
// does that itself, and the agent gets one uninterrupted stream, whatever
// its SDK does with a closed stream. Resumption never sends the request
// again: it asks for the events of the one exchange that was made, so the
// replay rules do not change. Where it is impossible (no event id, the
// session died, the server has no GET or refuses) the answer ends as
// before, with mcpheal's error.

// errQuiet ends the peek at an answer's first event when the upstream sent
// none for stream_keepalive: the answer is judged on its head and relayed.
var errQuiet = errors.New("no event yet")

// maxRetryWait caps the retry: interval of a server's stream that mcpheal
// waits before it resumes it, as it caps a busy server's Retry-After.
const maxRetryWait = time.Minute

// maxResumes bounds the resumptions of one answer stream that bring no new
// event id: a server that closes every stream at once would otherwise be
// asked for ever (the Go SDK's client counts the same way).
const maxResumes = 5

// upstreamStream is an attempt's upstream answer stream as every relay
// reads it (peekFirst, finish, sseBody): the upstream response's body,
// resumed when it ends or breaks before its response.
type upstreamStream attempt

// Read reads the answer stream. An error that ends it is held back while
// the bytes read with it are relayed, so that resumption is decided on
// everything that came (a response among them needs none).
func (us *upstreamStream) Read(p []byte) (int, error) {
	a := (*attempt)(us)
	for {
		err := a.rerr
		if err == nil {
			if a.quiet && a.resp.TakeWake() {
				return 0, errQuiet // the route has something for its agent (held_call.go inject)
			}
			if a.quiet && !a.quietArmed && a.resp.Buffered() == 0 {
				a.quietArmed = a.resp.SetReadDeadline(time.Now().Add(a.s.cfg.StreamKeepalive)) == nil
			}
			var n int
			n, err = a.resp.Read(p)
			switch {
			case err == nil:
				return n, nil
			case a.quiet && (a.quietArmed || a.resp.Woken()) && upstream.IsTimeout(err):
				// IsTimeout last: it allocates, and a short answer's peek
				// ends with io.EOF.
				if n > 0 {
					return n, nil // the deadline has passed, or a wake: the next read says so
				}
				a.resp.TakeWake()
				return 0, errQuiet
			case n > 0:
				a.rerr = err
				return n, nil
			}
		}
		a.rerr = err // what every later read returns, unless resumed
		if !us.resumable() || !us.resume(err) {
			return 0, err
		}
		a.rerr = nil
	}
}

// resumable reports whether the answer stream may be resumed upstream: a
// request's answer on a session mcpheal holds, whose response has not
// passed, after an event id, and nobody has given up on it.
func (us *upstreamStream) resumable() bool {
	a := (*attempt)(us)
	return a.heals && a.resumeWhy == "" && !a.msg.get && !a.msg.batch && a.msg.isRequest() &&
		!a.rw.answered && a.rw.lastID != "" && !a.agentGone()
}

// resume reopens the answer stream after cause ended it: it waits the
// server's retry: interval, then asks for the events after the last one
// that ended, on the same upstream session, within the heal budget. It
// reports false when the stream cannot be resumed (a.resumeWhy says why,
// for the agent's error).
func (us *upstreamStream) resume(cause error) bool {
	a := (*attempt)(us)
	id := a.rw.lastID
	// The server's retry: is its instruction, not an outage: it is waited
	// in full (up to maxRetryWait), as its clients wait it directly, and
	// the heal budget is for reaching it after that.
	delay := min(time.Duration(a.rw.retryMs)*time.Millisecond, maxRetryWait)
	if id != a.resumedAt {
		// Progress since the last resumption (or the first): a new budget.
		a.resumedAt, a.resumes = id, 0
		a.resumeBy = time.Now().Add(delay + a.s.cfg.HealTimeout)
	}
	clean := errors.Is(cause, io.EOF)
	wait := upstream.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	for {
		a.resumes++
		if a.resumes > maxResumes {
			return us.noResume("the upstream ended it " + strconv.Itoa(maxResumes) + " times without a new event")
		}
		left := time.Until(a.resumeBy)
		if delay >= left {
			return us.noResume("the heal budget ran out before the upstream's retry interval")
		}
		if delay > 0 && !sleepUnless(delay, nil, a.s.done) {
			return us.noResume("mcpheal is shutting down")
		}
		cls, status := us.reopen(id)
		ev := a.s.log.Debug()
		if !clean {
			ev = a.s.log.Warn() // a break, not the server's own polling
		}
		ev.Str(logMethod, logText(a.msg.method)).Str(logTool, logText(a.msg.tool)).Str(logSession, a.sess.ID.Short()).
			AnErr("cut", cause).Int("retry_ms", a.rw.retryMs).Stringer(logClass, cls).Int("status", status).
			Msg("answer stream ended before its response; asked the upstream for the rest with Last-Event-ID")
		switch cls {
		case classify.OK:
			a.s.count.resumes[outcomeOK].Add(1)
			a.rw.resumed()
			a.quietArmed = false // a peek's deadline was the old connection's
			return true
		case classify.TransportDead, classify.Timeout:
			if a.agentGone() {
				return us.noResume("the agent went away")
			}
			delay = wait.Next() // the upstream may be restarting: try again within the budget
			continue
		case classify.SessionGone:
			return us.noResume("the upstream session ended (" + strconv.Itoa(status) + ")")
		}
		return us.noResume("the upstream refused to resume it (" + strconv.Itoa(status) + ")")
	}
}

// noResume records why the answer stream cannot be resumed, counts it and
// reports false.
func (us *upstreamStream) noResume(why string) bool {
	a := (*attempt)(us)
	a.s.count.resumes[outcomeFailed].Add(1)
	a.resumeWhy = why
	a.s.log.Warn().Str(logMethod, logText(a.msg.method)).Str(logTool, logText(a.msg.tool)).Str("why", why).
		Msg("answer stream not resumed")
	return false
}

// reopen sends the GET that resumes the answer stream after the event
// lastID, into a.resp, with the headers the request went with (its
// credential, the operator's). It returns the class of the answer, OK only
// for an event stream.
func (us *upstreamStream) reopen(lastID string) (classify.Class, int) {
	a := (*attempt)(us)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	a.s.link.build(req, &upcall{hdr: &a.req.Header, method: fasthttp.MethodGet, session: a.up,
		version: a.sess.Recipe.ProtocolVersion, lastEventID: lastID})
	if a.head == nil {
		// The agent's answer keeps the head of the stream it began with.
		a.head = new(fasthttp.ResponseHeader)
		a.resp.Header.CopyTo(a.head)
	}
	a.resp.Close()
	a.resp.Response.Reset()
	// Its head is due within the heal budget, like every try of a heal.
	err := a.s.link.do(req, a.resp, a.resumeBy)
	if err != nil {
		cls := failClass(err)
		a.s.link.recordHealth(cls)
		return cls, 0
	}
	status, body := a.resp.StatusCode(), []byte(nil)
	if !a.resp.IsStream() {
		body = a.resp.Body() // a stream is judged on its head: its events are the answer's
	}
	cls := classify.Classify(status, a.resp.Header.ContentType(), body)
	a.s.link.recordHealth(cls)
	if cls == classify.OK && (!a.resp.IsStream() || status != fasthttp.StatusOK) {
		cls = classify.Protocol // an answer, but not the stream asked for
	}
	return cls, status
}

// resumed readies the rewriter for the events of a resumed stream: the
// framer's unfinished event is dropped (the server sends it again whole,
// after the last event that ended), and a line or event cut half-way on
// its way to the agent is ended first, so that the resumed events are not
// spliced onto it.
func (er *eventRewriter) resumed() {
	er.fr.Reset(64 << 10)
	_, midLine := er.endStream(nil, false)
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

// ended says how the upstream's answer stream ended before its
// response, and why mcpheal could not resume it (resume.go).
func (us *upstreamStream) ended() string {
	a := (*attempt)(us)
	const ended = "the upstream's event stream ended before its answer"
	switch {
	case a.resumeWhy != "":
		return ended + " (it could not be resumed: " + a.resumeWhy + ")"
	case a.heals && a.rw.lastID == "":
		return ended + " (no event id to resume it from)"
	}
	return ended
}
