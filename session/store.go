package session

import (
	"errors"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// StoreConfig configures a Store. Zero values take the documented defaults.
type StoreConfig struct {
	// MaxSessions caps the number of live sessions. Zero means 100 000.
	MaxSessions int
	// MaxPerCredential caps the live sessions created under one credential
	// fingerprint (the empty one included). Zero means no cap beyond
	// MaxSessions.
	MaxPerCredential int
	// IdleTTL drops a session unused for this long. Zero means 24 h.
	IdleTTL time.Duration
	// Grace is how long a new session that has not yet been used is safe
	// from admission (an agent between its initialize and its first call).
	// Zero means 10 s.
	Grace time.Duration
	// MaxAge is the longest a session lives, however active (its
	// Recipe.Expires): the sweep ends a session past it at most MaxAge/20
	// late, even one nobody uses (its keepalive pings and GET stream end
	// with it). Zero: sessions end by idleness only.
	MaxAge time.Duration
}

// ErrFull is returned by Add when MaxSessions is reached and no session may
// make room: every one has been used, or is within its grace.
var ErrFull = errors.New("session store full")

// ErrCredentialFull is ErrFull for the MaxPerCredential cap of the new
// session's credential.
var ErrCredentialFull = errors.New("too many sessions for this credential")

// Store holds the live sessions, bounded in size and idle time.
//
// Admission (Add) never evicts a session that has been used: a flood of
// initializes that never go on to a call can only take the place of other
// such sessions, oldest first and once past Grace, so it cannot push out
// the agents at work. When no such session is left, Add refuses.
type Store struct {
	cache   *lru.Cache[ClientID, *Session]
	ttl     time.Duration
	maxAge  time.Duration
	max     int
	perCred int
	grace   time.Duration
	dropped chan *Session // evicted sessions, handed to onDrop off the LRU lock
	onDrop  func(*Session)
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once

	mu        sync.Mutex            // protects the fields below; taken before the LRU's lock, never inside it
	counts    map[string]int        // live sessions per creating credential
	unused    map[string][]*Session // per credential, sessions not yet used, oldest first
	unusedAll []*Session            // all sessions not yet used, oldest first
}

// NewStore returns a running Store. onDrop, if not nil, is called from the
// Store's own goroutine for every session the Store evicts or expires (not for
// those removed with Remove); it may do I/O.
func NewStore(cfg StoreConfig, onDrop func(*Session)) (*Store, error) {
	st := &Store{
		ttl:     orDur(cfg.IdleTTL, 24*time.Hour),
		maxAge:  cfg.MaxAge,
		max:     cfg.MaxSessions,
		perCred: cfg.MaxPerCredential,
		grace:   orDur(cfg.Grace, 10*time.Second),
		dropped: make(chan *Session, 1024),
		onDrop:  onDrop,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		counts:  make(map[string]int),
		unused:  make(map[string][]*Session),
	}
	if st.max <= 0 {
		st.max = 100_000
	}
	// The store enforces the cap itself; the LRU never evicts on its own.
	cache, err := lru.NewWithEvict(st.max+1, st.evicted)
	if err != nil {
		return nil, err
	}
	st.cache = cache
	go st.run()
	return st, nil
}

// evicted runs under the LRU's lock: it must not block or re-enter.
func (st *Store) evicted(_ ClientID, s *Session) {
	if s.removed.Swap(true) {
		return // Remove'd by the caller: not a drop
	}
	select {
	case st.dropped <- s:
	default: // queue full: the session is gone either way, only its DELETE is skipped
	}
}

// Add stores s, created under the credential s.Recipe.Credential. At a cap
// it first drops the oldest session that was never used and is past its
// grace (under that credential, for the per-credential cap); it returns
// ErrFull when there is none.
func (st *Store) Add(s *Session) error {
	cred := s.Recipe.Credential
	st.mu.Lock()
	defer st.mu.Unlock()
	t := now()
	if st.perCred > 0 && st.counts[cred] >= st.perCred {
		q := st.pruneLocked(st.unused[cred])
		if st.unused[cred] = q; !st.dropOldestLocked(q, t) {
			return ErrCredentialFull
		}
	}
	if st.cache.Len() >= st.max {
		st.unusedAll = st.pruneLocked(st.unusedAll)
		if !st.dropOldestLocked(st.unusedAll, t) {
			return ErrFull
		}
	}
	st.counts[cred]++
	s.counted.Store(true)
	st.unused[cred] = append(st.unused[cred], s)
	st.unusedAll = append(st.unusedAll, s)
	st.cache.Add(s.ID, s)
	return nil
}

// dropOldestLocked drops q's first session if it is past its grace. q is
// pruned: its first session was never used and is still in the store.
func (st *Store) dropOldestLocked(q []*Session, t time.Time) bool {
	if len(q) == 0 || t.Sub(q[0].created) < st.grace {
		return false
	}
	victim := q[0]
	victim.used.Store(true) // out of every queue at their next prune
	st.uncountLocked(victim)
	st.cache.Remove(victim.ID) // evicted() queues it for onDrop (the upstream DELETE)
	return true
}

// pruneLocked drops from the front of q the sessions used or gone since.
func (st *Store) pruneLocked(q []*Session) []*Session {
	for len(q) > 0 && (q[0].used.Load() || q[0].removed.Load()) {
		q[0] = nil
		q = q[1:]
	}
	if len(q) == 0 {
		return nil // let the array go
	}
	return q
}

// uncountLocked releases s's place under its credential, once.
func (st *Store) uncountLocked(s *Session) {
	if !s.counted.Swap(false) {
		return
	}
	c := s.Recipe.Credential
	if n := st.counts[c]; n > 1 {
		st.counts[c] = n - 1
	} else {
		delete(st.counts, c)
	}
}

// uncount is uncountLocked for a session that left the store.
func (st *Store) uncount(s *Session) {
	st.mu.Lock()
	st.uncountLocked(s)
	st.mu.Unlock()
}

// Used marks s as used: the upstream accepted a request of its beyond the
// initialize. From then on admission never takes its place.
func (st *Store) Used(s *Session) { s.used.Store(true) }

// Count returns the live sessions created under cred.
func (st *Store) Count(cred string) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.counts[cred]
}

