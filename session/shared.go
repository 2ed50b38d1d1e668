package session

import (
	"context"
	"sync"
	"time"
)

// Shared is what several mcpheal processes (replicas behind one balancer,
// or one process and its successor) keep for a session beyond its sealed
// id: what changes in its life. The recipe never changes and travels in the
// id itself; Shared holds the current upstream session and its generation,
// the journal, and the tombstone of a session the agent ended.
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
	// SaveJournal records the session's journal.
	SaveJournal(ctx context.Context, id ClientID, j Journal) error
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
	// Journal is valid when HasJournal: a process recorded one.
	Journal    Journal
	HasJournal bool
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
	m        map[ClientID]State
	leads    map[leadKey]time.Time
	watchers map[*func(Event)]struct{}
}

var _ Watcher = (*MemShared)(nil)

type leadKey struct {
	id  ClientID
	gen uint64
}

// NewMemShared returns an empty MemShared.
func NewMemShared() *MemShared {
	return &MemShared{m: make(map[ClientID]State), leads: make(map[leadKey]time.Time), watchers: make(map[*func(Event)]struct{})}
}

// Load implements Shared.
func (m *MemShared) Load(_ context.Context, id ClientID) (State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.m[id]
	st.Journal.Subscriptions = append([]string(nil), st.Journal.Subscriptions...)
	return st, nil
}

// Advance implements Shared.
func (m *MemShared) Advance(_ context.Context, id ClientID, from uint64, up UpstreamID) (State, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.m[id]
	if st.Ended || st.Gen > from {
		return st, false, nil
	}
	st.Upstream, st.Gen = up, from+1
	m.m[id] = st
	m.tellLocked(Event{Key: m.Key(id), Upstream: up, Gen: st.Gen})
	return st, true, nil
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

// SaveJournal implements Shared.
func (m *MemShared) SaveJournal(_ context.Context, id ClientID, j Journal) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.m[id]
	st.Journal, st.HasJournal = j, true
	m.m[id] = st
	return nil
}

// End implements Shared.
func (m *MemShared) End(_ context.Context, id ClientID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m[id] = State{Ended: true}
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
