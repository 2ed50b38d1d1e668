package proxy

import (
	"bufio"
	crand "crypto/rand"
	"encoding/binary"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/session"
)

// Resuming an answer for the agent (README "Streams"). Every event of a
// POST's SSE answer carries an id of mcpheal's own, "m<stream>-<seq>"
// (eventRewriter.own), and while the answer streams, mcpheal keeps what it
// sent the agent in an answerLog. If the agent's connection drops before
// the answer ends, the call goes on upstream for resume_window, its events
// going to the log, and the agent's GET with Last-Event-ID gets the events
// after that id and then the rest as it comes, whether or not the server
// keeps events, across a heal in between too. A log is bounded by
// resume_buffer and counted in memory_budget; past either it is dropped,
// and the answer can no longer be resumed. It is the process's own: a
// resume that reaches another replica finds nothing and gets an empty
// stream, as a resume of a dead session's stream does.

// ownStreams numbers the answers whose events carry mcpheal's own ids,
// from a random start, so that two processes (a restart, another replica)
// do not give out the same ids.
var ownStreams atomic.Uint64

func init() {
	var b [8]byte
	_, _ = crand.Read(b[:])
	ownStreams.Store(binary.LittleEndian.Uint64(b[:]) >> 8) // room before it wraps
}

// appendOwnID appends mcpheal's id of event seq of answer own.
func appendOwnID(out []byte, own, seq uint64) []byte {
	out = append(out, 'm')
	out = strconv.AppendUint(out, own, 36)
	out = append(out, '-')
	return strconv.AppendUint(out, seq, 10)
}

// parseOwnID splits a Last-Event-ID of mcpheal's own into the answer's key
// ("m<own>") and the event's number; ok is false for any other id.
func parseOwnID(id []byte) (key string, seq int, ok bool) {
	s := string(id)
	if !strings.HasPrefix(s, "m") {
		return "", 0, false
	}
	key, n, found := strings.Cut(s, "-")
	if !found {
		return "", 0, false
	}
	seq, err := strconv.Atoi(n)
	if err != nil || seq < 0 {
		return "", 0, false
	}
	return key, seq, true
}

// answerLogs is a Server's logs of answers in flight, by key.
type answerLogs struct {
	mu sync.Mutex // protects m
	m  map[string]*answerLog
}

// open starts the log of a's answer, whose events carry a.rw.own.
func (ls *answerLogs) open(a *attempt) *answerLog {
	key := string(appendOwnID(nil, a.rw.own, 0))
	key = key[:len(key)-2] // "m<own>"
	l := &answerLog{key: key, sess: a.sess.ID, ls: ls, mem: &a.s.mem, max: a.s.cfg.ResumeBuffer,
		window: a.s.cfg.ResumeWindow, a: a, wake: make(chan struct{})}
	ls.mu.Lock()
	if ls.m == nil {
		ls.m = make(map[string]*answerLog)
	}
	ls.m[key] = l
	ls.mu.Unlock()
	return l
}

// find returns the log an agent's Last-Event-ID names, and the number of
// the last event the agent got; nil unless the log is of sess and still
// kept.
func (ls *answerLogs) find(sess session.ClientID, lastEventID []byte) (*answerLog, int) {
	key, seq, ok := parseOwnID(lastEventID)
	if !ok {
		return nil, 0
	}
	ls.mu.Lock()
	l := ls.m[key]
	ls.mu.Unlock()
	if l == nil || l.sess != sess {
		return nil, 0
	}
	return l, seq
}

func (ls *answerLogs) forget(l *answerLog) {
	ls.mu.Lock()
	if ls.m[l.key] == l {
		delete(ls.m, l.key)
	}
	ls.mu.Unlock()
}

// answerLog is what mcpheal sent an agent of one answer: its events, each
// ending at ends[i], and whether more may come.
type answerLog struct {
	key    string
	sess   session.ClientID
	ls     *answerLogs
	mem    *budget
	max    int
	window time.Duration

	mu sync.Mutex // protects everything below
	// a is the attempt that writes the answer, until done: the window's
	// end abandons its exchange.
	a       *attempt
	buf     []byte
	lines   sse.Lines
	ends    []int
	charged int64
	wake    chan struct{} // closed when events are added or the answer ends
	done    bool          // the answer ended: nothing more comes
	over    bool          // past max or the budget: nothing is kept, nothing can be resumed
	left    bool          // the agent's connection dropped before the end
	expired bool          // the window passed with nobody reading
	readers int
	timer   *time.Timer
}

