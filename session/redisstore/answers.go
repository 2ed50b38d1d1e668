package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mcpheal/mcpheal/session"
)

// The answers agents may resume (session.Answers), three keys each:
//
//	<prefix>a:<key>     hash: s session digest, r request id, u upstream session, v version,
//	                    o owner, n the number of the last event, l the upstream's id of it,
//	                    z bytes of the events kept
//	<prefix>a:<key>:e   stream: event n at id 0-n, field e its bytes; 1-0 marks the end
//	<prefix>a:<key>:o   the owner's lease (its value the owner, PX the lease)
//	<prefix>a:<key>:r   set while a reader follows the answer (PX session.ReaderMark)
//
// Each expires the resume window after the last write. A stream's ids are
// the events' own numbers, so an event written twice is refused the
// second time by Redis itself, a reader asks for what follows the event it
// has with XRANGE, and waits for more with XREAD BLOCK (the end marker
// wakes it too).

var _ session.Answers = (*Store)(nil)

// lastEvent is the greatest id an event can have: the end marker, 1-0,
// sorts after it.
const lastEvent = "0-18446744073709551615"

func (st *Store) answerKeys(key string) []string {
	k := st.prefix + "a:" + key
	return []string{k, k + ":e", k + ":o", k + ":r"}
}

// writeAnswer is WriteAnswer, in one step. KEYS: the hash, the stream, the
// lease. ARGV: 1 owner, 2 the first event's number, 3 the upstream's last
// id, 4 done, 5 bytes kept, 6 lease ms, 7 window ms, 8 open, 9-12 the
// hash's s r u v when open, 13 the last event's number, 14… the events.
var writeAnswer = redis.NewScript(`
if ARGV[8] == '1' then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('HSET', KEYS[1], 's', ARGV[9], 'r', ARGV[10], 'u', ARGV[11], 'v', ARGV[12], 'o', ARGV[1], 'z', '0')
else
  if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
  local held = redis.call('GET', KEYS[3])
  if held and held ~= ARGV[1] then return 0 end
end
local first = tonumber(ARGV[2])
local z = tonumber(redis.call('HGET', KEYS[1], 'z') or '0')
for i = 14, #ARGV do
  local r = redis.pcall('XADD', KEYS[2], '0-' .. (first + i - 14), 'e', ARGV[i])
  if type(r) == 'string' then z = z + string.len(ARGV[i]) end
end
local max = tonumber(ARGV[5])
while z > max do
  local head = redis.call('XRANGE', KEYS[2], '-', '` + lastEvent + `', 'COUNT', 2)
  if #head < 2 then break end
  redis.call('XDEL', KEYS[2], head[1][1])
  z = z - string.len(head[1][2][2])
end
redis.call('HSET', KEYS[1], 'z', tostring(z))
if tonumber(ARGV[13]) > tonumber(redis.call('HGET', KEYS[1], 'n') or '0') then
  redis.call('HSET', KEYS[1], 'n', ARGV[13])
  if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'l', ARGV[3]) end
end
if ARGV[4] == '1' then redis.pcall('XADD', KEYS[2], '1-0', 'e', '') end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
return 1
`)

