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
// the probe finds gone before the agent's next call (docs/healing.md "Keeping
// upstream healthy"). It runs until Close.
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
// -32601 to ping), and heal on SessionGone.
func (h *healer) keepalive(sess *session.Session) {
	defer func() {
		if p := recover(); p != nil {
			h.count.panics.Add(1)
			h.log.Error().Interface("panic", p).Msg("keepalive panicked")
		}
	}()
	up, gen := sess.Current()
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
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.HealTimeout)
		defer cancel()
		if _, _, herr := h.heal(ctx, sess, gen, reasonKeepalive, hdr); herr == nil {
			h.count.keepalive[keepaliveHealed].Add(1)
			return
		} else {
			err = herr
		}
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
