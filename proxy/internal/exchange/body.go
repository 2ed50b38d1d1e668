package exchange

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// sseBody is a POST's streamed SSE answer as the agent's response body.
// fasthttp writes each Read as one chunk and flushes it, so every event
// reaches the agent as it arrives, on the connection's own goroutine: no
// body-writer goroutine and pipe per answer (SetBodyStreamWriter). From
// SetBodyStream on, the body owns the stream, its response and its attempt;
// fasthttp calls Close once, when the answer is written or the agent has
// gone, and Close releases them.
type sseBody answerStream

// errStreamPanic ends an answer whose relay panicked.
var errStreamPanic = errors.New("mcpheal: SSE relay panicked")

// Read returns the next rewritten events of the upstream's stream, reading
// upstream only when what it read before has been handed out.
func (b *sseBody) Read(p []byte) (n int, err error) {
	st := (*answerStream)(b)
	defer func() {
		if v := recover(); v != nil {
			st.S.Count.Panics.Add(1)
			st.S.Log.Error().Interface("panic", v).Msg("SSE relay panicked")
			n, err = 0, errStreamPanic
		}
	}()
	for st.outPos == len(st.Out) {
		st.handedOn()
		if st.eof {
			return 0, io.EOF
		}
		// p is fasthttp's copy buffer: read into it; what passes through
		// unchanged stays where it is, without a copy.
		n, rerr := (*upstreamStream)(st).Read(p)
		res, aliased := st.relay(st.Out[:0], p[:n], rerr)
		if st.log != nil {
			st.log.Append(res)
		}
		if aliased {
			if len(res) > 0 {
				st.S.Count.BytesOut.Add(uint64(len(res)))
				return len(res), nil
			}
			continue
		}
		st.Out, st.outPos = res, 0
	}
	n = copy(p, st.Out[st.outPos:])
	st.outPos += n
	st.S.Count.BytesOut.Add(uint64(n))
	return n, nil
}

// SupportsBodyWriteTo tells fasthttp to write the answer with WriteTo.
func (b *sseBody) SupportsBodyWriteTo() bool { return true }

// WriteTo relays the upstream's stream to w, which fasthttp turns into one
// flushed chunk per Write: one chunk per upstream read of up to readBuf
// bytes, so that what arrives together goes out together, and a large
// answer costs few system calls. What passes through unchanged is written
// from the read buffer itself.
func (b *sseBody) WriteTo(w io.Writer) (total int64, err error) {
	st := (*answerStream)(b)
	defer func() {
		if v := recover(); v != nil {
			st.S.Count.Panics.Add(1)
			st.S.Log.Error().Interface("panic", v).Msg("SSE relay panicked")
			err = errStreamPanic
		}
	}()
	iw := newIdleWriter(st, w)
	defer iw.stop()
	write := func(p []byte) error {
		if len(p) == 0 {
			return nil
		}
		// The agent's side is at a line boundary unless a line passes
		// through, part of it written (relay.go).
		n, err := iw.write(p, st.Rw.Mode != wire.LinePassing)
		total += int64(n)
		st.S.Count.BytesOut.Add(uint64(n))
		return err
	}
	if err = write(st.Out[st.outPos:]); err != nil {
		return total, b.left(err)
	}
	st.outPos = len(st.Out)
	buf := st.readBuf()
	for !st.eof {
		if err = write(b.pull(buf)); err != nil {
			return total, b.left(err)
		}
	}
	return total, nil
}

// pull reads the upstream's stream once into buf and returns what of it
// goes to the agent, kept in the answer's log if it has one; valid until
// the next pull.
func (b *sseBody) pull(buf []byte) []byte {
	st := (*answerStream)(b)
	st.handedOn()
	n, rerr := (*upstreamStream)(st).Read(buf)
	res, aliased := st.relay(st.Out[:0], buf[:n], rerr)
	if !aliased {
		st.Out = res[:0] // keep a grown buffer
	}
	if st.log != nil {
		st.log.Append(res)
	}
	return res
}

// left is what WriteTo does when the agent's connection dropped (err): an
// answer its agent may resume goes on for it, read by drain into the log
// (answerlog.go), unless it has ended or can no longer be resumed.
func (b *sseBody) left(err error) error {
	st := (*answerStream)(b)
	if st.log == nil || st.eof || st.log.isOver() || !st.S.Bg.Add(1) {
		return err
	}
	st.log.agentLeft()
	st.draining = true // Close starts drain: fasthttp is done with the attempt then
	// The message's members are views into the agent's request, which
	// fasthttp reuses once the answer is done: drain keeps copies.
	st.Msg.ID, st.Msg.Method, st.Msg.Tool = strings.Clone(st.Msg.ID), strings.Clone(st.Msg.Method), strings.Clone(st.Msg.Tool)
	return err
}

