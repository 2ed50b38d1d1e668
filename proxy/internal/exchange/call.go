package exchange

import (
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// call is what an attempt sends upstream: the agent's request, the
// session it goes on and how it may be sent. The attempt's loop changes it
// (a heal points it at the new upstream session, judge may learn that the
// call is replay-safe); its answer stream reads it (stream.go).
type call struct {
	S    *Env
	Ctx  *fasthttp.RequestCtx // the agent's; nil once the handler has returned (a bridged call's later rounds)
	R    *Request
	Sess *session.Session // the agent's session; nil for 2026-07-28 pass-through
	Msg  wire.Message     // by value: the attempt is pooled, so nothing escapes
	Req  *fasthttp.Request
	up   session.UpstreamID
	Gen  uint64
	// heals: the upstream holds a session for this request that mcpheal
	// may re-create (a session-era upstream; not the bridge).
	Heals bool
	// replaySafe: the request may run twice without harm (replayable);
	// decided before the first send, and learnt later at most once (judge).
	replaySafe bool
	// watch notices the agent going away while it waits (agentwatch.go); nil
	// for attempts that are not pooled. It stays with the pooled attempt.
	Watch *agentWatch
}

// AgentGone reports whether the agent closed its connection while the
// attempt waited on the upstream.
func (c *call) AgentGone() bool { return c.Watch != nil && c.Watch.Gone.Load() }

// Unwatch stops watching the agent's connection, and counts and logs an
// agent that went away.
func (c *call) Unwatch() {
	if c.Watch == nil || !c.Watch.Stop() {
		return
	}
	c.S.Count.AgentGone.Add(1)
	c.S.Log.Debug().Str(obs.LogMethod, obs.LogText(c.Msg.Method)).Str(obs.LogTool, obs.LogText(c.Msg.Tool)).
		Msg("agent closed its connection while its request waited on the upstream; upstream exchange interrupted")
}
