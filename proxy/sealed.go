package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/session/seal"
)

// Sealed session ids (README "Sessions that outlive mcpheal"). The id an
// agent holds is its session's recipe, sealed (session/seal). A request
// whose id is in the store costs nothing more; one whose id is not (this
// process restarted, another replica created it, or the store dropped it)
// is opened, checked and re-created as a restored session, which heals
// before its first request goes upstream. An id that does not open, names
// another upstream, was ended by DELETE, or comes under another credential
// is answered as an unknown session.

// newRing returns the ring of Config.SessionKeys, or a ring of one key made
// up now.
func newRing(keys string) (*seal.Ring, error) {
	if keys == "" {
		return seal.RandomRing(), nil
	}
	ks, err := seal.ParseKeys(keys)
	if err != nil {
		return nil, err
	}
	return seal.NewRing(ks)
}

// sealID returns the agent-facing id for a new session.
func (s *Server) sealID(auth []byte, version string, init []byte) session.ClientID {
	rec := seal.NewRecord(s.cfg.Name, seal.CredentialDigest(auth), version, init, time.Now(), s.cfg.SessionMaxAge)
	return session.ClientID(s.ring.Seal(rec))
}

// restore re-creates the session named by sid from its sealed id, or
// reports false. Unsealing happens only on a store miss.
func (s *Server) restore(ctx *fasthttp.RequestCtx, sid []byte) (*session.Session, bool) {
	if len(sid) == 0 || sid[0] != 'm' || s.graves.has(string(sid)) {
		return nil, false
	}
	rec, err := s.ring.Open(string(sid), time.Now())
	if err != nil || rec.Upstream != s.cfg.Name || rec.Init == nil {
		return nil, false
	}
	auth := ctx.Request.Header.PeekBytes(hdrAuthorization)
	if seal.CredentialDigest(auth) != rec.Credential {
		return nil, false // only the credential that created it may bring it back
	}
	var hdr fasthttp.RequestHeader
	ctx.Request.Header.CopyTo(&hdr)
	stripRequestHeader(&hdr, s.requestDrops())
	init := session.Intern(rec.Init)
	recipe := session.Recipe{
		InitBody:        init.Value(),
		Interned:        init,
		ProtocolVersion: rec.Protocol,
		Credential:      s.fingerprint(auth).String(),
		Header:          recipeHeaders(&hdr),
	}
	// Another process may hold its upstream session, or have ended it.
	st, shared := s.loadShared(context.Background(), session.ClientID(sid))
	if shared && st.Ended {
		s.graves.bury(string(sid), s.cfg.SessionMaxAge)
		return nil, false
	}
	var sess *session.Session
	if shared && st.Gen > 0 && st.Upstream != "" {
		sess = session.Adopted(session.ClientID(sid), recipe, st.Upstream, st.Gen)
	} else {
		sess = session.Restored(session.ClientID(sid), recipe)
	}
	if st.HasJournal {
		sess.SetJournal(st.Journal)
	}
	s.restoreMu.Lock()
	defer s.restoreMu.Unlock()
	if live, ok := s.store.Get(sess.ID); ok {
		return live, true // a concurrent request restored it first
	}
	if s.graves.has(string(sid)) {
		return nil, false // ended while it was being opened
	}
	if !s.mem.take(sessionCost(sess)) {
		return nil, false
	}
	if err := s.store.Add(sess); err != nil {
		s.mem.give(sessionCost(sess))
		return nil, false
	}
	s.index(sess)
	s.count.restored.Add(1)
	s.log.Info().Str(logSession, sess.ID.Short()).Msg("session restored from its id")
	return sess, true
}

// graveyard holds the ids ended by DELETE (or refused at their heal) until
// they expire, so that an ended session never comes back from its sealed id
// in this process. It holds at most maxGraves ids, the oldest dropped
// first. (It lives in memory: after a restart an ended id opens again until
// its SessionMaxAge; see README "Sessions that outlive mcpheal".)
type graveyard struct {
	mu    sync.Mutex           // protects ids, order
	ids   map[string]time.Time // ended id → when its seal expires
	order []string             // ids, oldest first
}

// maxGraves bounds the graveyard: 65 536 ids of ~400 bytes is ~30 MB.
const maxGraves = 1 << 16

// bury records id as ended until maxAge from now.
func (g *graveyard) bury(id string, maxAge time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if g.ids == nil {
		g.ids = make(map[string]time.Time)
	}
	// Drop from the front what expired, and the oldest past the cap: each
	// id is dropped once, so burying costs O(1) amortized.
	for len(g.order) > 0 && (len(g.order) >= maxGraves || now.After(g.ids[g.order[0]])) {
		delete(g.ids, g.order[0])
		g.order[0] = ""
		g.order = g.order[1:]
	}
	if _, ok := g.ids[id]; !ok {
		g.order = append(g.order, id)
	}
	g.ids[id] = now.Add(maxAge)
}

func (g *graveyard) has(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	until, ok := g.ids[id]
	return ok && time.Now().Before(until)
}
