package proxy

import (
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
)

// keepaliveLoop probes quiet sessions' upstreams every Config.Keepalive so
// that they neither expire nor sit on a dead connection (docs/healing.md
// "Keeping upstream healthy"). It runs until Close.
func (h *healer) keepaliveLoop(done <-chan struct{}) {
	defer h.bg.Done()
	defer func() {
		if p := recover(); p != nil {
			h.count.panics.Add(1)
			h.log.Error().Interface("panic", p).Msg("keepalive loop panicked")
		}
	}()
	every := min(max(h.cfg.Keepalive/4, 10*time.Millisecond), 10*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	sem := make(chan struct{}, 8) // probes in flight at once
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		now := time.Now()
		for _, sess := range h.sessions.store.Sessions() {
			if sess.Removed() || sess.QuietFor(now) < h.cfg.Keepalive || sess.Healing() {
				continue
			}
			if up, _ := sess.Current(); up == "" {
				continue // a stateless upstream has no session to keep
			}
			sess.Pinged()
			select {
			case sem <- struct{}{}:
			case <-done:
				return
			}
			if !h.bg.Add(1) {
				return
			}
			go func() {
				defer h.bg.Done()
				defer func() { <-sem }()
				h.keepalive(sess)
			}()
		}
	}
}

// keepalive probes one session: ping (tools/list for servers that answer
// -32601 to ping). A session found gone is left for its agent's next
// request to heal: a quiet agent may have left without a DELETE, and a
// session re-created for nobody would hold one of the server's sessions
// (a server with a cap then turns away an agent that is there).
func (h *healer) keepalive(sess *session.Session) {
	defer func() {
		if p := recover(); p != nil {
			h.count.panics.Add(1)
			h.log.Error().Interface("panic", p).Msg("keepalive panicked")
		}
	}()
	up, _ := sess.Current()
	if ok, _ := h.link.breaker.Allow(); !ok {
		return
	}
	hdr := recipeHeader(sess)
	cls, err := h.probe(sess, hdr, up)
	h.link.recordHealth(cls)
	log := h.log
	switch cls {
	case classify.OK:
		h.count.keepalive[keepaliveOK].Add(1)
		return
	case classify.SessionGone:
		h.count.keepalive[keepaliveGone].Add(1)
		log.Debug().Str(logSession, sess.ID.Short()).Msg("keepalive found the upstream session gone; the agent's next request heals it")
		return
	}
	h.count.keepalive[keepaliveFailed].Add(1)
	log.Warn().Str(logSession, sess.ID.Short()).Stringer(logClass, cls).Err(err).Msg("keepalive failed")
}

// probe sends one keepalive request on the upstream session and classifies
// the answer. A -32601 to ping switches the server to tools/list probes.
func (h *healer) probe(sess *session.Session, hdr *fasthttp.RequestHeader, up session.UpstreamID) (classify.Class, error) {
	method := "ping"
	if h.pingUnsupported.Load() {
		method = "tools/list"
	}
	body := `{"jsonrpc":"2.0","id":` + h.link.upcallID("keepalive") + `,"method":"` + method + `"}`
	rep, err := h.link.call(&upcall{hdr: hdr, session: up, version: sess.Recipe.ProtocolVersion, body: []byte(body),
		deadline: time.Now().Add(h.cfg.HealTimeout)})
	if err != nil {
		return rep.class, err
	}
	if rep.class == classify.ToolError && method == "ping" && errorCode(rep.msg) == -32601 {
		h.pingUnsupported.Store(true)
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