// WriteAnswer implements session.Answers.
func (st *Store) WriteAnswer(ctx context.Context, key string, w *session.AnswerWrite) (bool, error) {
	args := make([]any, 0, 13+len(w.Events))
	args = append(args, w.Owner, w.First, w.UpLastID, flag(w.Done), w.Max, w.Lease.Milliseconds(), w.Window.Milliseconds())
	if o := w.Open; o != nil {
		args = append(args, "1", o.Session, o.Request, string(o.Upstream), o.Version)
	} else {
		args = append(args, "0", "", "", "", "")
	}
	args = append(args, max(w.Last, w.First+len(w.Events)-1))
	for _, ev := range w.Events {
		args = append(args, ev)
	}
	n, err := writeAnswer.Run(ctx, st.c, st.answerKeys(key)[:3], args...).Int()
	return n == 1, err
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// ReadAnswer implements session.Answers.
func (st *Store) ReadAnswer(ctx context.Context, key string, after int, wait time.Duration, reader bool) (session.AnswerRead, error) {
	ks := st.answerKeys(key)
	r, err := st.readAnswer(ctx, ks, after, reader)
	if err != nil || len(r.Events) > 0 || r.Done || r.Lost || wait <= 0 {
		return r, err
	}
	// Nothing new (or no log yet: its first write may be on its way): wait
	// for the next entry of the stream, an event or the end.
	err = st.wait.XRead(ctx, &redis.XReadArgs{Streams: []string{ks[1], "0-" + strconv.Itoa(after)}, Count: 1, Block: wait}).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return r, err
	}
	return st.readAnswer(ctx, ks, after, false)
}

// readAnswer is one look at an answer's log.
func (st *Store) readAnswer(ctx context.Context, ks []string, after int, reader bool) (session.AnswerRead, error) {
	p := st.c.Pipeline()
	if reader {
		p.Set(ctx, ks[3], "1", session.ReaderMark)
	}
	h := p.HGetAll(ctx, ks[0])
	evs := p.XRange(ctx, ks[1], "(0-"+strconv.Itoa(after), "+")
	head := p.XRangeN(ctx, ks[1], "-", "+", 1)
	tail := p.XRevRangeN(ctx, ks[1], lastEvent, "-", 1)
	owner, read := p.Exists(ctx, ks[2]), p.Exists(ctx, ks[3])
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return session.AnswerRead{}, err
	}
	m := h.Val()
	if len(m) == 0 {
		return session.AnswerRead{}, nil
	}
	r := session.AnswerRead{Found: true, Info: session.AnswerInfo{Session: m["s"], Request: m["r"],
		Upstream: session.UpstreamID(m["u"]), Version: m["v"], Owner: m["o"]},
		UpLastID: m["l"], OwnerLive: owner.Val() == 1, Read: read.Val() == 1, First: after + 1, Last: after}
	if hs := head.Val(); len(hs) > 0 {
		if n, ok := entryNumber(hs[0].ID); ok && n > after+1 {
			r.Lost = true // the events right after the agent's were trimmed
		}
	}
	r.Numbered, _ = strconv.Atoi(m["n"])
	if ts := tail.Val(); len(ts) > 0 {
		r.Tail, _ = entryNumber(ts[0].ID)
	}
	for _, e := range evs.Val() {
		n, ok := entryNumber(e.ID)
		if !ok {
			r.Done = true // the end marker
			break
		}
		if len(r.Events) == 0 {
			r.First = n
			r.Lost = r.Lost || n > after+1 // an event too large to keep was left out
		}
		s, _ := e.Values["e"].(string)
		r.Events = append(r.Events, []byte(s))
		r.Last = n
	}
	return r, nil
}

// entryNumber reads the event number of a stream entry id "0-n"; false
// for the end marker.
func entryNumber(id string) (int, bool) {
	rest, ok := strings.CutPrefix(id, "0-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil
}

// takeAnswer is TakeAnswer: ARGV 1 the new owner, 2 its lease in ms. An
// ended answer is nobody's to take.
var takeAnswer = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('XRANGE', KEYS[2], '1-0', '1-0')[1] then return 0 end
if not redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'o', ARGV[1])
return 1
`)

// TakeAnswer implements session.Answers.
func (st *Store) TakeAnswer(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	n, err := takeAnswer.Run(ctx, st.c, st.answerKeys(key)[:3], owner, lease.Milliseconds()).Int()
	return n == 1, err
}

// dropAnswer is DropAnswer: ARGV 1 the owner.
var dropAnswer = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return 1
`)

// DropAnswer implements session.Answers.
func (st *Store) DropAnswer(ctx context.Context, key, owner string) error {
	return dropAnswer.Run(ctx, st.c, st.answerKeys(key), owner).Err()
}