// Get returns the live session id names and marks it used.
func (st *Store) Get(id ClientID) (*Session, bool) {
	s, ok := st.cache.Get(id)
	if !ok {
		return nil, false
	}
	s.touch()
	return s, true
}

// Peek returns the live session id names without marking it used.
func (st *Store) Peek(id ClientID) (*Session, bool) { return st.cache.Peek(id) }

// Has reports whether id is a live session, without marking it used.
func (st *Store) Has(id ClientID) bool { return st.cache.Contains(id) }

// Remove drops the session without calling onDrop (the agent ended it).
func (st *Store) Remove(id ClientID) (*Session, bool) {
	s, ok := st.cache.Peek(id)
	if !ok || s.removed.Swap(true) {
		return nil, false // not here, or another caller removed it first
	}
	st.cache.Remove(id)
	st.uncount(s)
	return s, true
}

// Len returns the number of live sessions.
func (st *Store) Len() int { return st.cache.Len() }

// Sessions returns a snapshot of the live sessions, coldest first.
func (st *Store) Sessions() []*Session { return st.cache.Values() }

// Close stops the sweeper and waits for queued drops to be handled. The
// sessions stay readable.
func (st *Store) Close() {
	st.once.Do(func() { close(st.stop) })
	<-st.done
}

// run owns the idle sweep and the onDrop calls.
func (st *Store) run() {
	defer close(st.done)
	every := min(st.ttl/10, time.Minute)
	if st.maxAge > 0 {
		every = min(every, st.maxAge/20)
	}
	every = max(every, 50*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-st.stop:
			st.drainQueued()
			return
		case s := <-st.dropped:
			st.drop(s)
		case <-t.C:
			st.sweep()
		}
	}
}

// compact drops from the admission queues every session used or gone
// since it was queued, so that the queues hold no session the store let go.
func (st *Store) compact() {
	st.mu.Lock()
	defer st.mu.Unlock()
	keep := func(q []*Session) []*Session {
		out := q[:0]
		for _, s := range q {
			if !s.used.Load() && !s.removed.Load() {
				out = append(out, s)
			}
		}
		clear(q[len(out):])
		if len(out) == 0 {
			return nil
		}
		return out
	}
	st.unusedAll = keep(st.unusedAll)
	for c, q := range st.unused {
		if q = keep(q); q == nil {
			delete(st.unused, c)
		} else {
			st.unused[c] = q
		}
	}
}

// sweep expires idle sessions, and those past their maximum age. LRU order
// is use order, so the idle ones are all at the cold end; sessions past
// their age may be anywhere, and are looked for among all of them.
func (st *Store) sweep() {
	st.compact()
	t := now()
	for {
		id, s, ok := st.cache.GetOldest()
		if !ok || s.idle(t) < st.ttl {
			break
		}
		st.cache.Remove(id) // evicted() queues it for onDrop
		st.drainQueued()
	}
	if st.maxAge <= 0 {
		return
	}
	for _, s := range st.cache.Values() {
		if s.Expired(t) {
			st.cache.Remove(s.ID)
			st.drainQueued()
		}
	}
}

func (st *Store) drainQueued() {
	for {
		select {
		case s := <-st.dropped:
			st.drop(s)
		default:
			return
		}
	}
}

func (st *Store) drop(s *Session) {
	st.uncount(s)
	if st.onDrop != nil {
		st.onDrop(s)
	}
}

func orDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