// append records p, sent (or being sent) to the agent.
func (l *answerLog) append(p []byte) {
	if len(p) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.over || l.done {
		return
	}
	if len(l.buf)+len(p) > l.max || !l.mem.take(int64(len(p))) {
		l.dropLocked()
		return
	}
	l.charged += int64(len(p))
	start := len(l.buf)
	l.buf = append(l.buf, p...)
	ended := false
	for pos := 0; pos < len(p); {
		n, begins, lineEnded := l.lines.Next(p[pos:])
		if begins && lineEnded && sse.IsLineEnd(p[pos:pos+n]) {
			l.ends = append(l.ends, start+pos+n)
			ended = true
		}
		pos += n
	}
	if ended {
		l.wakeLocked()
	}
}

// isOver reports whether the log was dropped.
func (l *answerLog) isOver() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.over
}

// dropLocked gives the log up: its memory goes back, and the answer can no
// longer be resumed.
func (l *answerLog) dropLocked() {
	if !l.over {
		l.over = true
		l.buf, l.ends = nil, nil
		l.mem.give(l.charged)
		l.charged = 0
		l.ls.forget(l)
		l.wakeLocked()
	}
}

func (l *answerLog) wakeLocked() {
	close(l.wake)
	l.wake = make(chan struct{})
}

// agentLeft notes that the agent's connection to the answer dropped: with
// nobody reading, the window starts.
func (l *answerLog) agentLeft() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.left = true
	if l.readers == 0 {
		l.armLocked()
	}
}

// finish notes that the answer ended (or was given up). A log nobody may
// come back for goes at once; one whose agent left, or that an agent
// reads, stays for the window.
func (l *answerLog) finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	l.done, l.a = true, nil
	l.wakeLocked()
	switch {
	case l.readers > 0:
		// A resuming agent reads it to its end; the window runs after.
	case !l.left || l.expired:
		l.dropLocked()
	default:
		l.armLocked()
	}
}

// armLocked starts the window: at its end, with nobody reading, a call
// still running is abandoned and a finished answer forgotten.
func (l *answerLog) armLocked() {
	if l.timer == nil {
		l.timer = time.AfterFunc(l.window, l.windowEnded)
		return
	}
	l.timer.Reset(l.window)
}

func (l *answerLog) windowEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.readers > 0 {
		return
	}
	if !l.done {
		// Nobody came back for it: the call ends as when its agent goes
		// away without a log (nothing is sent again).
		l.expired = true
		l.a.abandon()
		return
	}
	l.dropLocked()
}

// attach adds a reader (an agent resuming); false when the log was dropped.
func (l *answerLog) attach() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.over {
		return false
	}
	l.readers++
	if l.timer != nil {
		l.timer.Stop()
	}
	return true
}

func (l *answerLog) detach() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.readers--
	if l.readers == 0 && !l.over {
		l.left = true // it read, and went: the window starts again
		l.armLocked()
	}
}

// since returns the whole events after event seq that the log has, the
// channel that is closed when there may be more, and whether the answer
// has ended (nothing more will come).
func (l *answerLog) since(seq int) (evs []byte, next int, wake <-chan struct{}, end bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.over {
		return nil, seq, nil, true
	}
	if seq < len(l.ends) {
		from := 0
		if seq > 0 {
			from = l.ends[seq-1]
		}
		evs, seq = l.buf[from:l.ends[len(l.ends)-1]], len(l.ends)
	}
	return evs, seq, l.wake, l.done
}

// serveLog answers an agent's GET whose Last-Event-ID names event seq of
// the answer logged in l: the events after it, then the rest as it comes,
// with keepalive comments while none does, until the answer ends.
func (s *Server) serveLog(ctx *fasthttp.RequestCtx, r *request, l *answerLog, seq int) {
	s.count.request(&r.msg, classify.OK)
	if !l.attach() {
		s.count.agentResumes[outcomeFailed].Add(1)
		endResumption(ctx)
		return
	}
	s.count.agentResumes[outcomeOK].Add(1)
	ctx.Response.Header.SetContentTypeBytes(mimeEventStream)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	ctx.Response.Header.SetBytesK(hdrSessionID, string(r.sess.ID))
	conn := ctx.Conn()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer l.detach()
		t := time.NewTicker(s.cfg.StreamKeepalive)
		defer t.Stop()
		out := agentStream{s: s, w: w, conn: conn}
		for {
			evs, next, wake, end := l.since(seq)
			if len(evs) > 0 && !out.write(evs) {
				return
			}
			if seq = next; end {
				return
			}
			select {
			case <-wake:
			case <-t.C:
				if !out.write(keepaliveComment) {
					return
				}
			case <-s.done:
				return
			}
		}
	})
}
