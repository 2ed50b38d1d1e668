// Package redisstore keeps the fleet-wide state of mcpheal sessions
// (session.Shared) in Redis or Valkey, so that several mcpheal replicas
// serve and heal the same sessions, and a restarted one finds them as they
// were.
//
// One hash per session, under a key derived from the session id (the id
// itself, a sealed record, never reaches Redis):
//
//	mcpheal:<upstream>:<sha256(id)[:16] hex>   the session's hash, fields:
//	    gen, up       generation and upstream session id (Advance)
//	    n             "1": a journal change was noted, even if none is left
//	    l             the last logging/setLevel params (Note)
//	    s:<uri>       "1" per subscribed resource URI (Note)
//	    b             the credential binding (Bind)
//	    i             the initialize, when the id holds only its digest; for a held
//	                  session, the upstream's answer to it (SaveRecipe)
//	    j             the whole journal as JSON, written by older mcpheal (read, then replaced)
//	    end           "1": the tombstone of an ended session, alone in the hash
//	... :lead:<gen>                             the heal lease of one generation
//	mcpheal:<upstream>:events                   pub/sub: heals and ends, for the other replicas
//
// Every key expires (Config.TTL, the sealed id's own lifetime), so nothing
// outlives the ids that could name it. Advance is one Lua script: the
// compare-and-set on the generation that makes one heal per generation
// fleet-wide. Every other write to the hash is one Lua script too, which
// leaves a tombstone alone: a late write never brings an ended session
// back. The journal is kept one field per subscription so that a change
// sends and rewrites only itself, whatever the number of subscriptions.
package redisstore

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mcpheal/mcpheal/session"
)

// Config configures a Store.
type Config struct {
	// Addr is host:port of the Redis or Valkey server.
	Addr string
	// Username and Password authenticate (ACL or requirepass); empty for
	// none.
	Username, Password string
	// DB is the database number.
	DB int
	// TLS, when not nil, connects over TLS with this configuration.
	TLS *tls.Config
	// Prefix separates the sessions of one upstream from another's that
	// share the server: the upstream's name.
	Prefix string
	// TTL is how long a key lives after its last write: the sealed ids'
	// lifetime. Zero means 7 days.
	TTL time.Duration
	// Timeout bounds each dial, read and write. Zero means 250 ms: a slow
	// store must not hold a heal for long (the proxy then heals alone).
	Timeout time.Duration
}

// Store is session.Shared on Redis.
type Store struct {
	c      *redis.Client
	prefix string
	ttl    time.Duration
	// wait is the client of the answer logs' blocking reads (answers.go),
	// with a pool of its own: agents following answers hold connections
	// for seconds, and must not starve the session lookups of c.
	wait *redis.Client
}

var (
	_ session.Shared  = (*Store)(nil)
	_ session.Watcher = (*Store)(nil)
)

// New returns a Store. It does not connect until first used; Ping checks
// the server.
func New(cfg Config) (*Store, error) {
	if cfg.Addr == "" {
		return nil, errors.New("redisstore: no address")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 7 * 24 * time.Hour
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 250 * time.Millisecond
	}
	quietOnce.Do(func() { redis.SetLogger(quiet{}) })
	opts := &redis.Options{
		Addr:         cfg.Addr,
		Username:     cfg.Username,
		Password:     cfg.Password,
		DB:           cfg.DB,
		TLSConfig:    cfg.TLS,
		DialTimeout:  cfg.Timeout,
		ReadTimeout:  cfg.Timeout,
		WriteTimeout: cfg.Timeout,
		PoolTimeout:  cfg.Timeout,
		// One retry: the proxy bounds every call by its own deadline and
		// heals alone when the store does not answer.
		MaxRetries:            1,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true, // no CLIENT SETINFO: older servers and proxies refuse it
	}
	wait := *opts
	wait.PoolSize = waitPool
	return &Store{c: redis.NewClient(opts), wait: redis.NewClient(&wait), prefix: "mcpheal:" + cfg.Prefix + ":", ttl: cfg.TTL}, nil
}

// waitPool bounds the connections blocked in answer reads at once, per
// process: past it a read fails after Timeout, and its agent's stream ends
// (its SDK resumes again).
const waitPool = 128

// For returns a Store over the same connections for another upstream's
// sessions (Config.Prefix = prefix).
func (st *Store) For(prefix string) *Store {
	return &Store{c: st.c, wait: st.wait, prefix: "mcpheal:" + prefix + ":", ttl: st.ttl}
}

// quiet drops go-redis's own log lines (dial failures, pool notes): the
// proxy logs and counts every failed store call itself, once.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

var quietOnce sync.Once

// Close closes the connections.
func (st *Store) Close() error { return errors.Join(st.c.Close(), st.wait.Close()) }

// Ping checks that the server answers.
func (st *Store) Ping(ctx context.Context) error { return st.c.Ping(ctx).Err() }

func (st *Store) key(id session.ClientID) string { return st.prefix + st.Key(id) }

