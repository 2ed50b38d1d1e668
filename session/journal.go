package session

import (
	"crypto/sha256"
	"sort"
)

// Journal is the session-scoped state an upstream forgets when its session
// is re-created, and that the agent set up through requests the upstream
// accepted (MCP 2025-11-25 server/utilities/logging: the level;
// server/resources: the subscriptions). The proxy replays it after a
// re-init, before the agent's request.
type Journal struct {
	// Level is the params of the last accepted logging/setLevel, raw JSON;
	// empty when the agent never set one.
	Level string
	// Subscriptions are the URIs subscribed and not unsubscribed, sorted.
	Subscriptions []string
}

// SetLevel records an accepted logging/setLevel (its raw params).
func (s *Session) SetLevel(params string) {
	s.mu.Lock()
	s.level = params
	s.mu.Unlock()
}

// Subscribe records an accepted resources/subscribe; ok false records an
// accepted resources/unsubscribe.
func (s *Session) Subscribe(uri string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok {
		delete(s.subs, uri)
		return
	}
	if s.subs == nil {
		s.subs = make(map[string]bool)
	}
	s.subs[uri] = true
}

// Journal returns a snapshot of the state to replay.
func (s *Session) Journal() Journal {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := Journal{Level: s.level}
	for uri := range s.subs {
		j.Subscriptions = append(j.Subscriptions, uri)
	}
	sort.Strings(j.Subscriptions)
	return j
}

// SeeTools records the hash of a tools/list result the agent saw and
// reports whether it differs from the previous one. The first call reports
// false.
func (s *Session) SeeTools(result []byte) (changed bool) {
	h := sha256.Sum256(result)
	s.mu.Lock()
	defer s.mu.Unlock()
	changed = s.toolsSeen && s.tools != h
	s.tools, s.toolsSeen = h, true
	return changed
}

// ToolsSeen reports whether the agent has listed tools on this session.
func (s *Session) ToolsSeen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.toolsSeen
}

// SetJournal replaces the session's journal with j (the fleet's, from
// Shared).
func (s *Session) SetJournal(j Journal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.level = j.Level
	s.subs = nil
	for _, uri := range j.Subscriptions {
		if s.subs == nil {
			s.subs = make(map[string]bool, len(j.Subscriptions))
		}
		s.subs[uri] = true
	}
}
