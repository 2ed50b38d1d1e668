package exchange

import (
	"bufio"
	"net"
	"time"

	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// AgentStream writes an SSE answer that stays open to its agent: a GET
// stream (getstream.go, or the bridge's listen) or a bridged call's rounds
// (bridge.go). It writes whole events only, framed by the one SSE writer
// (sse.AppendEvent), each flushed at once, each write bounded by
// write_timeout and counted. (A POST's relayed SSE answer is the
// upstream's own events, rewritten line by line: sseBody.)
type AgentStream struct {
	S    *Env
	W    *bufio.Writer
	Conn net.Conn
	buf  []byte
}

// KeepaliveComment keeps an idle stream's connection alive: proxies and
// runtimes in between cut streams idle for minutes (Node's 300 s request
// timeout), and every MCP client's SSE parser ignores comments.
var KeepaliveComment = sse.AppendComment(nil, "keepalive")

// Write writes b, whole events, and flushes; false once the agent is gone.
func (st *AgentStream) Write(b []byte) bool {
	wire.ArmWrite(st.Conn, st.S.Cfg.WriteTimeout)
	if _, err := st.W.Write(b); err != nil || st.W.Flush() != nil {
		return false
	}
	st.S.Count.BytesOut.Add(uint64(len(b)))
	return true
}

// Event writes one JSON-RPC message as a message event.
func (st *AgentStream) Event(msg []byte) bool {
	st.buf = sse.AppendEvent(st.buf[:0], "message", msg)
	ok := st.Write(st.buf)
	if cap(st.buf) > wire.FreeHold {
		st.buf = nil // a large event's copy is not kept for the call's next ones
	}
	return ok
}

// Pump writes the events that arrive on out, and a keepalive comment
// every StreamKeepalive, until quit closes, the server closes, or the
// agent goes away. When done closes (the producer ended), what it queued
// goes out, then the stream ends. head writes a comment at once, so that
// the answer's head reaches the agent before any event (the Go SDK's
// client waits for it).
func (st *AgentStream) Pump(out *wire.Queue, done, quit <-chan struct{}, head bool) {
	defer out.Close() // what is still queued is nobody's now
	t := time.NewTicker(st.S.Cfg.StreamKeepalive)
	defer t.Stop()
	if head && !st.Write(KeepaliveComment) {
		return
	}
	for {
		var b []byte
		select {
		case b = <-out.C:
		case <-done:
			for {
				select {
				case b = <-out.C:
					ok := st.Write(b)
					out.Took(b)
					if !ok {
						return
					}
				default:
					return
				}
			}
		case <-t.C:
			if !st.Write(KeepaliveComment) {
				return
			}
			continue
		case <-quit:
			return
		case <-st.S.Done:
			return
		}
		ok := st.Write(b) // counted until written
		out.Took(b)
		if !ok {
			return
		}
	}
}
