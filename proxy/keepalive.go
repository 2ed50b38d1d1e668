package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
)

// keepaliveLoop probes quiet sessions' upstreams every Config.Keepalive so
// that they neither expire nor sit on a dead connection, and heals a session
// the probe finds gone before the agent's next call (README "Keeping
// upstream healthy"). It runs until Close.
func (s *Server) keepaliveLoop() {
	defer s.bg.Done()
	defer func() {
		if p := recover(); p != nil {
			s.count.panics.Add(1)
			s.log.Error().Interface("panic", p).Msg("keepalive loop panicked")
		}
	}()
	every := min(max(s.cfg.Keepalive/4, 10*time.Millisecond), 10*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	sem := make(chan struct{}, 8) // probes in flight at once
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		now := time.Now()
		for _, sess := range s.store.Sessions() {
			if sess.Removed() || sess.QuietFor(now) < s.cfg.Keepalive || sess.Healing() {
				continue
			}
			if up, _ := sess.Current(); up == "" {
				continue // a stateless upstream has no session to keep
			}
			sess.Pinged()
			select {
			case sem <- struct{}{}:
			case <-s.done:
				return
			}
			if !s.bg.Add(1) {
				return
			}
			go func() {
				defer s.bg.Done()
				defer func() { <-sem }()
				s.keepalive(sess)
			}()
		}
	}
}

// keepalive probes one session: ping (tools/list for servers that answer
// -32601 to ping), and heal on SessionGone.
func (s *Server) keepalive(sess *session.Session) {
	defer func() {
		if p := recover(); p != nil {
			s.count.panics.Add(1)
			s.log.Error().Interface("panic", p).Msg("keepalive panicked")
		}
	}()
	up, gen := sess.Current()
	if ok, _ := s.breaker.Allow(); !ok {
		return
	}
	hdr := recipeHeader(sess)
	cls, err := s.probe(sess, hdr, up)
	s.recordHealth(cls)
	log := s.log
	switch cls {
	case classify.OK:
		s.count.keepalive[keepaliveOK].Add(1)
		return
	case classify.SessionGone:
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HealTimeout)
		defer cancel()
		if _, _, herr := s.healSession(ctx, sess, gen, reasonKeepalive, s.reinit(sess, hdr, up, gen)); herr == nil {
			s.count.keepalive[keepaliveHealed].Add(1)
			return
		} else {
			err = herr
		}
	}
	s.count.keepalive[keepaliveFailed].Add(1)
	log.Warn().Str(logSession, sess.ID.Short()).Stringer(logClass, cls).Err(err).Msg("keepalive failed")
}

// probe sends one keepalive request on the upstream session and classifies
// the answer. A -32601 to ping switches the server to tools/list probes.
func (s *Server) probe(sess *session.Session, hdr *fasthttp.RequestHeader, up session.UpstreamID) (classify.Class, error) {
	method := "ping"
	if s.pingUnsupported.Load() {
		method = "tools/list"
	}
	body := `{"jsonrpc":"2.0","id":` + s.upcallID("keepalive") + `,"method":"` + method + `"}`
	rep, err := s.call(&upcall{hdr: hdr, session: up, version: sess.Recipe.ProtocolVersion, body: []byte(body),
		deadline: time.Now().Add(s.cfg.HealTimeout)})
	if err != nil {
		return rep.class, err
	}
	if rep.class == classify.ToolError && method == "ping" && errorCode(rep.msg) == -32601 {
		s.pingUnsupported.Store(true)
		return classify.OK, nil // alive; tools/list from now on
	}
	if rep.class != classify.OK {
		return rep.class, errors.New("keepalive " + method + " " + rep.describe())
	}
	return rep.class, nil
}

// recipeHeader rebuilds the agent's initialize headers for work done on the
// session's behalf.
func recipeHeader(sess *session.Session) *fasthttp.RequestHeader {
	h := new(fasthttp.RequestHeader)
	_, hdr := sess.Binding()
	for _, kv := range hdr {
		h.Add(kv[0], kv[1])
	}
	return h
}
