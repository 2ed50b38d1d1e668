package exchange

import (
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/upstream"
)

// answerStream is the upstream's answer to one exchange of an attempt (a
// try), and its relay to the agent: the peek at its first event (judge),
// the relay of the rest (relay, settle, finish, and the bodies fasthttp
// writes, body.go), its resumption when it ends early (resume.go), and the
// events a route reads itself (EachEvent). It reads the call it answers
// and changes nothing of it (but the copies of the message's members that
// an answer whose agent left keeps: sseBody.left), and never reaches the
// rest of its attempt (TestAnswerStreamNeverReachesItsAttempt). Each try
// starts it over (reset), keeping its buffers.
type answerStream struct {
	*call // the call it answers: its attempt's own
	// owner is the attempt: a body fasthttp owns gives it back (Release)
	// once the answer is written.
	owner interface{ Release() }
	Resp  *upstream.Response // the attempt's, for every try

	// The SSE answer of a POST: rw frames and rewrites it; out holds the
	// rewritten events not yet handed to the agent (from outPos); first
	// is the raw first event with data, valid until rw is fed again.
	Rw         wire.EventRewriter
	Buf        []byte // one upstream read
	Out        []byte
	First      []byte
	FirstWhole bool // first is a complete event, not a prefix past peekLimit
	// Resuming the answer stream upstream (resume.go): rerr is the read
	// error held back while the bytes read with it are relayed; resumeWhy,
	// once set, why the stream cannot be resumed; resumedAt the event id
	// resumed after, resumes the resumptions since it last changed,
	// resumeBy the end of their budget; head, the head of the stream as the
	// upstream began it, kept once resp holds a resuming GET's.
	head      *fasthttp.ResponseHeader
	rerr      error
	resumeWhy string
	resumedAt string
	resumes   int
	resumeBy  time.Time
	// quiet: the first event is being peeked at; the first read that would
	// wait for it arms a read deadline of stream_keepalive (quietArmed),
	// whose expiry ends the peek (errQuiet), not the stream. An answer
	// whose events came with its head (the usual short one) sets none.
	quiet, quietArmed bool

	// The relay to the agent (respond, the bodies).
	outPos    int
	eof       bool     // the upstream stream has ended
	readWhole bool     // the SSE answer was read up to its response: out is all the agent gets
	conn      net.Conn // the agent's connection, while sseBody writes to it
	// log keeps the streamed answer for its agent to resume (answerlog.go);
	// draining: the agent's connection dropped and drain, not fasthttp,
	// owns the stream and its attempt now.
	log      *AnswerLog
	draining bool
}

// reset starts the answer over for another exchange: what it learnt of
// the last stream is that stream's; its buffers stay, and what it is
// bound to (its call, its owner, the response it reads into).
func (st *answerStream) reset() {
	if st.Rw.Meter.Charged != 0 {
		st.Rw.Meter.Release()
	}
	st.Rw.Fr.Reset(64 << 10)
	*st = answerStream{call: st.call, owner: st.owner, Resp: st.Resp,
		Rw: wire.EventRewriter{Fr: st.Rw.Fr, Held: st.Rw.Held[:0], IdBuf: st.Rw.IdBuf[:0]}, Buf: st.Buf, Out: st.Out[:0]}
}

// readBuf returns the attempt's buffer for one upstream read.
func (st *answerStream) readBuf() []byte {
	if cap(st.Buf) < wire.ReadBuf {
		st.Buf = make([]byte, wire.ReadBuf)
	}
	return st.Buf[:wire.ReadBuf]
}

// Abandon ends the attempt's exchange in flight as if its agent had gone
// (a bridged call the agent cancelled): decide gives up on it and nothing
// is sent again. It may run on another goroutine than the attempt's.
func (st *answerStream) Abandon() {
	st.Watch.Gone.Store(true)
	st.Resp.Interrupt()
}

// upstreamLastID is the upstream's id of the last event of the answer that
// ended (answerCall).
func (st *answerStream) upstreamLastID() string { return st.Rw.LastID }

// LetGo ends the answer stream of a route that read its events up to the
// response and stops there (EachEvent: the held route, the bridge). The
// server writes the stream's end right after the response: read now, if it
// comes within EndWait, it leaves the connection to the pool at once, idle
// from now, for the agent's next call; closed unread, it would take the
// connection with it.
func (st *answerStream) LetGo() {
	st.Resp.ReadEnd(wire.EndWait, wire.PeekLimit)
	st.Resp.Close()
}