// Key implements session.Watcher: the digest that names the session in
// Redis keys and events.
func (st *Store) Key(id session.ClientID) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:16])
}

// channel carries this prefix's events: "a <key> <gen> <upstream id>"
// after a won Advance, "e <key>" after End, "s <key> <owner>" (Tell) when a
// process opens the session's GET stream.
func (st *Store) channel() string { return st.prefix + "events" }

// Watch implements session.Watcher. go-redis resubscribes after a lost
// connection; events sent meanwhile are lost, which Watcher allows.
func (st *Store) Watch(ctx context.Context, fn func(session.Event)) {
	ps := st.c.Subscribe(ctx, st.channel())
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			if e, ok := parseEvent(m.Payload); ok {
				fn(e)
			}
		}
	}
}

// Tell implements session.Watcher.
func (st *Store) Tell(ctx context.Context, e session.Event) error {
	if !e.Stream || e.Key == "" || e.Owner == "" || strings.ContainsAny(e.Owner+e.Key, " ") {
		return errors.New("redisstore: only a Stream event with a key and an owner is told")
	}
	return st.c.Publish(ctx, st.channel(), "s "+e.Key+" "+e.Owner).Err()
}

// parseEvent reads one events-channel message.
func parseEvent(p string) (session.Event, bool) {
	kind, rest, _ := strings.Cut(p, " ")
	key, rest, _ := strings.Cut(rest, " ")
	if key == "" {
		return session.Event{}, false
	}
	switch kind {
	case "e":
		return session.Event{Key: key, Ended: true}, true
	case "s":
		if rest == "" {
			return session.Event{}, false
		}
		return session.Event{Key: key, Stream: true, Owner: rest}, true
	case "a":
		g, up, _ := strings.Cut(rest, " ")
		gen, err := strconv.ParseUint(g, 10, 64)
		if err != nil || up == "" {
			return session.Event{}, false
		}
		return session.Event{Key: key, Upstream: session.UpstreamID(up), Gen: gen}, true
	}
	return session.Event{}, false
}

// oldJournal is the JSON of session.Journal in the hash's j field, where
// mcpheal kept the whole journal before it kept one field per change. A
// fleet upgraded in place still holds such hashes until they expire: Load
// reads them, and the first write migrates them (write).
type oldJournal struct {
	Level string   `json:"l,omitempty"`
	Subs  []string `json:"s,omitempty"`
}

// subPrefix starts the field of each subscribed URI. No other field holds
// a colon, so no URI can be mistaken for one.
const subPrefix = "s:"

// Load implements session.Shared.
func (st *Store) Load(ctx context.Context, id session.ClientID) (session.State, error) {
	h, err := st.c.HGetAll(ctx, st.key(id)).Result()
	if err != nil {
		return session.State{}, fmt.Errorf("redisstore: load: %w", err)
	}
	var s session.State
	if _, s.Ended = h["end"]; s.Ended {
		return s, nil
	}
	if g, ok := h["gen"]; ok {
		if s.Gen, err = strconv.ParseUint(g, 10, 64); err != nil {
			return session.State{}, fmt.Errorf("redisstore: load: bad generation %q", g)
		}
		s.Upstream = session.UpstreamID(h["up"])
	}
	s.Binding = h["b"]
	if i := h["i"]; i != "" {
		s.Init = []byte(i)
	}
	if j, ok := h["j"]; ok {
		// Written by an older mcpheal after any field of the journal here
		// (every write of ours replaces j with fields): it is the journal.
		var v oldJournal
		if err := json.Unmarshal([]byte(j), &v); err != nil {
			return session.State{}, fmt.Errorf("redisstore: load: bad journal: %w", err)
		}
		s.Journal = session.Journal{Level: v.Level, Subscriptions: v.Subs}
		slices.Sort(s.Journal.Subscriptions)
		s.HasJournal = true
		return s, nil
	}
	// n, not the fields left: a session whose subscriptions were all
	// removed still has a journal, an empty one.
	_, s.HasJournal = h["n"]
	s.Journal.Level = h["l"]
	for f := range h {
		if uri, ok := strings.CutPrefix(f, subPrefix); ok {
			s.Journal.Subscriptions = append(s.Journal.Subscriptions, uri)
		}
	}
	slices.Sort(s.Journal.Subscriptions)
	return s, nil
}

