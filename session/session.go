package session

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unique"
)

// Recipe is what re-creates an upstream session. It is written once when the
// session is created and read-only afterwards.
type Recipe struct {
	// InitBody is the agent's initialize request, verbatim. Identical
	// bodies (every session of one agent build) share one copy: see Intern.
	InitBody string
	// Interned keeps InitBody's shared copy shared: the runtime forgets an
	// interned value once no handle to it is left.
	Interned unique.Handle[string]
	// ProtocolVersion is the version the upstream negotiated.
	ProtocolVersion string
	// Credential is a keyed fingerprint of the credential that created the
	// session; empty when the agent sent none. Rebind moves the session to
	// a rotated credential; Binding reads the current one.
	Credential string
	// Nonce is the session's identity inside its sealed id (seal.Record):
	// what every spelling of the id would name, and what a tombstone keys.
	Nonce [16]byte
	// InitSealed reports that the sealed id carries InitBody itself; when
	// false it carries only its digest, and a restart or another replica
	// can re-create the session only from a fleet store that keeps it.
	InitSealed bool
	// Expires is when the sealed id stops opening: the session's maximum
	// age. Zero means never (ids not sealed, in tests).
	Expires time.Time
	// Header holds the agent's request headers (name, value) at initialize,
	// for work the proxy does on the session's behalf with no agent request
	// at hand (keepalive pings and the heals they trigger). Never logged.
	// Rebind replaces it with the rotated credential's request headers.
	Header [][2]string
}

// Intern returns body as a handle shared with every other live recipe of
// the same bytes (unique.Make): agents of one build send the same
// initialize, so a thousand sessions keep one copy. Keep the handle in
// Recipe.Interned and its Value in Recipe.InitBody.
func Intern(body []byte) unique.Handle[string] { return unique.Make(string(body)) }

// InitFunc creates a new upstream session and returns its id and its
// generation: 0 for the one after the session's own, or the generation a
// fleet of mcpheal processes agreed on (Shared), when another process healed
// first and its upstream session is adopted. ctx carries the heal budget. It
// runs at most once per generation in one process.
type InitFunc func(ctx context.Context) (UpstreamID, uint64, error)

// ErrClosed is returned by Heal for a session removed from its store.
var ErrClosed = errors.New("session closed")

// Session is one agent session.
type Session struct {
	// ID is the agent-facing id; written once.
	ID ClientID
	// Recipe re-creates the upstream session; written once.
	Recipe Recipe

	lastUsed atomic.Int64 // unix nanoseconds of the last request
	lastPing atomic.Int64 // unix nanoseconds of the last keepalive probe
	removed  atomic.Bool  // dropped by the agent or the store
	used     atomic.Bool  // the upstream accepted a request beyond initialize (Store.Used)
	counted  atomic.Bool  // holds a place under its credential in the store
	created  time.Time    // written once, by New
	// needsInit: restored from its sealed id (Restored) and holding no
	// upstream session yet; the first heal creates one.
	needsInit atomic.Bool
	adopted   atomic.Uint64 // NoteAdopted

	mu       sync.Mutex // protects everything below
	upstream UpstreamID
	gen      uint64
	born     time.Time // when the current upstream session was created
	healing  *healCall
	probe    chan struct{}   // closed when the request probing an outage is done
	waiting  int             // requests waiting on probe (ProbeWaiters)
	replayOK map[string]bool // tool name → safe to replay (read-only or idempotent)
	// paramHeaders: tool → its x-mcp-header parameters (parameter → header
	// name), nParamHeaders how many in all (SetParamHeaders).
	paramHeaders  map[string]map[string]string
	nParamHeaders int
	heals         uint64
	reported      uint64 // the last generation whose heal was reported

	cred  string          // current credential fingerprint (starts as Recipe.Credential)
	hdr   [][2]string     // current headers for proactive work (starts as Recipe.Header)
	level string          // journal: raw params of the last logging/setLevel
	subs  map[string]bool // journal: subscribed resource URIs
	// journalBytes is Journal().Bytes(), kept as it changes; journalGone:
	// DropJournal ran, and the journal records nothing more.
	journalBytes int
	journalHeld  int // ReserveJournal: bytes held for changes in flight
	journalGone  bool
	tools        [32]byte // hash of the last tools/list result the agent saw
	toolsSeen    bool
	// ToolsPending, when not 0, is the tools to be listed after the next
	// request that reaches the upstream (DueTools); 2 also tells the agent
	// when they changed. The exchange reads it on every request, with no
	// call; TakeDueTools takes it.
	ToolsPending atomic.Int32
}

// healCall is one re-init in flight; its result fields are written once,
// before done is closed, and read after.
type healCall struct {
	done     chan struct{}
	upstream UpstreamID
	gen      uint64
	err      error
}

