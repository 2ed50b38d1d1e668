package proxy

import (
	crand "crypto/rand"
	"encoding/binary"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/session"
)

// Resuming an answer for the agent (docs/streams.md "Streams"). Every event of a
// POST's SSE answer carries an id of mcpheal's own, "m<stream>-<seq>"
// (eventRewriter.own), and while the answer streams, mcpheal keeps what it
// sent the agent in an answerLog. If the agent's connection drops before
// the answer ends, the call goes on upstream for resume_window, its events
// going to the log, and the agent's GET with Last-Event-ID gets the events
// after that id and then the rest as it comes, whether or not the server
// keeps events, across a heal in between too. A log keeps the last
// resume_buffer bytes of the answer (an agent that resumes lost what was
// in flight to it, no more), counted in memory_budget; past the budget it
// is dropped, and the answer can no longer be resumed. It is the process's own: a
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

// answerLogs is a Server's logs of answers in flight, by key.
type answerLogs struct {
	mu sync.Mutex // protects m
	m  map[string]*answerLog
}

// open starts the log of a's answer, whose events carry a.rw.own.
func (ls *answerLogs) open(a *attempt) *answerLog {
	key := "m" + strconv.FormatUint(a.rw.own, 36) // as appendOwnID writes it
	l := &answerLog{key: key, sess: a.sess.ID, ls: ls, mem: a.s.mem, max: a.s.cfg.ResumeBuffer,
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

// logChunk is the unit an answerLog stores and charges memory_budget in;
// chunks are pooled, so that a streamed answer's log allocates nothing in
// the steady state.
const logChunk = 64 << 10

var logChunks = sync.Pool{New: func() any { return new([logChunk]byte) }}

// answerLog is what mcpheal sent an agent of one answer: its last max
// bytes (at least), in chunks, and where each of its events ended.
// Offsets are counted from the answer's first byte.
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
	a      *attempt
	chunks []*[logChunk]byte
	base   int // offset of chunks[0][0]
	size   int // offset of the end of what was appended
	// ends[i] is the offset just past the blank line of event skipped+i+1
	// (an event is one or more lines ended by a blank line, as
	// eventRewriter.startLine counts them); skipped counts the events
	// whose end fell out of the kept bytes.
	ends    []int
	skipped int
	lines   sse.Lines
	inEvent bool
	evStart int           // offset where the event in progress began
	wake    chan struct{} // closed when events are added or the answer ends
	done    bool          // the answer ended: nothing more comes
	over    bool          // dropped (the budget, or forgotten): nothing can be resumed
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
	ended := false
	for pos := 0; pos < len(p); {
		n, begins, lineEnded := l.lines.Next(p[pos:])
		seg := p[pos : pos+n]
		pos += n
		blank := begins && lineEnded && sse.IsLineEnd(seg)
		if begins && !blank && !l.inEvent {
			l.inEvent, l.evStart = true, l.size
		}
		if l.inEvent && l.size+n-l.evStart > l.max {
			// The event in progress outgrew what is kept: no resume can be
			// served it whole, so none of it is copied (a 12 MB result
			// costs no 12 MB copy).
			l.releaseAll(l.size + n)
		} else if !l.store(seg) {
			l.dropLocked()
			return
		}
		l.size += n
		if blank {
			if l.inEvent {
				l.ends = append(l.ends, l.size)
				ended = true
			}
			l.inEvent = false
		}
	}
	// Keep the last max bytes: an agent that resumes lost at most what was
	// in flight to it.
	for len(l.chunks) > 1 && l.size-l.base-logChunk >= l.max {
		l.release(l.chunks[0])
		l.chunks = l.chunks[1:]
		l.base += logChunk
	}
	for len(l.ends) > 0 && l.ends[0] < l.base {
		l.ends = l.ends[1:]
		l.skipped++
	}
	if ended {
		l.wakeLocked()
	}
	l.giveUpLocked()
}

// store copies seg, which goes at offset l.size, into the chunks; false
// when memory_budget has no room for another chunk.
func (l *answerLog) store(seg []byte) bool {
	for off := l.size; len(seg) > 0; {
		i, within := (off-l.base)/logChunk, (off-l.base)%logChunk
		if i == len(l.chunks) {
			if !l.mem.take(logChunk) {
				return false
			}
			l.chunks = append(l.chunks, logChunks.Get().(*[logChunk]byte))
		}
		n := copy(l.chunks[i][within:], seg)
		off += n
		seg = seg[n:]
	}
	return true
}

// releaseAll gives back every chunk; what is kept starts again at off.
func (l *answerLog) releaseAll(off int) {
	for _, c := range l.chunks {
		l.release(c)
	}
	l.chunks, l.base = l.chunks[:0], off
}

func (l *answerLog) release(c *[logChunk]byte) {
	logChunks.Put(c)
	l.mem.give(logChunk)
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
		l.releaseAll(l.size)
		l.chunks, l.ends = nil, nil
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
		l.giveUpLocked()
	}
}

// giveUpLocked drops the log of an agent that left in the middle of an
// event the log cannot hold (one larger than resume_buffer): its resume
// would need that event whole, which nobody can serve it, so the call is
// not read on for nothing (an endless line would be read until the
// window's end).
func (l *answerLog) giveUpLocked() {
	if l.left && l.readers == 0 && l.inEvent && l.size-l.evStart > l.max {
		l.dropLocked()
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

// since appends to dst the whole events after event seq that the log has,
// and returns the number of the last of them, the channel that is closed
// when there may be more, and whether nothing more will come: the answer
// ended, or the events after seq are no longer kept (lost).
func (l *answerLog) since(dst []byte, seq int) (_ []byte, next int, wake <-chan struct{}, end, lost bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.over:
		return dst, seq, nil, true, true
	case seq < l.skipped || seq == l.skipped && (seq > 0 || l.base > 0):
		return dst, seq, nil, true, true // where event seq ended fell out of the kept bytes
	}
	last := l.skipped + len(l.ends)
	if seq < last {
		from := 0
		if seq > 0 {
			from = l.ends[seq-l.skipped-1]
		}
		to := l.ends[len(l.ends)-1]
		for off := from; off < to; {
			i, within := (off-l.base)/logChunk, (off-l.base)%logChunk
			n := min(logChunk-within, to-off)
			dst = append(dst, l.chunks[i][within:within+n]...)
			off += n
		}
		seq = last
	}
	return dst, seq, l.wake, l.done, false
}
