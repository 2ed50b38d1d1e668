package wire

import (
	"errors"
	"sync/atomic"

	"github.com/mcpheal/mcpheal/session"
)

// Budget is the memory an upstream's sessions may hold (Config.MemoryBudget):
// session state, and upstream answers while they are buffered. Taking more
// than is left fails; nothing is ever evicted to make room. A new session
// past the budget gets 503 -32015, an answer that would be buffered past it
// 503 -32017: the agents at work keep what they hold.
//
// What is counted is what grows with what agents and upstreams send: per
// session, its recorded initialize and headers plus a fixed overhead (the
// session, its journal, the store's entries); per JSON answer, twice its
// body (its buffer grows by doubling), from its first byte as it is read
// (upstream.Response.SetBudget; one with a Content-Length at once) until
// the agent's connection has taken it: the agent's answer is written from
// that buffer (jsonBody), so a slow agent's answer stays counted, for at
// most write_timeout. An SSE answer relayed line by line holds one read
// buffer, not counted, and at most one held line (max_sse_line), counted
// past freeHold (holdMeter), as are the events a route reads whole.
type Budget struct {
	Limit int64
	Used  atomic.Int64
}

// FreeHold is what a stream may hold whole without counting it (a line,
// an event): the read buffer's size, which every stream has anyway. Past
// it, holdMeter counts what is held.
const FreeHold = 64 << 10

// ErrHoldBudget ends a stream that would hold a line or an event whole
// past freeHold, and the budget has no room for it.
var ErrHoldBudget = errors.New("memory_budget reached holding an event")

// holdMeter counts in the budget what a stream holds whole past freeHold:
// a line the relay must see whole (an id, a server→client request it
// renumbers after a heal), an event a route reads itself and its copies
// (the held route, the bridge), an event of a GET stream. Without it, a
// server sending large events to many calls at once would make mcpheal
// hold them outside memory_budget. Its zero value (no budget) counts
// nothing; it is not safe for concurrent use.
type holdMeter struct {
	Mem *Budget
	// Charged is what is counted now; read by a reset that releases only
	// what is held (most streams hold nothing past FreeHold).
	Charged int64
}

// Hold makes the charge n bytes, or nothing for n ≤ freeHold, taking or
// giving back the difference. It reports false, the charge unchanged,
// when the budget has no room.
func (m *holdMeter) Hold(n int) bool {
	if m.Mem == nil {
		return true
	}
	want := int64(0)
	if n > FreeHold {
		want = int64(n)
	}
	switch d := want - m.Charged; {
	case d > 0:
		if !m.Mem.Take(d) {
			return false
		}
	case d < 0:
		m.Mem.Give(-d)
	}
	m.Charged = want
	return true
}

// Release gives the charge back.
func (m *holdMeter) Release() { m.Hold(0) }

// sessionOverhead approximates what one session costs beyond its recipe.
const sessionOverhead = 2 << 10

// Take reserves n bytes; false when that would pass the limit. It is also
// upstream.Budget's, by which a JSON answer is charged as it is read.
func (b *Budget) Take(n int64) bool {
	for {
		u := b.Used.Load()
		if u+n > b.Limit {
			return false
		}
		if b.Used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Give returns n bytes taken before.
func (b *Budget) Give(n int64) { b.Used.Add(-n) }

// Charge counts n bytes whatever is left: state mcpheal must hold once it
// exists (a journal adopted from the fleet, within its per-session cap; a
// server's discover answer). Negative n gives back.
func (b *Budget) Charge(n int64) { b.Used.Add(n) }

// SessionCost is what a session is counted for, the same when it is
// admitted and when it leaves.
func SessionCost(sess *session.Session) int64 {
	n := sessionOverhead + len(sess.Recipe.InitBody)
	for _, kv := range sess.Recipe.Header {
		n += len(kv[0]) + len(kv[1])
	}
	return int64(n)
}
