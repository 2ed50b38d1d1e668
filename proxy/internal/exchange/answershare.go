package exchange

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/rs/zerolog"
)

// Answers a fleet shares (docs/streams.md "Across replicas"). With a shared
// session store that keeps answers (session_store: redis), the log of an
// answer an agent may resume is written there too, event by event, as it
// streams: an agent's GET with Last-Event-ID that reaches another replica
// is served from it (route/stream's ServeShared), and when the replica
// relaying the answer is lost, the one the agent reaches takes the
// upstream exchange over with the server's last event id.
//
// Nothing of it runs on the agent's path: the relay only tells the
// answer's AnswerShare how far its local log goes (Notify), and a
// goroutine of the share's copies the new events out of the local log and
// writes them, a batch at a time, while the relay goes on; the copies are
// counted in memory_budget while they are written. A write that fails or
// is late (Redis slow or down) ends
// the sharing of that answer, which stays in the local log as on a lone
// process, and new answers are not shared for shareHoldOff; a Redis that
// comes back is used again after that. An answer whose agent got all of
// it before shareLinger passed is never written at all: the most common
// streamed answer costs Redis nothing.

const (
	// shareLinger is how long an answer's first events wait before they
	// are written, in case the answer ends with its agent first.
	shareLinger = 20 * time.Millisecond
	// ShareLease is how long an answer's owner holds it without writing
	// (a lost replica's answer is taken over after it), renewed every
	// shareRenew while the answer runs.
	ShareLease = 5 * time.Second
	shareRenew = time.Second
	// shareTimeout bounds each write; past it the answer is not shared.
	shareTimeout = 2 * time.Second
	// shareHoldOff is how long no new answer is shared after a write
	// failed.
	shareHoldOff = 5 * time.Second
)

// FleetAnswers is a process's part in a fleet's answers: Shared, when not
// nil, keeps them, Owner naming this process there; holdOff is when (unix
// ns) answers are shared again after a failed write.
type FleetAnswers struct {
	Shared  session.Answers
	Owner   string
	holdOff atomic.Int64
	// What the writes use of the ground (NewEnv).
	cfg   *conf.Config
	log   *zerolog.Logger
	count *obs.Counters
	mem   *wire.Budget
	bg    *wire.BgGroup
	done  <-chan struct{}
}

// Share has the answers agents may resume kept for the fleet too: shared
// keeps them, owner names this process there. The writes stand on the
// ground of the Env the answers were given to (NewEnv).
func (fa *FleetAnswers) Share(shared session.Answers, owner string) {
	fa.Shared, fa.Owner = shared, owner
}

// SessionDigest is how the shared log names an answer's agent session.
func SessionDigest(id session.ClientID) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:16])
}

