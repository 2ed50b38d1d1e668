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

// Bytes is what a journal holds: its level's params and every URI. The
// proxy counts it in its memory budget and caps it per session.
func (j Journal) Bytes() int {
	n := len(j.Level)
	for _, uri := range j.Subscriptions {
		n += len(uri)
	}
	return n
}

// SetLevel records an accepted logging/setLevel (its raw params) and
// returns how many bytes the journal grew by (negative: shrank).
func (s *Session) SetLevel(params string) (grew int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.journalGone {
		return 0
	}
	grew = len(params) - len(s.level)
	s.level = params
	s.journalBytes += grew
	return grew
}

// Subscribe records an accepted resources/subscribe; ok false records an
// accepted resources/unsubscribe. It returns how many bytes the journal
// grew by (negative: shrank; zero: nothing changed).
func (s *Session) Subscribe(uri string, ok bool) (grew int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.journalGone {
		return 0
	}
	_, had := s.subs[uri]
	switch {
	case !ok && had:
		delete(s.subs, uri)
		grew = -len(uri)
	case ok && !had:
		if s.subs == nil {
			s.subs = make(map[string]bool)
		}
		s.subs[uri] = true
		grew = len(uri)
	}
	s.journalBytes += grew
	return grew
}

// Subscribed reports whether uri is subscribed.
func (s *Session) Subscribed(uri string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subs[uri]
}

// ReserveJournal holds the bytes that c would add to the journal, for a
// change in flight (the upstream has yet to accept it), unless the
// journal, with what the other changes in flight hold, would pass max. It
// returns the bytes held, to be given back with UnreserveJournal once the
// change is recorded or dropped. A level replacing another holds only what
// it adds; an unsubscribe holds nothing.
func (s *Session) ReserveJournal(c JournalChange, max int) (n int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case c.Level != "":
		n = len(c.Level) - len(s.level)
	case c.Subscribed && !s.subs[c.URI]:
		n = len(c.URI)
	}
	n = max0(n)
	if s.journalBytes+s.journalHeld+n > max {
		return 0, false
	}
	s.journalHeld += n
	return n, true
}

// UnreserveJournal gives back what ReserveJournal held.
func (s *Session) UnreserveJournal(n int) {
	s.mu.Lock()
	s.journalHeld -= n
	s.mu.Unlock()
}

func max0(n int) int {
	if n < 0 {
		return 0
	}
	return n
}

// JournalBytes returns what the journal holds now (Journal.Bytes).
func (s *Session) JournalBytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.journalBytes
}

// DropJournal empties the journal for good, once the session has left its
// store, and returns the bytes it held: the caller gives them back to its
// budget exactly once, and later changes record nothing.
func (s *Session) DropJournal() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.journalBytes
	s.level, s.subs, s.journalBytes, s.journalGone = "", nil, 0, true
	return n
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

// DueTools asks for the session's tools to be listed once the next
// request on it has reached the upstream (TakeDueTools): after a heal, or
// when a session is opened for an agent that has not listed them, the
// agent's request goes first, and a server that allows a new session only
// a few requests spends none of them on mcpheal's list before it. notify:
// the agent is to be told when the list changed.
func (s *Session) DueTools(notify bool) {
	v := int32(1)
	if notify {
		v = 2
	}
	s.ToolsPending.Store(v)
}

// TakeDueTools reports, once, whether the tools are due to be listed, and
// whether the agent is to be told of a change.
func (s *Session) TakeDueTools() (due, notify bool) {
	if s.ToolsPending.Load() == 0 {
		return false, false
	}
	v := s.ToolsPending.Swap(0)
	return v != 0, v == 2
}

// SetJournal replaces the session's journal with j (the fleet's, from
// Shared) and returns how many bytes the journal grew by.
func (s *Session) SetJournal(j Journal) (grew int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.journalGone {
		return 0
	}
	s.level = j.Level
	s.subs = nil
	for _, uri := range j.Subscriptions {
		if s.subs == nil {
			s.subs = make(map[string]bool, len(j.Subscriptions))
		}
		s.subs[uri] = true
	}
	n := j.Bytes()
	grew, s.journalBytes = n-s.journalBytes, n
	return grew
}
