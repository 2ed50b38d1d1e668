package proxy

import (
	"bufio"
	"net"
	"time"

	"github.com/mcpheal/mcpheal/classify/sse"
)

// agentStream writes an SSE answer that stays open to its agent: a GET
// stream (getstream.go, or the bridge's listen) or a bridged call's rounds
// (bridge.go). It writes whole events only, framed by the one SSE writer
// (sse.AppendEvent), each flushed at once, each write bounded by
// write_timeout and counted. (A POST's relayed SSE answer is the
// upstream's own events, rewritten line by line: sseBody.)
type agentStream struct {
	s    *env
	w    *bufio.Writer
	conn net.Conn
	buf  []byte
}

// keepaliveComment keeps an idle stream's connection alive: proxies and
// runtimes in between cut streams idle for minutes (Node's 300 s request
// timeout), and every MCP client's SSE parser ignores comments.
var keepaliveComment = sse.AppendComment(nil, "keepalive")

// write writes b, whole events, and flushes; false once the agent is gone.
func (st *agentStream) write(b []byte) bool {
	armWrite(st.conn, st.s.cfg.WriteTimeout)
	if _, err := st.w.Write(b); err != nil || st.w.Flush() != nil {
		return false
	}
	st.s.count.bytesOut.Add(uint64(len(b)))
	return true
}

// event writes one JSON-RPC message as a message event.
func (st *agentStream) event(msg []byte) bool {
	st.buf = sse.AppendEvent(st.buf[:0], "message", msg)
	return st.write(st.buf)
}

// pump writes the events that arrive on out, and a keepalive comment
// every StreamKeepalive, until quit closes, the server closes, or the
// agent goes away. When done closes (the producer ended), what it queued
// goes out, then the stream ends. head writes a comment at once, so that
// the answer's head reaches the agent before any event (the Go SDK's
// client waits for it).
func (st *agentStream) pump(out <-chan []byte, done, quit <-chan struct{}, head bool) {
	t := time.NewTicker(st.s.cfg.StreamKeepalive)
	defer t.Stop()
	if head && !st.write(keepaliveComment) {
		return
	}
	for {
		var b []byte
		select {
		case b = <-out:
		case <-done:
			for {
				select {
				case b = <-out:
					if !st.write(b) {
						return
					}
				default:
					return
				}
			}
		case <-t.C:
			b = keepaliveComment
		case <-quit:
			return
		case <-st.s.done:
			return
		}
		if !st.write(b) {
			return
		}
	}
}