// Adopt shares an answer this process took over (route/stream): its log
// exists, and its next event is numbered next.
func (ls *FleetAnswers) Adopt(key string, next int) *AnswerShare {
	sh := ls.newShare(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.avail, sh.written = next-1, next-1
	sh.opened, sh.left = true, true // a taken-over answer is written in full
	sh.armRenewLocked()
	return sh
}

func (ls *FleetAnswers) newShare(key string) *AnswerShare {
	return &AnswerShare{ls: ls, key: key, w: session.AnswerWrite{Owner: ls.Owner,
		Max: ls.cfg.ResumeBuffer, Lease: ShareLease, Window: ls.cfg.ResumeWindow}}
}

// answerSource is the local log an answer's events are read from (an
// AnswerLog).
type answerSource interface {
	eventsBetween(dst [][]byte, from, upto int) (_ [][]byte, first, size int)
	takenOver()
}

// AnswerShare writes one answer's events to the shared log: those of its
// local log, read from it when they are written (the relay copies
// nothing for it), or those a route adds (an answer taken over).
type AnswerShare struct {
	ls  *FleetAnswers
	key string
	log answerSource // where the events are read; nil: Add gives them
	// What the first write starts the shared log with.
	sess     session.ClientID
	request  string
	upstream session.UpstreamID
	version  string

	mu       sync.Mutex // protects everything below
	pending  [][]byte   // events added, to write (log nil)
	bytes    int        // their size, counted in memory_budget
	avail    int        // the number of the last event there is
	written  int        // the number of the last event written
	upLast   string     // the upstream's id of event avail
	done     bool       // the answer ended: the last write says so
	left     bool       // its agent left: it is written in full, and kept
	due      bool       // the linger passed: the first write may go
	renew    bool       // the lease is due: write, with or without events
	opened   bool       // written at least once
	lost     bool       // another process took it over: its copy is not this one's to drop
	released bool       // a taken-over answer let go: written until nothing waits, then closed
	running  bool       // a writer goroutine runs
	closed   bool       // nothing more is written: ended, dropped or given up
	timer    *time.Timer
	w        session.AnswerWrite
}

// Notify says that the local log holds the answer's events up to number
// last, the upstream's id of which is upLast.
func (sh *AnswerShare) Notify(last int, upLast string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed || sh.done || sh.stoppingLocked() {
		return
	}
	sh.avail = last
	if upLast != "" {
		sh.upLast = upLast
	}
	sh.scheduleLocked()
}

// Add hands events (whole, as the agent gets them; copies the share
// keeps) and the upstream's last event id over to be written.
func (sh *AnswerShare) Add(events [][]byte, upLast string) {
	n := 0
	for _, ev := range events {
		n += len(ev)
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed || sh.done || sh.stoppingLocked() {
		return
	}
	if !sh.ls.mem.Take(int64(n)) {
		sh.failLocked("memory_budget has no room for the events waiting to be written")
		return
	}
	sh.pending = append(sh.pending, events...)
	sh.bytes += n
	sh.avail += len(events)
	if upLast != "" {
		sh.upLast = upLast
	}
	sh.scheduleLocked()
}

// scheduleLocked has what is new written: now, once the log was opened or
// the agent left, else after shareLinger.
func (sh *AnswerShare) scheduleLocked() {
	switch {
	case sh.opened || sh.left:
		sh.kickLocked()
	case sh.timer == nil:
		sh.timer = time.AfterFunc(shareLinger, func() {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			sh.due = true
			sh.kickLocked()
		})
	}
}

// AgentLeft writes what waits at once: the agent may come back on
// another replica.
func (sh *AnswerShare) AgentLeft() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.left = true
	sh.kickLocked()
}

// End notes that the answer ended. If its agent left, the end is written,
// for the agent to read on whichever replica it comes back to; else the
// agent got all of it, and the log is dropped (or was never written).
func (sh *AnswerShare) End() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.done || sh.stoppingLocked() {
		return
	}
	sh.done = true
	if sh.left && !sh.closed {
		sh.kickLocked()
		return
	}
	sh.closeLocked()
	sh.dropLocked()
}

// Abandon ends the sharing of an answer whose local log was dropped: its
// copy goes too (a reader finds it gone).
func (sh *AnswerShare) Abandon() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return
	}
	sh.closeLocked()
	sh.dropLocked()
}

// Release stops sharing an answer without ending it, once what waits is
// written (a taken-over answer whose agent went; any answer when mcpheal
// stops): its lease runs out, and the next resumption takes it over.
func (sh *AnswerShare) Release() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.released = true
	if sh.timer != nil {
		sh.timer.Stop()
	}
	if sh.avail == sh.written && !sh.running {
		sh.closeLocked()
		return
	}
	sh.kickLocked()
}

// stoppingLocked reports whether the answer was let go (Release), or
// mcpheal stops: then what its relay makes of the end (mcpheal's own
// error for a cut stream) is not the answer's, and is not written; the
// lease runs out, and the replica the agent reaches takes it over.
func (sh *AnswerShare) stoppingLocked() bool {
	if !sh.released {
		select {
		case <-sh.ls.done:
			sh.released = true
			if sh.timer != nil {
				sh.timer.Stop()
			}
		default:
		}
	}
	return sh.released
}

// Next is the number the next event added gets.
func (sh *AnswerShare) Next() int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.avail + 1
}

// dropLocked deletes the shared copy, if one was written and is still
// this process's (one whose first write is in flight is deleted when it
// lands).
func (sh *AnswerShare) dropLocked() {
	if sh.opened && !sh.lost && !sh.released && sh.ls.bg.Add(1) {
		go sh.drop()
	}
}

func (sh *AnswerShare) drop() {
	defer sh.ls.bg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), shareTimeout)
	defer cancel()
	_ = sh.ls.Shared.DropAnswer(ctx, sh.key, sh.ls.Owner)
}

// kickLocked starts the writer, unless it runs (it will see what waits).
func (sh *AnswerShare) kickLocked() {
	if sh.running || sh.closed || !sh.ls.bg.Add(1) {
		return
	}
	sh.running = true
	go sh.write()
}

