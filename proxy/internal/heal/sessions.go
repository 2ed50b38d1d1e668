package heal

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/session/seal"
)

// Sessions is where a request's session comes from (docs/deployment.md "Sessions that
// outlive mcpheal"): the store of live sessions; an id the store does not
// hold (this process restarted, another replica created it, the store
// dropped it) is opened from its sealed id, checked, and re-created as a
// restored session, which heals before its first request goes upstream;
// the fleet's store, when there is one, says whether another process
// holds its upstream session or ended it. An id that does not open, names
// another upstream, was ended, has passed its maximum age, or comes under
// another credential is answered as an unknown session.
//
// New sessions are admitted here, under the store's caps and the memory
// budget; ended ones leave here, DELETE and expiry alike.
type Sessions struct {
	Cfg   *conf.Config
	Log   *zerolog.Logger
	Count *obs.Counters
	Mem   *wire.Budget
	Link  *link.Link
	Store *session.Store
	Ring  *seal.Ring
	Dead  *session.Tombstones // sessions ended here or refused at their heal
	Fleet *Fleet              // nil: this process alone
	// onRelease stops what a session held open (its GET streams, its
	// bridged listen) once it has left the store.
	OnRelease func(*session.Session)

	restoreMu sync.Mutex // one restore of an id at a time
}

// Seal returns the agent-facing id for a new session and the record it
// seals (its nonce and expiry go into the session's recipe).
func (ss *Sessions) Seal(auth []byte, version string, init []byte) (session.ClientID, *seal.Record) {
	rec := seal.NewRecord(ss.Cfg.Name, BindingOf(auth), version, init, time.Now(), ss.Cfg.SessionMaxAge)
	return session.ClientID(ss.Ring.Seal(rec)), rec
}

// Origin is what a new session is made of: the initialize that opened it
// (init) under the credential auth; for a session held for 2026-07-28
// agents, its held id and the last generation the fleet's store knew of it.
type Origin struct {
	Auth, Init []byte
	HeldID     session.ClientID
	HeldGen    uint64
}

// NewSession returns a session for a freshly initialized upstream session
// (up; "" for a bridged one), not yet admitted: o's initialize under the
// headers hdr, sealed into a new id; or, for a session held for
// 2026-07-28 agents (o.heldID), under its held id, following the
// generation the fleet's store knew of it.
func (ss *Sessions) NewSession(o Origin, hdr *fasthttp.RequestHeader, version string, up session.UpstreamID) *session.Session {
	if o.HeldID != "" {
		rec := seal.NewRecord(ss.Cfg.Name, BindingOf(o.Auth), version, o.Init, time.Now(), ss.Cfg.SessionMaxAge)
		recipe := NewRecipe(hdr, rec, o.Init, version)
		recipe.InitSealed = true // every request of its agents carries it (held.go)
		return session.Continued(o.HeldID, recipe, up, o.HeldGen+1)
	}
	id, rec := ss.Seal(o.Auth, version, o.Init)
	return session.New(id, NewRecipe(hdr, rec, o.Init, version), up)
}

// NewRecipe returns the recipe of a session whose record is rec.
func NewRecipe(hdr *fasthttp.RequestHeader, rec *seal.Record, init []byte, version string) session.Recipe {
	in := session.Intern(init)
	return session.Recipe{
		InitBody:        in.Value(),
		Interned:        in,
		ProtocolVersion: version,
		Credential:      rec.Credential,
		Nonce:           rec.Nonce,
		Expires:         rec.Expires,
		InitSealed:      rec.Carried(),
		Header:          recipeHeaders(hdr),
	}
}

// ErrBudget: the memory budget has no room for the session.
var ErrBudget = errors.New("memory budget reached")

// Admit adds a new session to the store, under the store's caps and the
// memory budget, and tells the fleet. An error means the session was not
// admitted: errBudget or session.ErrFull / ErrCredentialFull.
func (ss *Sessions) Admit(sess *session.Session) error {
	if !ss.Mem.Take(wire.SessionCost(sess)) {
		return ErrBudget
	}
	if err := ss.Store.Add(sess); err != nil {
		ss.Mem.Give(wire.SessionCost(sess))
		return err
	}
	ss.Fleet.index(sess)
	ss.Fleet.created(sess)
	return nil
}