// New returns a session for a freshly initialized upstream session.
func New(id ClientID, r Recipe, up UpstreamID) *Session {
	t := now()
	s := &Session{ID: id, Recipe: r, upstream: up, gen: 1, born: t, created: t, cred: r.Credential, hdr: r.Header}
	s.touch()
	return s
}

// Restored returns a session re-created from its sealed id after the
// process that created it ended (or dropped it): it has the recipe and no
// upstream session yet (NeedsInit), and its first request heals it.
func Restored(id ClientID, r Recipe) *Session {
	s := New(id, r, "")
	s.needsInit.Store(true)
	return s
}

// Adopted returns a session re-created from its sealed id whose upstream
// session another mcpheal process holds (Shared): generation gen, upstream
// id up. It needs no heal.
func Adopted(id ClientID, r Recipe, up UpstreamID, gen uint64) *Session {
	s := New(id, r, up)
	s.gen = max(gen, 1)
	s.adopted.Store(s.gen)
	return s
}

// Continued returns a session for a freshly initialized upstream session
// whose id had earlier generations elsewhere (Shared) up to gen-1: a
// session mcpheal holds for 2026-07-28 agents, re-created under the same
// id after its upstream session was lost. Unlike Adopted, its upstream
// session is new.
func Continued(id ClientID, r Recipe, up UpstreamID, gen uint64) *Session {
	s := New(id, r, up)
	s.gen = max(gen, 1)
	return s
}

// Expired reports whether the session has passed its maximum age
// (Recipe.Expires): it ends then, however active, in memory as when its
// sealed id is opened.
func (s *Session) Expired(t time.Time) bool {
	return !s.Recipe.Expires.IsZero() && !t.Before(s.Recipe.Expires)
}

// NeedsInit reports whether the session must create its upstream session
// before its first request goes upstream.
func (s *Session) NeedsInit() bool { return s.needsInit.Load() }

// now is the clock; tests replace it.
var now = time.Now

func (s *Session) touch() { s.lastUsed.Store(now().UnixNano()) }

// idle returns how long the session has gone unused.
func (s *Session) idle(t time.Time) time.Duration {
	return t.Sub(time.Unix(0, s.lastUsed.Load()))
}

// Binding returns the fingerprint of the credential the session is bound to
// and the headers to use for work on its behalf.
func (s *Session) Binding() (string, [][2]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cred, s.hdr
}

// Rebind moves the session to a new credential (token rotation: the
// upstream accepted a request made with it).
func (s *Session) Rebind(cred string, hdr [][2]string) {
	s.mu.Lock()
	s.cred, s.hdr = cred, hdr
	s.mu.Unlock()
}

// QuietFor returns how long neither the agent nor a keepalive probe has
// used the session.
func (s *Session) QuietFor(t time.Time) time.Duration {
	last := max(s.lastUsed.Load(), s.lastPing.Load())
	return t.Sub(time.Unix(0, last))
}

// Pinged records a keepalive probe.
func (s *Session) Pinged() { s.lastPing.Store(now().UnixNano()) }

// Healing reports whether a re-init is in flight.
func (s *Session) Healing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healing != nil
}

// Current returns the upstream id and the generation a request must remember.
func (s *Session) Current() (UpstreamID, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upstream, s.gen
}

// UpstreamAge returns how long the current upstream session has lived.
func (s *Session) UpstreamAge() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now().Sub(s.born)
}

// Heal re-initializes the upstream session if generation seen is still
// current, or joins the re-init already running, and returns the upstream id
// and generation to use. The re-init itself runs detached from ctx, bounded
// by budget; ctx only bounds how long this caller waits.
func (s *Session) Heal(ctx context.Context, seen uint64, budget time.Duration, init InitFunc) (UpstreamID, uint64, error) {
	if s.removed.Load() {
		return "", seen, ErrClosed
	}
	s.mu.Lock()
	if s.gen != seen {
		up, g := s.upstream, s.gen
		s.mu.Unlock()
		return up, g, nil
	}
	c := s.healing
	if c == nil {
		c = &healCall{done: make(chan struct{})}
		s.healing = c
		go s.lead(c, context.WithoutCancel(ctx), budget, init)
	}
	s.mu.Unlock()
	select {
	case <-c.done:
		return c.upstream, c.gen, c.err
	case <-ctx.Done():
		return "", seen, ctx.Err()
	}
}

// lead runs one re-init and publishes its outcome to every waiter.
func (s *Session) lead(c *healCall, base context.Context, budget time.Duration, init InitFunc) {
	ctx, cancel := context.WithTimeout(base, budget)
	defer cancel()
	var (
		up  UpstreamID
		gen uint64
		err error
	)
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("reinit panicked: %v", p)
			}
		}()
		up, gen, err = init(ctx)
	}()
	s.mu.Lock()
	if err == nil {
		s.upstream = up
		if gen <= s.gen {
			gen = s.gen + 1
		}
		s.gen = gen
		s.born = now()
		s.heals++
		s.needsInit.Store(false)
	}
	c.upstream, c.gen, c.err = s.upstream, s.gen, err
	s.healing = nil
	s.mu.Unlock()
	close(c.done)
}

