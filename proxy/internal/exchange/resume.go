package exchange

import (
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
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

// maxRetryWait caps the retry: interval of a server's stream that mcpheal
// waits before it resumes it, as it caps a busy server's Retry-After.
const maxRetryWait = time.Minute

// ConflictWait is how long a stream the upstream still holds, after the
// connection that carried it closed, is asked for again when it answers
// 409: it has not yet seen the close (the Go SDK answers "stream ID
// conflicts with ongoing stream"), which may take a while under load.
const ConflictWait = 2 * time.Second

// maxResumes bounds the resumptions of one answer stream that bring no new
// event id: a server that closes every stream at once would otherwise be
// asked for ever (the Go SDK's client counts the same way).
const maxResumes = 5

// upstreamStream is the answer stream's upstream side as every relay
// reads it (peekFirst, finish, sseBody): the upstream response's body,
// resumed when it ends or breaks before its response.
type upstreamStream answerStream

// Read reads the answer stream. An error that ends it is held back while
// the bytes read with it are relayed, so that resumption is decided on
// everything that came (a response among them needs none).
func (us *upstreamStream) Read(p []byte) (int, error) {
	st := (*answerStream)(us)
	for {
		err := st.rerr
		if err == nil {
			if st.quiet && st.Resp.TakeWake() {
				return 0, wire.ErrQuiet // the route has something for its agent (held_call.go inject)
			}
			if st.quiet && !st.quietArmed && st.Resp.Buffered() == 0 {
				st.quietArmed = st.Resp.SetReadDeadline(time.Now().Add(st.S.Cfg.StreamKeepalive)) == nil
			}
			var n int
			n, err = st.Resp.Read(p)
			switch {
			case err == nil:
				return n, nil
			case st.quiet && (st.quietArmed || st.Resp.Woken()) && upstream.IsTimeout(err):
				// IsTimeout last: it allocates, and a short answer's peek
				// ends with io.EOF.
				if n > 0 {
					return n, nil // the deadline has passed, or a wake: the next read says so
				}
				st.Resp.TakeWake()
				return 0, wire.ErrQuiet
			case n > 0:
				st.rerr = err
				return n, nil
			}
		}
		st.rerr = err // what every later read returns, unless resumed
		if !us.resumable() || !us.resume(err) {
			return 0, err
		}
		st.rerr = nil
	}
}

// resumable reports whether the answer stream may be resumed upstream: a
// request's answer on a session mcpheal holds, whose response has not
// passed, after an event id, and nobody has given up on it.
func (us *upstreamStream) resumable() bool {
	st := (*answerStream)(us)
	return st.Heals && st.resumeWhy == "" && !st.Msg.Get && !st.Msg.Batch && st.Msg.IsRequest() &&
		!st.Rw.Answered && st.Rw.LastID != "" && !st.AgentGone()
}

// resume reopens the answer stream after cause ended it: it waits the
// server's retry: interval, then asks for the events after the last one
// that ended, on the same upstream session, within the heal budget. It
// reports false when the stream cannot be resumed (resumeWhy says why,
// for the agent's error).
func (us *upstreamStream) resume(cause error) bool {
	st := (*answerStream)(us)
	id := st.Rw.LastID
	// The server's retry: is its instruction, not an outage: it is waited
	// in full (up to maxRetryWait), as its clients wait it directly, and
	// the heal budget is for reaching it after that.
	delay := min(time.Duration(st.Rw.RetryMs)*time.Millisecond, maxRetryWait)
	if id != st.resumedAt {
		// Progress since the last resumption (or the first): a new budget.
		st.resumedAt, st.resumes = id, 0
		st.resumeBy = time.Now().Add(delay + st.S.Cfg.HealTimeout)
	}
	clean := errors.Is(cause, io.EOF)
	retry := st.S.stages.Link.Retry(link.PaceRequest, 0)
	retry.Until(st.resumeBy) // the budget, renewed by progress
	var conflictSince time.Time
	for {
		st.resumes++
		if st.resumes > maxResumes {
			return us.noResume("the upstream ended it " + strconv.Itoa(maxResumes) + " times without a new event")
		}
		if !retry.Fits(delay) {
			return us.noResume("the heal budget ran out before the upstream's retry interval")
		}
		if delay > 0 && !wire.SleepUnless(delay, nil, st.S.Done) {
			return us.noResume("mcpheal is shutting down")
		}
		cls, status := us.reopen(id)
		ev := st.S.Log.Debug()
		if !clean {
			ev = st.S.Log.Warn() // a break, not the server's own polling
		}
		ev.Str(obs.LogMethod, obs.LogText(st.Msg.Method)).Str(obs.LogTool, obs.LogText(st.Msg.Tool)).Str(obs.LogSession, st.Sess.ID.Short()).
			AnErr("cut", cause).Int("retry_ms", st.Rw.RetryMs).Stringer(obs.LogClass, cls).Int("status", status).
			Msg("answer stream ended before its response; asked the upstream for the rest with Last-Event-ID")
		if status == fasthttp.StatusConflict {
			// The upstream still holds the stream that broke: asked again
			// for up to ConflictWait, within the budget, and not counted as
			// a resumption that brought nothing.
			if conflictSince.IsZero() {
				conflictSince = time.Now()
			}
			if time.Since(conflictSince) < ConflictWait {
				st.resumes--
				delay = retry.Next()
				continue
			}
		}
		switch cls {
		case classify.OK:
			st.S.Count.Resumes[obs.OutcomeOK].Add(1)
			st.Rw.Resumed()
			st.quietArmed = false // a peek's deadline was the old connection's
			return true
		case classify.TransportDead, classify.Timeout:
			if st.AgentGone() {
				return us.noResume("the agent went away")
			}
			delay = retry.Next() // the upstream may be restarting: try again within the budget
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
	st := (*answerStream)(us)
	st.S.Count.Resumes[obs.OutcomeFailed].Add(1)
	st.resumeWhy = why
	st.S.Log.Warn().Str(obs.LogMethod, obs.LogText(st.Msg.Method)).Str(obs.LogTool, obs.LogText(st.Msg.Tool)).Str("why", why).
		Msg("answer stream not resumed")
	return false
}

// reopen sends the GET that resumes the answer stream after the event
// lastID, into resp, with the headers the request went with (its
// credential, the operator's). It returns the class of the answer, OK only
// for an event stream.
func (us *upstreamStream) reopen(lastID string) (classify.Class, int) {
	st := (*answerStream)(us)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	st.S.stages.Link.Build(req, &link.Upcall{Hdr: &st.Req.Header, Method: fasthttp.MethodGet, Session: st.up,
		Version: st.Sess.Recipe.ProtocolVersion, LastEventID: lastID})
	if st.head == nil {
		// The agent's answer keeps the head of the stream it began with.
		st.head = new(fasthttp.ResponseHeader)
		st.Resp.Header.CopyTo(st.head)
	}
	st.Resp.Close()
	st.Resp.Response.Reset()
	// Its head is due within the heal budget, like every try of a heal.
	err := st.S.stages.Link.Do(req, st.Resp, st.resumeBy)
	if err != nil {
		cls := link.FailClass(err)
		st.S.stages.Link.RecordHealth(cls)
		return cls, 0
	}
	status, body := st.Resp.StatusCode(), []byte(nil)
	if !st.Resp.IsStream() {
		body = st.Resp.Body() // a stream is judged on its head: its events are the answer's
	}
	cls := classify.Classify(status, st.Resp.Header.ContentType(), body)
	st.S.stages.Link.RecordHealth(cls)
	if cls == classify.OK && (!st.Resp.IsStream() || status != fasthttp.StatusOK) {
		cls = classify.Protocol // an answer, but not the stream asked for
	}
	return cls, status
}

// ended says how the upstream's answer stream ended before its
// response, and why mcpheal could not resume it (resume.go).
func (us *upstreamStream) ended() string {
	st := (*answerStream)(us)
	const ended = "the upstream's event stream ended before its answer"
	switch {
	case st.resumeWhy != "":
		return ended + " (it could not be resumed: " + st.resumeWhy + ")"
	case st.Heals && st.Rw.LastID == "":
		return ended + " (no event id to resume it from)"
	}
	return ended
}
