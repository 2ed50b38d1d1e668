package stream

import (
	"bufio"
	"context"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// Resuming an answer the fleet keeps (docs/streams.md "Across replicas").
// An agent's GET whose Last-Event-ID is mcpheal's own but names no answer
// this process keeps is served from the shared log (exchange's
// answershare.go writes it): the events after that id, then the rest as
// its owner writes them, with keepalive comments in between, until the
// answer ends. Only an agent of the session that made the answer reads it;
// the guard has checked its credential against the session.
//
// When the owner's lease runs out before the answer ends (the replica
// relaying it was lost), this process takes the answer over: it asks the
// upstream for the rest with GET and the server's last event id, which the
// log keeps, on the upstream session the answer streamed on, under the
// agent's credential; the events go to the agent and to the log, numbered
// on. Where the server gave no event ids, or cannot resume, the agent gets
// mcpheal's -32011: the request may have run, and it is never sent again.

const (
	// sharedFirstWait is how long a resumption waits for an answer the
	// shared store does not hold yet: its first write may be on its way
	// (the relaying replica writes at once when it finds its agent gone).
	sharedFirstWait = 250 * time.Millisecond
	// sharedFollow bounds each wait for the owner's next events: its
	// lease is looked at in between.
	sharedFollow = 2 * time.Second
	// takeTries bounds the upstream streams a taken-over answer is read
	// from that end before its response.
	takeTries = 3
)

// ServeShared answers an agent's GET whose Last-Event-ID names event seq
// of answer key, from the fleet's log.
func (sr *Route) ServeShared(ctx *fasthttp.RequestCtx, r *exchange.Request, key string, seq int) {
	s := sr.Env
	rctx, cancel := context.WithTimeout(context.Background(), sharedFirstWait+s.Cfg.StoreTimeout)
	// Not marked read (reader false) until the session is known to be
	// the answer's: another session's agent must not keep it going.
	rd, err := sr.Answers.Shared.ReadAnswer(rctx, key, seq, sharedFirstWait, false)
	cancel()
	if err != nil || !rd.Found || rd.Info.Session != exchange.SessionDigest(r.Sess.ID) {
		s.Count.SharedAnswers[obs.SharedMissing].Add(1)
		s.Count.AgentResumes[obs.OutcomeFailed].Add(1)
		s.Log.Debug().Str(obs.LogSession, r.Sess.ID.Short()).Str("answer", key).AnErr("store", err).
			Msg("agent resumed an answer neither this replica nor the shared store keeps; its stream is empty")
		s.Writer().EndResumption(ctx, &r.Msg)
		return
	}
	s.Count.SharedAnswers[obs.SharedServed].Add(1)
	s.Count.AgentResumes[obs.OutcomeOK].Add(1)
	f := &follower{s: s, answers: sr.Answers, up: sr.Up, key: key, sess: r.Sess.ID, hdr: new(fasthttp.RequestHeader), conn: ctx.Conn()}
	r.Hdr.CopyTo(f.hdr)
	wire.StripRequestHeader(f.hdr, sr.Up.RequestDrops())
	sr.Up.SetOperatorHeaders(f.hdr)
	s.Writer().Stream(ctx, &r.Msg, r.Sess, classify.OK, func(w *bufio.Writer) {
		f.out = exchange.AgentStream{S: s, W: w, Conn: f.conn}
		f.follow(rd, seq)
	})
}

// follower serves one agent an answer from the fleet's log.
type follower struct {
	s       *exchange.Env
	answers *exchange.AnswerLogs
	up      Upstream
	key     string
	sess    session.ClientID
	hdr     *fasthttp.RequestHeader // the agent's, for the upstream should it take the answer over
	conn    net.Conn
	out     exchange.AgentStream
	seq     int // the last event the agent has
}

// follow writes the events after seq, from rd on, until the answer ends,
// the agent goes, or this process takes the answer over.
func (f *follower) follow(rd session.AnswerRead, seq int) {
	s := f.s
	f.seq = seq
	quiet := time.Now()
	for {
		if rd.Lost {
			s.Log.Warn().Str(obs.LogSession, f.sess.Short()).Int("resume_buffer", s.Cfg.ResumeBuffer).
				Msg("agent resumed an answer from further back than the fleet kept; its stream ends")
			return
		}
		if !f.write(rd.Events) {
			return // the agent went (the owner goes on for its next resumption), or the budget is spent
		}
		if len(rd.Events) > 0 {
			quiet = time.Now()
		}
		f.seq = max(f.seq, rd.Last)
		switch {
		case rd.Done:
			return
		case !rd.OwnerLive && f.take():
			f.takeOver(rd)
			return
		}
		if time.Since(quiet) >= s.Cfg.StreamKeepalive {
			if !f.out.Write(exchange.KeepaliveComment) {
				return
			}
			quiet = time.Now()
		}
		select {
		case <-s.Done:
			return
		default:
		}
		wait := min(s.Cfg.StreamKeepalive, sharedFollow)
		ctx, cancel := context.WithTimeout(context.Background(), wait+s.Cfg.StoreTimeout)
		var err error
		rd, err = f.answers.Shared.ReadAnswer(ctx, f.key, f.seq, wait, true)
		cancel()
		if err != nil || !rd.Found {
			// The agent's SDK resumes again, wherever that lands; the
			// owner keeps the answer meanwhile.
			s.Log.Warn().Str(obs.LogSession, f.sess.Short()).AnErr("store", err).Bool("found", rd.Found).
				Msg("shared answer log unreadable while an agent followed it; its stream ends")
			return
		}
	}
}

// write writes events read from the shared log to the agent, counted in
// memory_budget while they are held; false when the agent went, or the
// budget has no room for them (the stream ends: its SDK resumes again,
// from the last event it got).
func (f *follower) write(events [][]byte) bool {
	n := 0
	for _, ev := range events {
		n += len(ev)
	}
	if !f.s.Mem.Take(int64(n)) {
		f.s.Log.Warn().Str(obs.LogSession, f.sess.Short()).Int("bytes", n).
			Msg("events read from the shared answer log would pass memory_budget; the agent's stream ends")
		return false
	}
	defer f.s.Mem.Give(int64(n))
	for _, ev := range events {
		if !f.out.Write(ev) {
			return false
		}
	}
	return true
}

// take makes this process the answer's owner; false when another process
// did first (or the store failed: the answer is followed on).
func (f *follower) take() bool {
	ctx, cancel := context.WithTimeout(context.Background(), f.s.Cfg.StoreTimeout)
	defer cancel()
	ok, err := f.answers.Shared.TakeAnswer(ctx, f.key, f.answers.Owner, exchange.ShareLease)
	return ok && err == nil
}

// takeOver goes on with an answer whose replica was lost: the rest from
// the upstream, or mcpheal's -32011 when it cannot give it.
func (f *follower) takeOver(rd session.AnswerRead) {
	s := f.s
	s.Count.SharedAnswers[obs.SharedTaken].Add(1)
	own, err := strconv.ParseUint(f.key[1:], 36, 64)
	if err != nil {
		return // not an id mcpheal made: nothing to take
	}
	// The events the server replays after its last id are numbered after
	// every number given out: the owner's last, and the agent's, which
	// may be ahead of what the log holds (its writes trail the relay).
	// The agent gets all of them: an event twice rather than one lost.
	base := max(rd.Numbered, rd.Tail, f.seq)
	sh := f.answers.Adopt(f.key, base+1)
	ended := false
	defer func() {
		if !ended {
			sh.Release() // a panic, or mcpheal stopping: the next resumption takes it over
		}
	}()
	log := s.Log.Warn().Str(obs.LogSession, f.sess.Short()).Str("answer", f.key).Int("events", base)
	if rd.UpLastID == "" {
		log.Msg("took over the answer of a lost replica; the server gave no event ids to resume it from")
		ended = true
		f.refuse(sh, rd, "the server gave its events no ids to resume it from")
		return
	}
	log.Msg("took over the answer of a lost replica; asking the upstream for the rest with Last-Event-ID")
	er := wire.EventRewriter{Gen: 1, Fr: sse.Framer{Max: s.Cfg.MaxSSELine}}
	er.Meter.Mem = s.Mem
	defer er.Meter.Release()
	er.ResumeOwn(own, base)
	er.LastID = rd.UpLastID
	buf := make([]byte, 16<<10)
	by := time.Now().Add(s.Cfg.HealTimeout)
	for try := 1; ; try++ {
		resp, cls := openGET(f.up, f.hdr, rd.Info.Upstream, rd.Info.Version, er.LastID, by)
		if resp == nil {
			ended = true
			f.refuse(sh, rd, "the upstream refused to resume it ("+cls.String()+")")
			return
		}
		answered, why := f.relay(resp, &er, sh, buf)
		upstream.ReleaseResponse(resp)
		switch {
		case answered:
			ended = true
			sh.End()
			return
		case why == errTooLarge:
			ended = true
			f.refuse(sh, rd, "the upstream's next event is larger than max_sse_line")
			return
		case why != "":
			return // the agent went, the budget, or mcpheal stops: another resumption takes it over again
		case try == takeTries || time.Now().After(by):
			ended = true
			f.refuse(sh, rd, "the upstream's event stream ended before its answer")
			return
		}
	}
}

// errTooLarge: the upstream's next event is past max_sse_line, which no
// resumption would change.
const errTooLarge = "event too large"

// relay reads one upstream stream of the taken-over answer: each event to
// the log and to the agent. ended: the response
// passed; why: relaying stopped for good (the agent went, shutdown).
func (f *follower) relay(resp *upstream.Response, er *wire.EventRewriter, sh *exchange.AnswerShare, buf []byte) (ended bool, why string) {
	s := f.s
	for {
		_ = resp.SetReadDeadline(time.Now().Add(s.Cfg.StreamKeepalive))
		n, err := resp.Read(buf)
		er.Fr.Feed(buf[:n])
		if !er.Meter.Hold(2 * er.Fr.Held()) {
			return false, "memory_budget"
		}
		for {
			ev, ok, ferr := er.Next()
			if ferr != nil {
				return false, errTooLarge
			}
			if !ok {
				break
			}
			seq := er.Seq()
			out := er.Event(nil, ev)
			if er.Seq() == seq {
				continue // no event: a blank line on its own
			}
			sh.Add([][]byte{out}, er.LastID)
			if !f.out.Write(out) {
				return false, "agent gone"
			}
			f.seq = er.Seq()
			if er.Answered {
				return true, ""
			}
		}
		select {
		case <-s.Done:
			return false, "shutdown"
		default:
		}
		switch {
		case err == nil:
		case upstream.IsTimeout(err):
			if !f.out.Write(exchange.KeepaliveComment) {
				return false, "agent gone"
			}
		default:
			return false, "" // ended or cut: asked again
		}
	}
}

// refuse ends a taken-over answer whose rest cannot be had: the agent, and
// the log, get mcpheal's -32011 as its next event.
func (f *follower) refuse(sh *exchange.AnswerShare, rd session.AnswerRead, why string) {
	f.s.Log.Warn().Str(obs.LogSession, f.sess.Short()).Str("answer", f.key).Str("why", why).
		Msg("taken-over answer ends with -32011")
	ev := sse.AppendField(nil, "id", []byte(f.key+"-"+strconv.Itoa(sh.Next())))
	ev = sse.AppendEvent(ev, "message", wire.AppendError(nil, wire.CodeMaybeExecuted, rd.Info.Request,
		"mcpheal: the replica relaying this answer was lost, and "+why+"; the request may have run and was not sent again"))
	sh.Add([][]byte{ev}, "")
	sh.End()
	f.out.Write(ev)
}