// Probe elects one request per session to retry an unreachable upstream.
// The first caller becomes the probe (lead true) and must call ProbeDone
// once its retry got an answer, its heal finished, or it gave up; the others
// get a channel closed at that moment, and then go once, with the session's
// current upstream id. So an outage ends with one request on the dead
// session id instead of all of them.
func (s *Session) Probe() (lead bool, done <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.probe == nil {
		s.probe = make(chan struct{})
		return true, nil
	}
	s.waiting++
	return false, s.probe
}

// ProbeWaiters returns how many requests wait on the probe in progress.
func (s *Session) ProbeWaiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// ProbeDone ends the current probe and releases the requests waiting on it.
func (s *Session) ProbeDone() {
	s.mu.Lock()
	if s.probe != nil {
		close(s.probe)
		s.probe, s.waiting = nil, 0
	}
	s.mu.Unlock()
}

// MarkReported returns true the first time it is called for gen, so that
// of the many callers that waited on one heal exactly one reports it.
func (s *Session) MarkReported(gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reported >= gen {
		return false
	}
	s.reported = gen
	return true
}

// Heals returns how many re-inits succeeded on this session.
func (s *Session) Heals() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heals
}

// SetReplayable records, from a tools/list answer, whether a tool may be run
// twice safely (readOnlyHint or idempotentHint).
func (s *Session) SetReplayable(tool string, ok bool) {
	s.mu.Lock()
	if s.replayOK == nil {
		s.replayOK = make(map[string]bool)
	}
	s.replayOK[tool] = ok
	s.mu.Unlock()
}

// maxParamHeaders bounds the x-mcp-header parameters kept per session
// (SetParamHeaders): the upstream chooses how many it lists.
const maxParamHeaders = 1024

// SetParamHeaders records, from a tools/list answer, which of tool's
// parameters a 2026-07-28 request repeats in an Mcp-Param-<name> header
// (the inputSchema's x-mcp-header: parameter → header name); nil forgets
// them. Past maxParamHeaders in all, more are not kept.
func (s *Session) SetParamHeaders(tool string, hs map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.paramHeaders[tool]; ok {
		s.nParamHeaders -= len(old)
		delete(s.paramHeaders, tool)
	}
	if len(hs) == 0 || s.nParamHeaders+len(hs) > maxParamHeaders {
		return
	}
	if s.paramHeaders == nil {
		s.paramHeaders = map[string]map[string]string{}
	}
	s.paramHeaders[tool] = hs
	s.nParamHeaders += len(hs)
}

// ParamHeaders returns tool's x-mcp-header parameters (SetParamHeaders);
// the map is not to be changed.
func (s *Session) ParamHeaders(tool string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paramHeaders[tool]
}

// Replayable reports whether tool was announced read-only or idempotent.
func (s *Session) Replayable(tool string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replayOK[tool]
}

// Removed reports whether the session was dropped.
func (s *Session) Removed() bool { return s.removed.Load() }

func shortHash(v string) string {
	h := sha256.Sum256([]byte(v))
	return hex.EncodeToString(h[:4])
}

// NoteAdopted records that generation gen's upstream session was adopted
// from another process rather than created here: it may be older than the
// failure that led to it (that process's session may have died too).
func (s *Session) NoteAdopted(gen uint64) { s.adopted.Store(gen) }

// WasAdopted reports whether generation gen was adopted (NoteAdopted).
func (s *Session) WasAdopted(gen uint64) bool { return gen != 0 && s.adopted.Load() == gen }

// Follow moves the session to generation gen and upstream session up,
// created by another process, unless the session is already there or past
// it, or heals itself right now (its heal adopts the fleet's anyway).
func (s *Session) Follow(up UpstreamID, gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen <= s.gen || s.healing != nil {
		return
	}
	s.upstream, s.gen, s.born = up, gen, now()
	s.needsInit.Store(false)
	s.adopted.Store(gen)
}

// ClientID is the session id the agent sees: 128 random bits in hex, never
// derived from an upstream id.
type ClientID string

// UpstreamID is an upstream server's Mcp-Session-Id. It never reaches the
// agent. Empty means the upstream is stateless.
type UpstreamID string

// NewClientID returns a fresh random ClientID (32 visible ASCII characters,
// as MCP 2025-11-25 §Session Management asks).
func NewClientID() ClientID {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return ClientID(hex.EncodeToString(b[:]))
}

// Short returns a short, non-reversible tag of id for logs.
func (id ClientID) Short() string { return shortHash(string(id)) }

// Short returns a short, non-reversible tag of id for logs.
func (id UpstreamID) Short() string { return shortHash(string(id)) }
