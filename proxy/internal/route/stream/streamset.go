package stream

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
type Set struct {
	mu sync.Mutex // protects m
	m  map[session.ClientID][]*Stream
}

func (ss *Set) Add(id session.ClientID, g *Stream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = make(map[session.ClientID][]*Stream)
	}
	ss.m[id] = append(ss.m[id], g)
}

func (ss *Set) Remove(id session.ClientID, g *Stream) {
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

func (ss *Set) each(id session.ClientID, f func(*Stream)) {
	ss.mu.Lock()
	list := append([]*Stream(nil), ss.m[id]...)
	ss.mu.Unlock()
	for _, g := range list {
		f(g)
	}
}

// Stop ends the session's streams for good.
func (ss *Set) Stop(id session.ClientID) { ss.each(id, (*Stream).Stop) }

// Healed moves the session's streams to generation gen, and waits (up to
// healedWait) until they are open on it: the request that healed the
// session is sent again only then, so that what the server sends on the
// GET stream in answer (a tools/list_changed) is not lost, as it is not
// for a client that re-initializes itself and opens its GET first.
func (ss *Set) Healed(id session.ClientID, gen uint64) {
	ss.each(id, func(g *Stream) { g.reconnectBefore(gen) })
	deadline := time.Now().Add(healedWait)
	ss.each(id, func(g *Stream) { g.awaitGen(gen, deadline) })
}

// healedWait bounds the wait for a healed session's GET streams.
const healedWait = time.Second

// Inject sends one event to the session's streams (dropped if none is open).
func (ss *Set) Inject(id session.ClientID, event []byte) {
	ss.each(id, func(g *Stream) { g.send(event) })
}

// StopAll ends every stream (shutdown).
func (ss *Set) StopAll() {
	ss.mu.Lock()
	var all []*Stream
	for _, list := range ss.m {
		all = append(all, list...)
	}
	ss.mu.Unlock()
	for _, g := range all {
		g.Stop()
	}
}

// Evict stops the session's oldest streams until at most keep remain, and
// waits (briefly) until their upstream streams are closed. It reports
// whether it stopped any.
func (ss *Set) Evict(id session.ClientID, keep int) bool {
	ss.mu.Lock()
	var list, old []*Stream
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
		g.Stop()
		select {
		case <-g.Done:
		case <-t.C:
			return true
		}
	}
	return len(old) > 0
}

// Count returns how many streams the session holds open.
func (ss *Set) Count(id session.ClientID) int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.m[id])
}
