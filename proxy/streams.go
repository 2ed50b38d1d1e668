package proxy

import (
	"sync"

	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// streamSet tracks the agents' standalone GET streams per session, so that
// ending a session can cut its upstream stream at once. (An upstream such as
// the Go SDK finishes a session's DELETE only after its GET stream ended, and
// the proxy would otherwise notice a departed agent only on its next write.)
type streamSet struct {
	mu sync.Mutex // protects m
	m  map[session.ClientID][]*upstream.Response
}

func (ss *streamSet) add(id session.ClientID, r *upstream.Response) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = make(map[session.ClientID][]*upstream.Response)
	}
	ss.m[id] = append(ss.m[id], r)
}

// remove forgets r; the stream's owner calls it before releasing r, so that
// interrupt never touches a released response.
func (ss *streamSet) remove(id session.ClientID, r *upstream.Response) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	list := ss.m[id]
	for i, x := range list {
		if x == r {
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

// interrupt cuts every stream of the session; their owners then end.
func (ss *streamSet) interrupt(id session.ClientID) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, r := range ss.m[id] {
		r.Interrupt()
	}
}