// Lookup returns the live session sid names, restoring it from its sealed
// id when the store does not hold it. A session past its maximum age ends
// here, in memory as everywhere.
func (ss *Sessions) Lookup(sid, auth []byte) (*session.Session, bool) {
	if len(sid) > 0 && sid[0] == HeldPrefix {
		return nil, false // a held session is its agents' only by their requests' key
	}
	// The key is only read during Get, so a zero-copy view is safe.
	sess, ok := ss.Store.Get(session.ClientID(wire.B2s(sid)))
	if !ok {
		return ss.restore(sid, auth)
	}
	if sess.Expired(time.Now()) {
		ss.expire(sess)
		return nil, false
	}
	return sess, true
}

// expire ends a session that passed its maximum age: its id no longer
// opens anywhere, so only this process's copy is left to drop.
func (ss *Sessions) expire(sess *session.Session) {
	if _, ok := ss.Store.Remove(sess.ID); !ok {
		return
	}
	ss.release(sess)
	up, _ := sess.Current()
	ss.Link.DeleteLater(up, RecipeHeader(sess).PeekBytes(wire.HdrAuthorization), false)
	ss.Log.Info().Str(obs.LogSession, sess.ID.Short()).Msg("session ended: session_max_age reached")
}

// restore re-creates the session named by sid from its sealed id, or
// reports false. Unsealing happens only on a store miss.
func (ss *Sessions) restore(sid, auth []byte) (*session.Session, bool) {
	if len(sid) == 0 || sid[0] != 'm' {
		return nil, false
	}
	now := time.Now()
	rec, err := ss.Ring.Open(string(sid), now)
	if err != nil || rec.Upstream != ss.Cfg.Name || ss.Dead.Buried(rec.Nonce, rec.Expires, now) {
		return nil, false
	}
	id := session.ClientID(sid)
	// Another process may hold its upstream session, have ended it, have
	// moved it to a rotated credential, or keep the initialize its id
	// could not carry.
	st, shared := ss.Fleet.Load(context.Background(), id)
	if shared && st.Ended {
		ss.Dead.Bury(rec.Nonce, rec.Expires)
		return nil, false
	}
	b := BindingOf(auth)
	if b != rec.Credential && b != st.Binding && seal.CredentialDigest(auth) != rec.Credential {
		return nil, false // only a credential bound to it may bring it back
	}
	init := rec.Init
	if init == nil && st.Init != nil && sha256.Sum256(st.Init) == rec.InitDigest {
		init = st.Init
	}
	if init == nil {
		return nil, false // its initialize was too large for the id, and no store keeps it
	}
	in := session.Intern(init)
	recipe := session.Recipe{
		InitBody:        in.Value(),
		Interned:        in,
		ProtocolVersion: rec.Protocol,
		Credential:      rec.Credential,
		Nonce:           rec.Nonce,
		Expires:         rec.Expires,
		InitSealed:      rec.Carried(),
		Header:          ss.restoredHeaders(auth),
	}
	var sess *session.Session
	if shared && st.Gen > 0 && st.Upstream != "" {
		sess = session.Adopted(id, recipe, st.Upstream, st.Gen)
	} else {
		sess = session.Restored(id, recipe)
	}
	if st.Binding != "" && st.Binding != rec.Credential {
		sess.Rebind(st.Binding, recipe.Header)
	}
	return ss.AddRestored(sess, st)
}

// restoredHeaders are the headers a restored session uses for work on its
// behalf: the credential that brought it back.
func (ss *Sessions) restoredHeaders(auth []byte) [][2]string {
	if len(auth) == 0 || ss.Link.OwnsAuthorization() {
		return nil
	}
	return [][2]string{{"Authorization", string(auth)}}
}

// AddRestored admits a restored session, unless a concurrent request
// restored it first or it ended meanwhile.
func (ss *Sessions) AddRestored(sess *session.Session, st session.State) (*session.Session, bool) {
	ss.restoreMu.Lock()
	defer ss.restoreMu.Unlock()
	if live, ok := ss.Store.Get(sess.ID); ok {
		return live, true
	}
	if ss.Dead.Buried(sess.Recipe.Nonce, sess.Recipe.Expires, time.Now()) {
		return nil, false // ended while it was being opened
	}
	if !ss.Mem.Take(wire.SessionCost(sess)) {
		return nil, false
	}
	if err := ss.Store.Add(sess); err != nil {
		ss.Mem.Give(wire.SessionCost(sess))
		return nil, false
	}
	if st.HasJournal {
		ss.Mem.Charge(int64(sess.SetJournal(st.Journal)))
	}
	ss.Fleet.index(sess)
	ss.Count.Restored.Add(1)
	ss.Log.Info().Str(obs.LogSession, sess.ID.Short()).Msg("session restored from its id")
	return sess, true
}