// write writes what waits, a batch at a time, until nothing does.
func (sh *AnswerShare) write() {
	defer sh.ls.bg.Done()
	mem := sh.ls.mem
	for {
		sh.mu.Lock()
		if sh.closed || !sh.opened && !sh.due && !sh.left ||
			sh.opened && sh.avail == sh.written && !sh.renew && !sh.done {
			if sh.released {
				sh.closeLocked()
			}
			sh.running = false
			sh.mu.Unlock()
			return
		}
		w := &sh.w
		w.Open = nil
		if !sh.opened {
			w.Open = &session.AnswerInfo{Session: SessionDigest(sh.sess), Request: sh.request, Upstream: sh.upstream,
				Version: sh.version, Owner: sh.ls.Owner}
		}
		from, upto := sh.written, sh.avail
		w.Events, w.First, w.Last, w.UpLastID, w.Done = sh.pending, from+1, upto, sh.upLast, sh.done
		bytes := sh.bytes
		sh.pending, sh.bytes, sh.renew = nil, 0, false
		sh.mu.Unlock()

		if sh.log != nil && upto > from {
			// Copied from the local log now, off the relay's path; held
			// (and counted) only for the write.
			w.Events, w.First, bytes = sh.log.eventsBetween(w.Events[:0], from, upto)
			if !mem.Take(int64(bytes)) {
				w.Events = nil
				sh.mu.Lock()
				sh.failLocked("memory_budget has no room for the events being written")
				sh.mu.Unlock()
				continue
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), shareTimeout)
		ok, err := sh.ls.Shared.WriteAnswer(ctx, sh.key, w)
		cancel()
		mem.Give(int64(bytes))
		w.Events = nil
		sh.mu.Lock()
		lost := false
		switch {
		case err != nil:
			sh.ls.holdOff.Store(time.Now().Add(shareHoldOff).UnixNano())
			sh.failLocked("the shared store failed: " + err.Error())
		case !ok:
			sh.lost, lost = true, true
			sh.failLocked("another replica took the answer over")
		default:
			sh.written = upto
			if !sh.opened {
				sh.ls.count.SharedAnswers[obs.SharedWritten].Add(1)
				sh.opened = true
				if !w.Done && !sh.closed && !sh.released {
					sh.armRenewLocked()
				}
			}
			switch {
			case w.Done:
				sh.closeLocked() // written in full
			case sh.closed && !sh.released:
				sh.dropLocked() // it ended, or was given up, while the write was in flight
			}
		}
		sh.mu.Unlock()
		if lost && sh.log != nil {
			sh.log.takenOver()
		}
	}
}

// armRenewLocked renews the lease every shareRenew while the answer runs.
func (sh *AnswerShare) armRenewLocked() {
	if sh.timer != nil {
		sh.timer.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(shareRenew, func() {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if sh.closed || sh.released || sh.timer != t {
			return
		}
		sh.renew = true
		sh.kickLocked()
		t.Reset(shareRenew)
	})
	sh.timer = t
}

// failLocked ends the sharing of the answer: it goes on in the local log.
func (sh *AnswerShare) failLocked(why string) {
	if sh.closed {
		return
	}
	sh.closeLocked()
	sh.dropLocked() // a copy that is not the whole answer misleads a replica that takes it over
	sh.ls.count.SharedAnswers[obs.SharedFallback].Add(1)
	sh.ls.log.Warn().Str("answer", sh.key).Str("why", why).
		Msg("answer no longer written to the shared store: it can be resumed on this replica only")
}

// closeLocked stops everything: nothing more is written.
func (sh *AnswerShare) closeLocked() {
	sh.closed = true
	if sh.timer != nil {
		sh.timer.Stop()
	}
	sh.releaseLocked()
}

func (sh *AnswerShare) releaseLocked() {
	sh.ls.mem.Give(int64(sh.bytes))
	sh.pending, sh.bytes = nil, 0
}

// readElsewhere reports whether an agent reads the answer on another
// replica (route/stream's ServeShared marks it as it follows).
func (sh *AnswerShare) readElsewhere() bool {
	sh.mu.Lock()
	opened := sh.opened && !sh.closed
	sh.mu.Unlock()
	if !opened {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), shareTimeout)
	defer cancel()
	r, err := sh.ls.Shared.ReadAnswer(ctx, sh.key, math.MaxInt32, 0, false)
	return err == nil && r.Read
}
