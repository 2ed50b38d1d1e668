package exchange

import (
	crand "crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
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
// is dropped, and the answer can no longer be resumed. A fleet that
// shares answers keeps a copy for the other replicas (answershare.go).

// ownStreams numbers the answers whose events carry mcpheal's own ids,
// from a random start, so that two processes (a restart, another replica)
// do not give out the same ids.
var ownStreams atomic.Uint64

func init() {
	var b [8]byte
	_, _ = crand.Read(b[:])
	ownStreams.Store(binary.LittleEndian.Uint64(b[:]) >> 8) // room before it wraps
}

// AnswerLogs is a Server's logs of answers in flight, by key.
type AnswerLogs struct {
	Mu sync.Mutex // protects m
	M  map[string]*AnswerLog

	// FleetAnswers: a fleet's copy of the answers (answershare.go).
	FleetAnswers
}

// SharedKey returns the answer and event an agent's Last-Event-ID names,
// when answers are shared and it is one of mcpheal's own ids.
func (ls *AnswerLogs) SharedKey(lastEventID []byte) (key string, seq int, ok bool) {
	if ls.Shared == nil {
		return "", 0, false
	}
	return wire.ParseOwnID(lastEventID)
}

// Find returns the log an agent's Last-Event-ID names, and the number of
// the last event the agent got; nil unless the log is of sess and still
// kept.
func (ls *AnswerLogs) Find(sess session.ClientID, lastEventID []byte) (*AnswerLog, int) {
	key, seq, ok := wire.ParseOwnID(lastEventID)
	if !ok {
		return nil, 0
	}
	ls.Mu.Lock()
	l := ls.M[key]
	ls.Mu.Unlock()
	if l == nil || l.sess != sess {
		return nil, 0
	}
	return l, seq
}

func (ls *AnswerLogs) forget(l *AnswerLog) {
	ls.Mu.Lock()
	if ls.M[l.Key] == l {
		delete(ls.M, l.Key)
	}
	ls.Mu.Unlock()
}

// answerCall is what a log needs of the exchange that writes its answer
// (an Attempt): the upstream's id of the last event that ended, and
// ending it.
type answerCall interface {
	upstreamLastID() string
	Abandon()
}

// LogChunk is the unit an answerLog stores and charges memory_budget in;
// chunks are pooled, so that a streamed answer's log allocates nothing in
// the steady state.
const LogChunk = 64 << 10

var logChunks = sync.Pool{New: func() any { return new([LogChunk]byte) }}

// AnswerLog is what mcpheal sent an agent of one answer: its last max
// bytes (at least), in chunks, and where each of its events ended.
// Offsets are counted from the answer's first byte.
type AnswerLog struct {
	Key    string
	sess   session.ClientID
	Ls     *AnswerLogs
	Mem    *wire.Budget
	Max    int
	Window time.Duration

	Mu sync.Mutex // protects everything below
	// call is the exchange that writes the answer, until done: the
	// window's end abandons it.
	call   answerCall
	Chunks []*[LogChunk]byte
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
	Wake    chan struct{} // closed when events are added or the answer ends
	done    bool          // the answer ended: nothing more comes
	over    bool          // dropped (the budget, or forgotten): nothing can be resumed
	Left    bool          // the agent's connection dropped before the end
	expired bool          // the window passed with nobody reading
	readers int
	timer   *time.Timer
	share   *AnswerShare // the fleet's copy (answershare.go), nil if none
}

// Append records p, sent (or being sent) to the agent.
func (l *AnswerLog) Append(p []byte) {
	if len(p) == 0 {
		return
	}
	l.Mu.Lock()
	defer l.Mu.Unlock()
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
		if l.inEvent && l.size+n-l.evStart > l.Max {
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
	for len(l.Chunks) > 1 && l.size-l.base-LogChunk >= l.Max {
		l.release(l.Chunks[0])
		l.Chunks = l.Chunks[1:]
		l.base += LogChunk
	}
	for len(l.ends) > 0 && l.ends[0] < l.base {
		l.ends = l.ends[1:]
		l.skipped++
	}
	if ended {
		l.wakeLocked()
	}
	if ended && l.share != nil {
		l.share.Notify(l.skipped+len(l.ends), l.call.upstreamLastID())
	}
	l.giveUpLocked()
}

// takenOver is what happens when another replica took the answer over
// (its lease ran out while this process relayed it: Redis was slow): the
// fleet's copy is the answer now. Unless an agent reads this log, it is
// dropped (a resumption here then reads the fleet's) and the exchange
// ended: the taking replica asked the upstream for the rest itself.
func (l *AnswerLog) takenOver() {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	if l.readers > 0 || l.over {
		return
	}
	call, done := l.call, l.done
	l.dropLocked()
	if call != nil && !done {
		call.Abandon()
	}
}

// eventsBetween appends copies of the events after from up to upto that
// the log still holds whole to dst, for the fleet's copy (answershare.go),
// and returns them, the number of the first, and their size. Events that
// fell out of what is kept are left out: the fleet's readers find them
// lost, as Since does.
func (l *AnswerLog) eventsBetween(dst [][]byte, from, upto int) (_ [][]byte, first, size int) {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	// Event n ends at ends[n-skipped-1], and starts where event n-1
	// ended: the first event the log holds whole is skipped+2, or 1 when
	// nothing was ever dropped.
	first = max(from+1, l.skipped+2)
	if l.skipped == 0 && l.base == 0 {
		first = from + 1
	}
	upto = min(upto, l.skipped+len(l.ends))
	if l.over {
		return dst, first, 0
	}
	for n := first; n <= upto; n++ {
		start := 0
		if n-l.skipped-2 >= 0 {
			start = l.ends[n-l.skipped-2]
		}
		end := l.ends[n-l.skipped-1]
		ev := make([]byte, 0, end-start)
		for off := start; off < end; {
			i, within := (off-l.base)/LogChunk, (off-l.base)%LogChunk
			k := min(LogChunk-within, end-off)
			ev = append(ev, l.Chunks[i][within:within+k]...)
			off += k
		}
		dst = append(dst, ev)
		size += len(ev)
	}
	return dst, first, size
}

// store copies seg, which goes at offset l.size, into the chunks; false
// when memory_budget has no room for another chunk.
func (l *AnswerLog) store(seg []byte) bool {
	for off := l.size; len(seg) > 0; {
		i, within := (off-l.base)/LogChunk, (off-l.base)%LogChunk
		if i == len(l.Chunks) {
			if !l.Mem.Take(LogChunk) {
				return false
			}
			l.Chunks = append(l.Chunks, logChunks.Get().(*[LogChunk]byte))
		}
		n := copy(l.Chunks[i][within:], seg)
		off += n
		seg = seg[n:]
	}
	return true
}

// releaseAll gives back every chunk; what is kept starts again at off.
func (l *AnswerLog) releaseAll(off int) {
	for _, c := range l.Chunks {
		l.release(c)
	}
	l.Chunks, l.base = l.Chunks[:0], off
}

func (l *AnswerLog) release(c *[LogChunk]byte) {
	logChunks.Put(c)
	l.Mem.Give(LogChunk)
}

// isOver reports whether the log was dropped.
func (l *AnswerLog) isOver() bool {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	return l.over
}

// dropLocked gives the log up: its memory goes back, and the answer can no
// longer be resumed.
func (l *AnswerLog) dropLocked() {
	if !l.over {
		l.over = true
		if l.share != nil {
			l.share.Abandon()
		}
		l.releaseAll(l.size)
		l.Chunks, l.ends = nil, nil
		l.Ls.forget(l)
		l.wakeLocked()
	}
}

func (l *AnswerLog) wakeLocked() {
	close(l.Wake)
	l.Wake = make(chan struct{})
}

// agentLeft notes that the agent's connection to the answer dropped: with
// nobody reading, the window starts.
func (l *AnswerLog) agentLeft() {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	l.Left = true
	if l.share != nil {
		l.share.AgentLeft()
	}
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
func (l *AnswerLog) giveUpLocked() {
	if l.Left && l.readers == 0 && l.inEvent && l.size-l.evStart > l.Max {
		l.dropLocked()
	}
}

// Finish notes that the answer ended (or was given up). A log nobody may
// come back for goes at once; one whose agent left, or that an agent
// reads, stays for the window.
func (l *AnswerLog) Finish() {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	if l.done {
		return
	}
	l.done, l.call = true, nil
	l.wakeLocked()
	if l.share != nil {
		l.share.End()
	}
	switch {
	case l.readers > 0:
		// A resuming agent reads it to its end; the window runs after.
	case !l.Left || l.expired:
		l.dropLocked()
	default:
		l.armLocked()
	}
}

// armLocked starts the window: at its end, with nobody reading, a call
// still running is abandoned and a finished answer forgotten.
func (l *AnswerLog) armLocked() {
	if l.timer == nil {
		l.timer = time.AfterFunc(l.Window, l.windowEnded)
		return
	}
	l.timer.Reset(l.Window)
}

func (l *AnswerLog) windowEnded() {
	elsewhere := l.share != nil && l.share.readElsewhere() // not under l.Mu: it asks the shared store
	l.Mu.Lock()
	defer l.Mu.Unlock()
	if l.readers > 0 {
		return
	}
	if !l.done {
		if elsewhere {
			l.armLocked() // the agent reads it on another replica
			return
		}
		// Nobody came back for it: the call ends as when its agent goes
		// away without a log (nothing is sent again).
		l.expired = true
		l.call.Abandon()
		return
	}
	l.dropLocked()
}

// Attach adds a reader (an agent resuming); false when the log was dropped.
func (l *AnswerLog) Attach() bool {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	if l.over {
		return false
	}
	l.readers++
	if l.timer != nil {
		l.timer.Stop()
	}
	return true
}

func (l *AnswerLog) Detach() {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	l.readers--
	if l.readers == 0 && !l.over {
		l.Left = true // it read, and went: the window starts again
		l.armLocked()
	}
}

// Since appends to dst the whole events after event seq that the log has,
// and returns the number of the last of them, the channel that is closed
// when there may be more, and whether nothing more will come: the answer
// ended, or the events after seq are no longer kept (lost).
func (l *AnswerLog) Since(dst []byte, seq int) (_ []byte, next int, wake <-chan struct{}, end, lost bool) {
	l.Mu.Lock()
	defer l.Mu.Unlock()
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
			i, within := (off-l.base)/LogChunk, (off-l.base)%LogChunk
			n := min(LogChunk-within, to-off)
			dst = append(dst, l.Chunks[i][within:within+n]...)
			off += n
		}
		seq = last
	}
	return dst, seq, l.Wake, l.done, false
}
