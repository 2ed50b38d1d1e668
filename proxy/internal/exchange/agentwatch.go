package exchange

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mcpheal/mcpheal/upstream"
)

// An agent that goes away while its request waits on the upstream: the
// upstream exchange is interrupted, instead of running on to
// response_timeout for nobody.

// WatchAfter is how long a request waits on the upstream before mcpheal
// starts watching the agent's connection. A faster answer costs a timer
// reset and stop, and no system call.
const WatchAfter = 500 * time.Millisecond

// agentWatch notices the agent closing its connection while its request
// waits on the upstream (for the head, a JSON body, the first event of an
// SSE answer, a heal, or while the answer is relayed), and interrupts the
// upstream exchange (upstream.Response.Interrupt): nothing is sent again,
// and the answer goes nowhere (decide: actAbandon). It belongs to a pooled
// attempt and is reused with it.
//
// It takes nothing from the connection. After watchAfter, one goroutine
// waits for the connection to become readable and peeks (peerClosed): end
// of stream or an error means the agent closed it; bytes mean the agent sent
// its next request ahead (pipelining), and the watch ends, leaving them for
// fasthttp. A half-closed connection (an agent that shut its write side and
// still reads) looks closed too; net/http's server takes it the same way
// and cancels the request's context.
type agentWatch struct {
	timer *time.Timer   // runs start, watchAfter after arm
	state atomic.Int32  // watchIdle, watchArmed, watchOn
	ended chan struct{} // start's goroutine returned (one token per watch that ran)
	Gone  atomic.Bool   // the agent closed its connection
	// Written by arm before the state becomes watchArmed, read by start
	// once it has claimed the watch.
	nc   net.Conn
	sc   syscall.Conn
	resp *upstream.Response
	// log, when set, is the log of the answer relayed: an agent that
	// closed its connection leaves it (AnswerLog.agentLeft), and the
	// call goes on for the agent to resume it.
	log atomic.Pointer[AnswerLog]
}

const (
	watchIdle int32 = iota
	watchArmed
	watchOn // start's goroutine peeks at the connection; stop must wake it
)

// aLongTimeAgo is a read deadline in the past: it wakes a blocked peek.
var aLongTimeAgo = time.Unix(1, 0)

func NewAgentWatch() *agentWatch {
	w := &agentWatch{ended: make(chan struct{}, 1)}
	w.timer = time.AfterFunc(time.Hour, w.start)
	w.timer.Stop()
	return w
}

// Arm starts watching nc after watchAfter, for the exchanges on resp. A
// connection that is not a socket of its own (TLS: its bytes are records,
// not requests; a stand-in made by RequestCtx.Init) is not watched.
func (w *agentWatch) Arm(nc net.Conn, resp *upstream.Response) {
	w.Gone.Store(false)
	sc, ok := nc.(syscall.Conn)
	if !ok || !canWatch {
		return
	}
	w.nc, w.sc, w.resp = nc, sc, resp
	w.state.Store(watchArmed)
	w.timer.Reset(WatchAfter)
}

// start runs on the timer's goroutine: it peeks until the agent closes its
// connection, sends more, or stop wakes it.
func (w *agentWatch) start() {
	if !w.state.CompareAndSwap(watchArmed, watchOn) {
		return // stopped first
	}
	defer func() {
		_ = recover() // a bug here must not take the process; the watch just ends
		w.ended <- struct{}{}
	}()
	if peerClosed(w.sc) {
		if l := w.log.Load(); l != nil {
			l.agentLeft()
			return
		}
		w.Gone.Store(true)
		w.resp.Interrupt()
	}
}

// Stop ends the watch, waiting for start's goroutine if it runs, and
// reports whether the agent closed its connection; the watch forgets it,
// since it goes back to the pool with its attempt. It must run before
// fasthttp reads the connection again.
func (w *agentWatch) Stop() bool {
	w.timer.Stop()
	if !w.state.CompareAndSwap(watchArmed, watchIdle) && w.state.Load() == watchOn {
		_ = w.nc.SetReadDeadline(aLongTimeAgo)
		<-w.ended
		// fasthttp's serveConn sets its own read deadline (IdleTimeout,
		// then ReadTimeout) before it reads the next request, and relies
		// on none while the handler runs or the answer is written: no
		// deadline is what it left.
		_ = w.nc.SetReadDeadline(time.Time{})
		w.state.Store(watchIdle)
	}
	w.nc, w.sc, w.resp = nil, nil, nil
	w.log.Store(nil)
	return w.Gone.Swap(false)
}