// advance is the compare-and-set on the generation, told on the events
// channel (KEYS[2]) when it wins. It returns {won, gen, up, ended}.
var advance = redis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'gen', 'up', 'end')
if h[3] then return {0, '0', '', 1} end
local g = tonumber(h[1] or '0')
local from = tonumber(ARGV[1])
if g > from then return {0, tostring(h[1]), h[2] or '', 0} end
redis.call('HSET', KEYS[1], 'gen', tostring(from + 1), 'up', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', KEYS[2], 'a ' .. ARGV[4] .. ' ' .. tostring(from + 1) .. ' ' .. ARGV[2])
return {1, tostring(from + 1), ARGV[2], 0}
`)

// Advance implements session.Shared.
func (st *Store) Advance(ctx context.Context, id session.ClientID, from uint64, up session.UpstreamID) (session.State, bool, error) {
	v, err := advance.Run(ctx, st.c, []string{st.key(id), st.channel()}, strconv.FormatUint(from, 10), string(up),
		st.ttl.Milliseconds(), st.Key(id)).Slice()
	if err != nil {
		return session.State{}, false, err
	}
	if len(v) != 4 {
		return session.State{}, false, fmt.Errorf("redisstore: advance returned %d values", len(v))
	}
	won, _ := v[0].(int64)
	gs, _ := v[1].(string)
	ups, _ := v[2].(string)
	ended, _ := v[3].(int64)
	gen, err := strconv.ParseUint(gs, 10, 64)
	if err != nil {
		return session.State{}, false, fmt.Errorf("redisstore: bad generation %q", gs)
	}
	s := session.State{Upstream: session.UpstreamID(ups), Gen: gen, Ended: ended == 1}
	// A retried script that had already run finds its own write.
	return s, won == 1 || (!s.Ended && gen == from+1 && s.Upstream == up), nil
}

// Lead implements session.Shared.
func (st *Store) Lead(ctx context.Context, id session.ClientID, gen uint64, ttl time.Duration) (bool, error) {
	return st.c.SetNX(ctx, st.key(id)+":lead:"+strconv.FormatUint(gen, 10), "1", max(ttl, time.Millisecond)).Result()
}

// write changes the hash KEYS[1] unless it is a tombstone: it deletes the
// field ARGV[2] (none when empty), sets the fields and values that follow,
// and makes the key live ARGV[1] ms again. It returns 0 on a tombstone, 1
// otherwise. A journal an older mcpheal wrote whole (j) first becomes
// fields, replacing any the hash holds: j is newer, since every run of this
// script removes it.
var write = redis.NewScript(`
local k = KEYS[1]
if redis.call('HEXISTS', k, 'end') == 1 then return 0 end
local j = redis.call('HGET', k, 'j')
if j then
  local v = cjson.decode(j)
  for _, f in ipairs(redis.call('HKEYS', k)) do
    if f == 'l' or string.sub(f, 1, 2) == 's:' then redis.call('HDEL', k, f) end
  end
  if type(v.l) == 'string' and v.l ~= '' then redis.call('HSET', k, 'l', v.l) end
  if type(v.s) == 'table' then
    for _, uri in ipairs(v.s) do redis.call('HSET', k, 's:' .. uri, '1') end
  end
  redis.call('HSET', k, 'n', '1')
  redis.call('HDEL', k, 'j')
end
if ARGV[2] ~= '' then redis.call('HDEL', k, ARGV[2]) end
if #ARGV > 2 then redis.call('HSET', k, unpack(ARGV, 3)) end
redis.call('PEXPIRE', k, ARGV[1])
return 1
`)

// write runs the write script on id's hash (one round trip; the script
// travels once per server, then by its digest).
func (st *Store) write(ctx context.Context, id session.ClientID, del string, set ...any) error {
	return write.Run(ctx, st.c, []string{st.key(id)}, append([]any{st.ttl.Milliseconds(), del}, set...)...).Err()
}

// Note implements session.Shared: a subscription is one field, set or
// deleted, so a change costs the same however many the session holds.
func (st *Store) Note(ctx context.Context, id session.ClientID, c session.JournalChange) error {
	var del string
	set := []any{"n", "1"}
	if c.Level != "" {
		set = append(set, "l", c.Level)
	}
	switch {
	case c.URI == "":
	case c.Subscribed:
		set = append(set, subPrefix+c.URI, "1")
	default:
		del = subPrefix + c.URI
	}
	if err := st.write(ctx, id, del, set...); err != nil {
		return fmt.Errorf("redisstore: note: %w", err)
	}
	return nil
}

// Bind implements session.Shared.
func (st *Store) Bind(ctx context.Context, id session.ClientID, binding string) error {
	if err := st.write(ctx, id, "", "b", binding); err != nil {
		return fmt.Errorf("redisstore: bind: %w", err)
	}
	return nil
}

// SaveRecipe implements session.Shared.
func (st *Store) SaveRecipe(ctx context.Context, id session.ClientID, init []byte) error {
	if err := st.write(ctx, id, "", "i", init); err != nil {
		return fmt.Errorf("redisstore: save recipe: %w", err)
	}
	return nil
}

// End implements session.Shared: the hash becomes a tombstone.
func (st *Store) End(ctx context.Context, id session.ClientID) error {
	k := st.key(id)
	_, err := st.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, k)
		p.HSet(ctx, k, "end", "1")
		p.PExpire(ctx, k, st.ttl)
		p.Publish(ctx, st.channel(), "e "+st.Key(id))
		return nil
	})
	return err
}
