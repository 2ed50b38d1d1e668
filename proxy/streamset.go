package proxy

import (
	"sync"
	"time"

	"github.com/mcpheal/mcpheal/session"
)

// streamSet tracks the agents' standalone GET streams per session, so that
// session events reach them: ending a session stops its streams (an
// upstream such as the Go SDK finishes a session's DELETE only after its GET
// stream ended), a heal moves them to the new upstream session, and the
// proxy can tell the agent that the tool list changed.
type streamSet struct {
	mu sync.Mutex // protects m
	m  map[session.ClientID][]*getStream
}

func (ss *streamSet) add(id session.ClientID, g *getStream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = make(map[session.ClientID][]*getStream)
	}
	ss.m[id] = append(ss.m[id], g)
}

func (ss *streamSet) remove(id session.ClientID, g *getStream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	list := ss.m[id]
	for i, x := range list {
		if x == g {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(ss.m, id)
	} else {
		ss.m[id] = list
	}
}

func (ss *streamSet) each(id session.ClientID, f func(*getStream)) {
	ss.mu.Lock()
	list := append([]*getStream(nil), ss.m[id]...)
	ss.mu.Unlock()
	for _, g := range list {
		f(g)
	}
}

// stop ends the session's streams for good.
func (ss *streamSet) stop(id session.ClientID) { ss.each(id, (*getStream).stop) }

// healed moves the session's streams to generation gen.
func (ss *streamSet) healed(id session.ClientID, gen uint64) {
	ss.each(id, func(g *getStream) { g.reconnectBefore(gen) })
}

// inject sends one event to the session's streams (dropped if none is open).
func (ss *streamSet) inject(id session.ClientID, event []byte) {
	ss.each(id, func(g *getStream) { g.send(event) })
}

// stopAll ends every stream (shutdown).
func (ss *streamSet) stopAll() {
	ss.mu.Lock()
	var all []*getStream
	for _, list := range ss.m {
		all = append(all, list...)
	}
	ss.mu.Unlock()
	for _, g := range all {
		g.stop()
	}
}

// evict stops the session's oldest streams until at most keep remain, and
// waits (briefly) until their upstream streams are closed. It reports
// whether it stopped any.
func (ss *streamSet) evict(id session.ClientID, keep int) bool {
	ss.mu.Lock()
	var list, old []*getStream
	for _, g := range ss.m[id] {
		if !g.resume { // a resumed stream is another upstream stream
			list = append(list, g)
		}
	}
	if n := len(list) - max(keep, 0); n > 0 {
		old = append(old, list[:n]...)
	}
	ss.mu.Unlock()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for _, g := range old {
		g.stop()
		select {
		case <-g.done:
		case <-t.C:
			return true
		}
	}
	return len(old) > 0
}

// count returns how many streams the session holds open.
func (ss *streamSet) count(id session.ClientID) int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.m[id])
}