// End ends the agent's session (DELETE, or a recipe the upstream refused):
// its id never opens again, here or, with a fleet, anywhere. It reports
// false when the session had ended already.
func (ss *Sessions) End(sess *session.Session, everywhere bool) bool {
	// Buried first: a request restoring the id meanwhile finds it ended.
	// The fleet hears of it last: this process hears its own event too,
	// and must not take it for another's end of the session.
	ss.Dead.Bury(sess.Recipe.Nonce, sess.Recipe.Expires)
	if _, ok := ss.Store.Remove(sess.ID); !ok {
		return false
	}
	ss.release(sess)
	if everywhere && sess.ID[0] != HeldPrefix {
		// A held id names the session of a key for good: its next
		// incarnation follows this one's generations.
		ss.Fleet.ended(sess.ID)
	}
	return true
}

// EndedElsewhere drops a session another process ended.
func (ss *Sessions) EndedElsewhere(id session.ClientID) {
	sess, ok := ss.Store.Peek(id)
	if !ok {
		return
	}
	ss.Dead.Bury(sess.Recipe.Nonce, sess.Recipe.Expires)
	if _, ok := ss.Store.Remove(id); ok {
		ss.release(sess)
		ss.Log.Info().Str(obs.LogSession, id.Short()).Msg("session ended by another process")
	}
}

// release gives back what a session held once it left the store.
func (ss *Sessions) release(sess *session.Session) {
	ss.Mem.Give(wire.SessionCost(sess) + int64(sess.DropJournal()))
	ss.Fleet.forget(sess)
	if ss.OnRelease != nil {
		ss.OnRelease(sess)
	}
}

// Dropped runs when the store expires or evicts a session: idle past
// session_ttl, past session_max_age, or making room.
func (ss *Sessions) Dropped(sess *session.Session) {
	ss.release(sess)
	up, _ := sess.Current()
	if sess.Expired(time.Now()) {
		// Its id opens nowhere any more: its upstream session is nobody's.
		ss.Log.Info().Str(obs.LogSession, sess.ID.Short()).Msg("session ended: session_max_age reached")
	} else {
		ss.Log.Info().Str(obs.LogSession, sess.ID.Short()).Msg("session expired")
		if ss.Fleet != nil {
			return // another process of the fleet may be using its upstream session
		}
	}
	ss.Link.DeleteLater(up, RecipeHeader(sess).PeekBytes(wire.HdrAuthorization), false)
}

// Journal records a change to the session's journal that the upstream (or
// the bridge) accepted, in the session and the fleet, and settles the
// memory reserved for it by the guard (reserved bytes; see
// guard.reserveJournal).
func (ss *Sessions) Journal(sess *session.Session, c session.JournalChange, reserved int64) {
	sess.UnreserveJournal(int(reserved))
	var grew int
	switch {
	case c.Level != "":
		grew = sess.SetLevel(c.Level)
	case c.URI != "":
		grew = sess.Subscribe(c.URI, c.Subscribed)
	}
	ss.Mem.Give(reserved - int64(max(grew, 0)))
	if grew < 0 {
		ss.Mem.Give(int64(-grew))
	}
	if grew != 0 || c.Level != "" {
		ss.Fleet.note(sess, c)
	}
}

// Rebind moves the session to a credential the upstream accepted: a
// rotated one (another principal: here, and in the fleet), or a new token
// of the same principal (a JWT renewed): then only the headers the session
// uses for work on its behalf change, so that a keepalive or a heal does
// not go out with a token that expired.
//
// The creator's principal is bound by the sealed id itself: coming back to
// it moves no binding, so a rotated principal the fleet recorded stays
// bound as well.
func (ss *Sessions) Rebind(sess *session.Session, auth []byte, hdr *fasthttp.RequestHeader) {
	b := BindingOf(auth)
	cred, _ := sess.Binding()
	if b == cred || b == sess.Recipe.Credential {
		sess.Rebind(cred, recipeHeaders(hdr))
		return
	}
	sess.Rebind(b, recipeHeaders(hdr))
	ss.Fleet.bind(sess, b)
	ss.Log.Info().Str(obs.LogSession, sess.ID.Short()).Msg("session credential rotated")
}

// NewRing returns the ring of Config.SessionKeys, or a ring of one key made
// up now.
func NewRing(keys string) (*seal.Ring, error) {
	if keys == "" {
		return seal.RandomRing(), nil
	}
	ks, err := seal.ParseKeys(keys)
	if err != nil {
		return nil, err
	}
	return seal.NewRing(ks)
}

// HeldPrefix starts the id of every held session (a sealed id starts with
// 'm').
const HeldPrefix = 'h'
