package session

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Shared is what several mcpheal processes (replicas behind one balancer,
// or one process and its successor) keep for a session beyond its sealed
// id: what changes in its life. The recipe never changes and travels in the
// id itself (only its digest when it is too large: then Shared keeps it);
// Shared holds the current upstream session and its generation, the
// journal, the credential binding the session moved to, and the tombstone
// of a session the agent ended. Note, Bind and SaveRecipe on an ended
// session do nothing: it stays ended.
//
// The proxy reads it only when it lacks something: a session id it does not
// hold (restore), and a heal (to adopt another process's heal instead of
// making a second one). A healthy session's requests never touch it.
//
// Implementations: MemShared (one process; tests) and session/redisstore.
type Shared interface {
	// Load returns what the fleet knows of session id: the zero State
	// when nothing.
	Load(ctx context.Context, id ClientID) (State, error)
	// Advance records up as the upstream session of generation from+1,
	// unless the fleet is already past generation from: then up is not
	// recorded and won is false. It returns the state that holds
	// afterwards. An ended session is never advanced (won false, Ended).
	Advance(ctx context.Context, id ClientID, from uint64, up UpstreamID) (st State, won bool, err error)
	// Lead claims, for ttl, the right to re-create the upstream session
	// that follows generation gen: true for exactly one caller per
	// generation until ttl passes.
	Lead(ctx context.Context, id ClientID, gen uint64, ttl time.Duration) (bool, error)
	// Note records one change to the session's journal: a delta, never the
	// whole journal.
	Note(ctx context.Context, id ClientID, c JournalChange) error
	// Bind records the credential binding the session moved to (a token
	// rotation the upstream accepted); Load returns it as State.Binding.
	Bind(ctx context.Context, id ClientID, binding string) error
	// SaveRecipe keeps the agent's initialize of a session whose sealed id
	// carries only its digest; Load returns it as State.Init. The caller
	// checks it against the digest before use. A session the proxy holds
	// for 2026-07-28 agents keeps the upstream's answer to its initialize
	// there instead (its agents' requests carry the initialize itself).
	SaveRecipe(ctx context.Context, id ClientID, init []byte) error
	// End records that the agent ended the session: it never comes back.
	End(ctx context.Context, id ClientID) error
}

// State is a session's fleet-wide state.
type State struct {
	// Upstream is the current upstream session id, and Gen its
	// generation; Gen 0 when no process recorded one.
	Upstream UpstreamID
	Gen      uint64
	// Ended: the agent ended the session (DELETE).
	Ended bool
	// Journal is valid when HasJournal: a process noted a change to it
	// (Note), even if the changes since left it empty.
	Journal    Journal
	HasJournal bool
	// Binding is the credential binding recorded by Bind; "" for none.
	Binding string
	// Init is the initialize recorded by SaveRecipe; nil for none.
	Init []byte
}

// JournalChange is one change to a session's journal.
type JournalChange struct {
	// Level, when not empty, is the params of an accepted logging/setLevel
	// (raw JSON), replacing the last.
	Level string
	// URI, when not empty, was subscribed (Subscribed) or unsubscribed.
	URI        string
	Subscribed bool
}

// Event is a change one process made to a session's fleet-wide state,
// told to the others (Watcher).
type Event struct {
	// Key names the session (Watcher.Key).
	Key string
	// Ended: the agent ended the session. Stream: the process Owner opens
	// the agent's GET stream for the session (the upstream allows one): any
	// other process holding one lets go. Otherwise the session advanced to
	// generation Gen on upstream session Upstream.
	Ended    bool
	Stream   bool
	Owner    string
	Upstream UpstreamID
	Gen      uint64
}

// Watcher is a Shared that tells every process of the changes as they
// happen, so that a process holding a session learns at once that another
// ended or healed it.
type Watcher interface {
	// Key returns the name events give session id: a digest, so that the
	// id itself never leaves the process.
	Key(id ClientID) string
	// Watch calls fn for every event, the caller's own included, until ctx
	// ends. Events may be lost (a reconnect): they are hints, never the
	// only way a process learns.
	Watch(ctx context.Context, fn func(Event))
	// Tell sends a Stream event (Advance and End send theirs themselves).
	Tell(ctx context.Context, e Event) error
}

// MemShared is Shared in memory, for mcpheal processes that share an
// address space (tests). It never forgets an entry; a fleet of processes
// uses session/redisstore.
type MemShared struct {
	mu       sync.Mutex
	m        map[ClientID]*memEntry
	leads    map[leadKey]time.Time
	watchers map[*func(Event)]struct{}
}

// memEntry is one session in a MemShared: the subscriptions are a set, so
// that a Note costs the same however many there are, as in Redis.
type memEntry struct {
	up         UpstreamID
	gen        uint64
	ended      bool
	hasJournal bool
	level      string
	subs       map[string]struct{}
	binding    string
	init       []byte
}

// state returns a copy of e that shares nothing with it.
func (e *memEntry) state() State {
	if e.ended {
		return State{Ended: true}
	}
	st := State{Upstream: e.up, Gen: e.gen, HasJournal: e.hasJournal, Binding: e.binding,
		Init: slices.Clone(e.init)}
	st.Journal.Level = e.level
	for uri := range e.subs {
		st.Journal.Subscriptions = append(st.Journal.Subscriptions, uri)
	}
	slices.Sort(st.Journal.Subscriptions)
	return st
}

var _ Watcher = (*MemShared)(nil)

type leadKey struct {
	id  ClientID
	gen uint64
}

// NewMemShared returns an empty MemShared.
func NewMemShared() *MemShared {
	return &MemShared{m: make(map[ClientID]*memEntry), leads: make(map[leadKey]time.Time), watchers: make(map[*func(Event)]struct{})}
}

// Load implements Shared.
func (m *MemShared) Load(_ context.Context, id ClientID) (State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[id]
	if !ok {
		return State{}, nil
	}
	return e.state(), nil
}

// entry returns id's entry, made on first use.
func (m *MemShared) entry(id ClientID) *memEntry {
	e, ok := m.m[id]
	if !ok {
		e = &memEntry{}
		m.m[id] = e
	}
	return e
}

// Advance implements Shared.
func (m *MemShared) Advance(_ context.Context, id ClientID, from uint64, up UpstreamID) (State, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entry(id)
	if e.ended || e.gen > from {
		return e.state(), false, nil
	}
	e.up, e.gen = up, from+1
	m.tellLocked(Event{Key: m.Key(id), Upstream: up, Gen: e.gen})
	return e.state(), true, nil
}

// Lead implements Shared.
func (m *MemShared) Lead(_ context.Context, id ClientID, gen uint64, ttl time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := leadKey{id, gen}
	if until, ok := m.leads[k]; ok && time.Now().Before(until) {
		return false, nil
	}
	m.leads[k] = time.Now().Add(ttl)
	return true, nil
}

// Note implements Shared.
func (m *MemShared) Note(_ context.Context, id ClientID, c JournalChange) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entry(id)
	if e.ended {
		return nil
	}
	e.hasJournal = true
	if c.Level != "" {
		e.level = c.Level
	}
	switch {
	case c.URI == "":
	case c.Subscribed:
		if e.subs == nil {
			e.subs = make(map[string]struct{})
		}
		e.subs[c.URI] = struct{}{}
	default:
		delete(e.subs, c.URI)
	}
	return nil
}

