package exchange

import (
	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// AnswerRoute points the agent's answer to a server→client request at the
// upstream session that asked (docs/streams.md "Streams and session state across a
// heal": ids of later generations were renumbered). It reports false when
// that session is gone.
func (a *Attempt) AnswerRoute() bool {
	if wire.AnswerGen(a.Msg.ID) > a.Gen {
		// Asked by a generation another process healed into.
		a.Gen = a.S.stages.Sessions.Fleet.Follow(a.Sess)
		a.up, a.Gen = a.Sess.Current()
	}
	restored, live := wire.AnswerRoute(a.R.Body, a.Msg.ID, a.Gen)
	if restored != nil {
		a.Req.SetBodyRaw(restored)
	}
	return live
}

// Create makes the agent's session from the upstream's accepted
// initialize. An answer that is not a successful initialize passes through
// without one; a session the caps or the budget leave no room for, or an
// upstream session id past maxUpstreamID, is DELETEd upstream and the
// agent gets mcpheal's error.
func (a *Attempt) Create() Outcome {
	msg, ok := a.InitializeAnswer()
	if !ok {
		a.S.stages.Link.DropMinted(a.Resp)
		return Outcome{Kind: OutTooLarge, Class: classify.Protocol, Err: wire.ErrAnswerTooLarge}
	}
	return a.CreateFrom(msg)
}

// CreateFrom is create, given the initialize's answer (its JSON-RPC
// message).
func (a *Attempt) CreateFrom(msg []byte) Outcome {
	version := wire.InitializedVersion(a.Resp.StatusCode(), msg)
	if version == "" {
		return Outcome{Kind: OutUpstream, Class: classify.Classify(a.Resp.StatusCode(), wire.MimeJSON, msg)}
	}
	s := a.S
	up, err := s.stages.Link.SessionOf(&a.Resp.Header, a.Req.Header.PeekBytes(wire.HdrAuthorization))
	if err != nil {
		return Outcome{Kind: outInvalid, Err: err}
	}
	sess := s.stages.Sessions.NewSession(heal.Origin{Auth: a.R.Auth, Init: a.R.Body, HeldID: a.R.HeldID, HeldGen: a.R.HeldGen}, &a.Req.Header, version, up)
	if err := s.stages.Sessions.Admit(sess); err != nil {
		s.stages.Link.DropMinted(a.Resp)
		s.Log.Warn().Err(err).Int("sessions", s.stages.Sessions.Store.Len()).Int64("budget", s.Mem.Limit).Msg("initialize refused")
		return Outcome{Kind: outFull, Err: err}
	}
	a.Sess, a.R.Sess, a.Heals = sess, sess, true
	a.R.Standing, a.R.OwnCredential = heal.Bound, true
	s.Log.Debug().Str(obs.LogSession, sess.ID.Short()).Str("protocol", version).Bool("stateful", up != "").Msg("session created")
	return Outcome{Kind: OutUpstream, Class: classify.OK}
}
