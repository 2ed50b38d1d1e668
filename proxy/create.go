package proxy

import "github.com/mcpheal/mcpheal/classify"

// answerRoute points the agent's answer to a server→client request at the
// upstream session that asked (docs/streams.md "Streams and session state across a
// heal": ids of later generations were renumbered). It reports false when
// that session is gone.
func (a *attempt) answerRoute() bool {
	if answerGen(a.msg.id) > a.gen {
		// Asked by a generation another process healed into.
		a.gen = a.s.sessions.fleet.follow(a.sess)
		a.up, a.gen = a.sess.Current()
	}
	restored, live := answerRoute(a.r.body, a.msg.id, a.gen)
	if restored != nil {
		a.req.SetBodyRaw(restored)
	}
	return live
}

// create makes the agent's session from the upstream's accepted
// initialize. An answer that is not a successful initialize passes through
// without one; a session the caps or the budget leave no room for, or an
// upstream session id past maxUpstreamID, is DELETEd upstream and the
// agent gets mcpheal's error.
func (a *attempt) create() outcome {
	msg, ok := a.initializeAnswer()
	if !ok {
		a.s.link.dropMinted(a.resp)
		return outcome{kind: outTooLarge, class: classify.Protocol, err: errAnswerTooLarge}
	}
	return a.createFrom(msg)
}

// createFrom is create, given the initialize's answer (its JSON-RPC
// message).
func (a *attempt) createFrom(msg []byte) outcome {
	version := initializedVersion(a.resp.StatusCode(), msg)
	if version == "" {
		return outcome{kind: outUpstream, class: classify.Classify(a.resp.StatusCode(), mimeJSON, msg)}
	}
	s := a.s
	up, err := s.link.sessionOf(&a.resp.Header, a.req.Header.PeekBytes(hdrAuthorization))
	if err != nil {
		return outcome{kind: outInvalid, err: err}
	}
	sess := s.sessions.newSession(origin{auth: a.r.auth, init: a.r.body, heldID: a.r.heldID, heldGen: a.r.heldGen}, &a.req.Header, version, up)
	if err := s.sessions.admit(sess); err != nil {
		s.link.dropMinted(a.resp)
		s.log.Warn().Err(err).Int("sessions", s.sessions.store.Len()).Int64("budget", s.mem.limit).Msg("initialize refused")
		return outcome{kind: outFull, err: err}
	}
	a.sess, a.r.sess, a.heals = sess, sess, true
	a.r.standing, a.r.ownCredential = bound, true
	s.log.Debug().Str(logSession, sess.ID.Short()).Str("protocol", version).Bool("stateful", up != "").Msg("session created")
	return outcome{kind: outUpstream, class: classify.OK}
}
