package exchange

import (
	"io"
	"sync"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// idleWriter writes a POST's relayed SSE answer to its agent, and a
// ": keepalive" comment whenever the upstream has sent nothing for
// stream_keepalive (docs/streams.md "Streams"): a long tool call may send nothing
// for minutes, and a load balancer or gateway between the agent and
// mcpheal cuts a connection idle for its timeout. Every write, the relay's
// and the comments, goes through its lock; a comment goes only where a
// line begins on the agent's side, so it never lands inside a line. A JSON
// answer, or an SSE answer read whole, is written at once and gets none.
type idleWriter struct {
	st    *answerStream
	every time.Duration
	timer *time.Timer

	mu      sync.Mutex // protects atLine, stopped, and writes to w
	w       io.Writer
	atLine  bool // what the agent got so far ends at a line boundary
	stopped bool
}

// keepaliveLine is the comment written to an idle answer: one line, which
// every SSE parser ignores, inside an event or between two.
var keepaliveLine = []byte(": keepalive\n")

// newIdleWriter starts writing st's answer to w.
func newIdleWriter(st *answerStream, w io.Writer) *idleWriter {
	iw := &idleWriter{st: st, every: st.S.Cfg.StreamKeepalive, w: w, atLine: true}
	iw.timer = time.AfterFunc(iw.every, iw.keepalive)
	return iw
}

// write writes p, which ends where a line begins on the agent's side if
// atLine is set, and puts off the next comment.
func (iw *idleWriter) write(p []byte, atLine bool) (int, error) {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	wire.ArmWrite(iw.st.conn, iw.st.S.Cfg.WriteTimeout)
	n, err := iw.w.Write(p)
	iw.atLine = atLine
	iw.timer.Reset(iw.every)
	return n, err
}

// keepalive writes the comment, if the answer is still being written and
// at a line boundary, and arms the next one. It runs on the timer's
// goroutine. A write that fails means the agent has gone: the exchange is
// abandoned (nothing is sent again), under the lock, so never after stop,
// unless the agent may resume the answer (answerlog.go).
func (iw *idleWriter) keepalive() {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	if iw.stopped {
		return
	}
	if iw.atLine {
		wire.ArmWrite(iw.st.conn, iw.st.S.Cfg.WriteTimeout)
		if _, err := iw.w.Write(keepaliveLine); err != nil {
			iw.stopped = true
			if iw.st.log != nil {
				iw.st.log.agentLeft() // the call goes on for the agent to resume it
			} else {
				iw.st.Abandon()
			}
			return
		}
		iw.st.S.Count.BytesOut.Add(uint64(len(keepaliveLine)))
	}
	iw.timer.Reset(iw.every)
}

// stop ends the comments: none is written after it returns.
func (iw *idleWriter) stop() {
	iw.mu.Lock()
	iw.stopped = true
	iw.mu.Unlock()
	iw.timer.Stop()
}
