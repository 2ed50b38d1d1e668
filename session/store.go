package session

import (
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// StoreConfig configures a Store. Zero values take the documented defaults.
type StoreConfig struct {
	// MaxSessions caps the number of live sessions; the least recently used
	// is dropped beyond it. Zero means 100 000.
	MaxSessions int
	// IdleTTL drops a session unused for this long. Zero means 24 h.
	IdleTTL time.Duration
}

// Store holds the live sessions, bounded in size and idle time.
type Store struct {
	cache   *lru.Cache[ClientID, *Session]
	ttl     time.Duration
	dropped chan *Session // evicted sessions, handed to onDrop off the LRU lock
	onDrop  func(*Session)
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// NewStore returns a running Store. onDrop, if not nil, is called from the
// Store's own goroutine for every session the Store evicts or expires (not for
// those removed with Remove); it may do I/O.
func NewStore(cfg StoreConfig, onDrop func(*Session)) (*Store, error) {
	st := &Store{
		ttl:     orDur(cfg.IdleTTL, 24*time.Hour),
		dropped: make(chan *Session, 1024),
		onDrop:  onDrop,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	size := cfg.MaxSessions
	if size <= 0 {
		size = 100_000
	}
	cache, err := lru.NewWithEvict(size, st.evicted)
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

// Add stores s.
func (st *Store) Add(s *Session) { st.cache.Add(s.ID, s) }

// Get returns the live session id names and marks it used.
func (st *Store) Get(id ClientID) (*Session, bool) {
	s, ok := st.cache.Get(id)
	if !ok {
		return nil, false
	}
	s.touch()
	return s, true
}

// Has reports whether id is a live session, without marking it used.
func (st *Store) Has(id ClientID) bool { return st.cache.Contains(id) }

// Remove drops the session without calling onDrop (the agent ended it).
func (st *Store) Remove(id ClientID) (*Session, bool) {
	s, ok := st.cache.Peek(id)
	if !ok {
		return nil, false
	}
	s.removed.Store(true)
	st.cache.Remove(id)
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
	every := min(max(st.ttl/10, 50*time.Millisecond), time.Minute)
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

// sweep expires idle sessions. LRU order is use order, so the idle ones are
// all at the cold end.
func (st *Store) sweep() {
	t := now()
	for {
		id, s, ok := st.cache.GetOldest()
		if !ok || s.idle(t) < st.ttl {
			return
		}
		st.cache.Remove(id) // evicted() queues it for onDrop
		st.drainQueued()
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
