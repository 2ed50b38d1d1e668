package heal

import (
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// KeepaliveLoop probes quiet sessions' upstreams every Config.Keepalive so
// that they neither expire nor sit on a dead connection (docs/healing.md
// "Keeping upstream healthy"). It runs until Close.
func (h *Healer) KeepaliveLoop(done <-chan struct{}) {
	defer h.Bg.Done()
	defer func() {
		if p := recover(); p != nil {
			h.Count.Panics.Add(1)
			h.Log.Error().Interface("panic", p).Msg("keepalive loop panicked")
		}
	}()
	every := min(max(h.Cfg.Keepalive/4, 10*time.Millisecond), 10*time.Second)
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
		for _, sess := range h.Sessions.Store.Sessions() {
			if sess.Removed() || sess.QuietFor(now) < h.Cfg.Keepalive || sess.Healing() {
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
			if !h.Bg.Add(1) {
				return
			}
			go func() {
				defer h.Bg.Done()
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
func (h *Healer) keepalive(sess *session.Session) {
	defer func() {
		if p := recover(); p != nil {
			h.Count.Panics.Add(1)
			h.Log.Error().Interface("panic", p).Msg("keepalive panicked")
		}
	}()
	up, _ := sess.Current()
	if ok, _ := h.Link.Breaker.Allow(); !ok {
		return
	}
	hdr := RecipeHeader(sess)
	cls, err := h.probe(sess, hdr, up)
	h.Link.RecordHealth(cls)
	log := h.Log
	switch cls {
	case classify.OK:
		h.Count.Keepalive[obs.KeepaliveOK].Add(1)
		return
	case classify.SessionGone:
		h.Count.Keepalive[obs.KeepaliveGone].Add(1)
		log.Debug().Str(obs.LogSession, sess.ID.Short()).Msg("keepalive found the upstream session gone; the agent's next request heals it")
		return
	}
	h.Count.Keepalive[obs.KeepaliveFailed].Add(1)
	log.Warn().Str(obs.LogSession, sess.ID.Short()).Stringer(obs.LogClass, cls).Err(err).Msg("keepalive failed")
}

// probe sends one keepalive request on the upstream session and classifies
// the answer. A -32601 to ping switches the server to tools/list probes.
func (h *Healer) probe(sess *session.Session, hdr *fasthttp.RequestHeader, up session.UpstreamID) (classify.Class, error) {
	method := "ping"
	if h.pingUnsupported.Load() {
		method = "tools/list"
	}
	body := `{"jsonrpc":"2.0","id":` + h.Link.UpcallID("keepalive") + `,"method":"` + method + `"}`
	rep, err := h.Link.Call(&link.Upcall{Hdr: hdr, Session: up, Version: sess.Recipe.ProtocolVersion, Body: []byte(body),
		Deadline: time.Now().Add(h.Cfg.HealTimeout)})
	if err != nil {
		return rep.Class, err
	}
	if rep.Class == classify.ToolError && method == "ping" && wire.ErrorCode(rep.Msg) == -32601 {
		h.pingUnsupported.Store(true)
		return classify.OK, nil // alive; tools/list from now on
	}
	if rep.Class != classify.OK {
		return rep.Class, errors.New("keepalive " + method + " " + rep.Describe())
	}
	return rep.Class, nil
}

// RecipeHeader rebuilds the agent's initialize headers for work done on the
// session's behalf.
func RecipeHeader(sess *session.Session) *fasthttp.RequestHeader {
	h := new(fasthttp.RequestHeader)
	_, hdr := sess.Binding()
	for _, kv := range hdr {
		h.Add(kv[0], kv[1])
	}
	return h
}