// Bind implements Shared.
func (m *MemShared) Bind(_ context.Context, id ClientID, binding string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entry(id); !e.ended {
		e.binding = binding
	}
	return nil
}

// SaveRecipe implements Shared.
func (m *MemShared) SaveRecipe(_ context.Context, id ClientID, init []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entry(id); !e.ended {
		// A copy: the caller may reuse its buffer. Empty is none, as in Redis.
		e.init = nil
		if len(init) > 0 {
			e.init = slices.Clone(init)
		}
	}
	return nil
}

// End implements Shared.
func (m *MemShared) End(_ context.Context, id ClientID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m[id] = &memEntry{ended: true}
	m.tellLocked(Event{Key: m.Key(id), Ended: true})
	return nil
}

// Key implements Watcher.
func (m *MemShared) Key(id ClientID) string { return string(id) }

// Watch implements Watcher.
func (m *MemShared) Watch(ctx context.Context, fn func(Event)) {
	m.mu.Lock()
	m.watchers[&fn] = struct{}{}
	m.mu.Unlock()
	<-ctx.Done()
	m.mu.Lock()
	delete(m.watchers, &fn)
	m.mu.Unlock()
}

// Tell implements Watcher.
func (m *MemShared) Tell(_ context.Context, e Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tellLocked(e)
	return nil
}

// tellLocked hands e to every watcher, each on its own goroutine (a
// watcher may call back into m).
func (m *MemShared) tellLocked(e Event) {
	for fn := range m.watchers {
		go (*fn)(e)
	}
}