// drain reads the rest of an answer whose agent's connection dropped into
// its log, until the answer ends, the log is dropped, or the window passes
// with nobody reading (answerLog.windowEnded abandons the exchange), then
// releases the attempt.
func (b *sseBody) drain() {
	st := (*answerStream)(b)
	defer st.S.Bg.Done()
	quit, shut := make(chan struct{}), make(chan struct{})
	go func() { // shutdown ends the call too
		defer close(shut)
		select {
		case <-st.S.Done:
			if st.log.share != nil {
				// A fleet's answer is handed over, not ended: its lease
				// runs out, and the replica its agent reaches takes it
				// over (answershare.go).
				st.log.share.Release()
			}
			st.Abandon()
		case <-quit:
		}
	}()
	defer func() {
		if v := recover(); v != nil {
			st.S.Count.Panics.Add(1)
			st.S.Log.Error().Interface("panic", v).Msg("answer drain panicked")
		}
		close(quit)
		<-shut // nothing touches the attempt once it is released
		st.log.Finish()
		st.owner.Release()
	}()
	buf := st.readBuf()
	for !st.eof && !st.log.isOver() {
		b.pull(buf)
	}
}

// Close releases the upstream response (closing its stream if the agent
// left early) and the attempt.
func (b *sseBody) Close() error {
	st := (*answerStream)(b)
	if st.draining {
		// The agent is gone: its watch ends here, or it would cut the
		// drain's upstream read, and leave its flag to the attempt's next
		// user.
		st.Unwatch()
		go b.drain() // it owns the attempt now
		return nil
	}
	st.Unwatch() // first: an agent found gone after the end is not news to the log
	if st.log != nil {
		st.log.Finish()
	}
	wire.ArmWrite(st.conn, st.S.Cfg.WriteTimeout) // the chunked answer's end is written after Close
	st.owner.Release()
	return nil
}

// jsonBody is a POST's JSON answer as the agent's response body, written
// from the upstream's buffer. From SetBodyStream on, the body owns the
// stream, its response and its attempt; fasthttp calls Close once, when the
// answer is written or the agent has gone, and Close releases them (and
// with the response its memory budget charge).
type jsonBody answerStream

// Read copies the rest of the body to p (fasthttp uses WriteTo).
func (b *jsonBody) Read(p []byte) (int, error) {
	st := (*answerStream)(b)
	rest := st.Resp.Body()[st.outPos:]
	if len(rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, rest)
	st.outPos += n
	return n, nil
}

// SupportsBodyWriteTo tells fasthttp to write the answer with WriteTo.
func (b *jsonBody) SupportsBodyWriteTo() bool { return true }

// WriteTo writes the body in one Write.
func (b *jsonBody) WriteTo(w io.Writer) (int64, error) {
	st := (*answerStream)(b)
	n, err := w.Write(st.Resp.Body()[st.outPos:])
	st.outPos += n
	return int64(n), err
}

// Close releases the upstream response and the attempt.
func (b *jsonBody) Close() error {
	st := (*answerStream)(b)
	st.Unwatch()
	st.owner.Release()
	return nil
}

// watchForLog keeps watching the agent's connection while an answer its
// agent may resume is relayed, for its log: a balancer that closes its
// connection to mcpheal when the agent's drops (nginx does) leaves writes
// that still succeed for a while, and the answer must not be taken for
// delivered. An answer the fleet shares is watched at once (its agent may
// come back on another replica, which finds nothing if the answer is
// taken for delivered and deleted); others from watchAfter on, as before.
func (st *answerStream) watchForLog() {
	if st.Watch == nil {
		return
	}
	st.Watch.log.Store(st.log)
	if st.log.share != nil && st.Watch.state.Load() == watchArmed {
		st.Watch.timer.Reset(0)
	}
}

// open starts the log of st's answer, whose events carry st.Rw.Own.
func (ls *AnswerLogs) open(st *answerStream) *AnswerLog {
	key := "m" + strconv.FormatUint(st.Rw.Own, 36) // as appendOwnID writes it
	l := &AnswerLog{Key: key, sess: st.Sess.ID, Ls: ls, Mem: st.S.Mem, Max: st.S.Cfg.ResumeBuffer,
		Window: st.S.Cfg.ResumeWindow, call: st, Wake: make(chan struct{})}
	if st.Sess != nil {
		l.share = ls.share(l, st)
	}
	ls.Mu.Lock()
	if ls.M == nil {
		ls.M = make(map[string]*AnswerLog)
	}
	ls.M[key] = l
	ls.Mu.Unlock()
	return l
}

// share starts sharing the answer logged in l, nil when answers are not
// shared (or not now).
func (ls *AnswerLogs) share(l *AnswerLog, st *answerStream) *AnswerShare {
	if ls.Shared == nil || time.Now().UnixNano() < ls.holdOff.Load() {
		return nil
	}
	sh := ls.newShare(l.Key)
	sh.log, sh.sess, sh.request = l, st.Sess.ID, strings.Clone(st.Msg.IdOrNull())
	sh.upstream, sh.version = st.up, st.Sess.Recipe.ProtocolVersion
	return sh
}
