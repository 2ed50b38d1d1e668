package heal

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/session"
)

// replayJournal restores the journal on a new upstream session: the log
// level, then every subscription. A failure is logged and counted, never
// fatal: the agent's request still goes through.
func (h *Healer) replayJournal(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, up session.UpstreamID) {
	j := sess.Journal()
	if j.Level == "" && len(j.Subscriptions) == 0 {
		return
	}
	ctx, sp := h.Trace.Child(ctx, "mcpheal journal replay", attribute.Int("mcpheal.journal.subscriptions", len(j.Subscriptions)))
	if sp != nil {
		defer sp.End()
	}
	if j.Level != "" {
		h.journalCall(ctx, hdr, sess, up, "logging/setLevel", j.Level)
	}
	for _, uri := range j.Subscriptions {
		params := `{"uri":` + strconv.Quote(uri) + `}`
		h.journalCall(ctx, hdr, sess, up, "resources/subscribe", params)
	}
}

func (h *Healer) journalCall(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, up session.UpstreamID, method, params string) {
	body := `{"jsonrpc":"2.0","id":` + h.Link.UpcallID("journal") + `,"method":"` + method + `","params":` + params + `}`
	cls, err := h.SessionCall(ctx, hdr, sess, up, body, nil)
	if cls == classify.OK {
		h.Count.Journal[obs.OutcomeOK].Add(1)
		return
	}
	h.Count.Journal[obs.OutcomeFailed].Add(1)
	h.Log.Warn().Str(obs.LogSession, sess.ID.Short()).Str(obs.LogMethod, obs.LogText(method)).Stringer(obs.LogClass, cls).Err(err).
		Msg("journal replay failed")
}

// SessionCall sends one proxy-made request on an upstream session and
// classifies the answer; result, if not nil, receives the answer's result.
func (h *Healer) SessionCall(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, up session.UpstreamID, body string, result *[]byte) (classify.Class, error) {
	rep, err := h.Link.Call(&link.Upcall{Hdr: hdr, Session: up, Version: sess.Recipe.ProtocolVersion, Body: []byte(body),
		Deadline: deadlineOf(ctx, time.Now().Add(h.Cfg.HealTimeout)), Ctx: ctx, Name: gjson.Get(body, "method").Str})
	if err != nil {
		return rep.Class, err
	}
	if rep.Class != classify.OK {
		return rep.Class, errors.New(rep.Describe())
	}
	if result != nil {
		*result = append((*result)[:0], gjson.GetBytes(rep.Msg, "result").Raw...)
	}
	return rep.Class, nil
}

// listChanged is the notification that tells the agent to list tools again
// (MCP server/tools: notifications/tools/list_changed).
var listChanged = sse.AppendEvent(nil, "message", []byte(`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`))

// ToolsDue lists the session's tools in the background if they are due
// (Session.DueTools).
func (h *Healer) ToolsDue(sess *session.Session) {
	if due, notify := sess.TakeDueTools(); due && h.Bg.Add(1) {
		go h.RefreshTools(sess, RecipeHeader(sess), notify)
	}
}

// RefreshTools lists the session's tools upstream itself and learns them
// (learnTools: the annotations the replay rules read, the list the next
// check compares): after a heal when the agent has listed tools, so that
// an agent whose new upstream session lists different tools (a server
// restarted with another version) is told on its GET stream (notify); and
// for a held session when it is held and when the upstream says its list
// changed, so that a 2026-07-28 agent's call is judged on its tool's
// annotations whether or not the agent listed tools (the upstream's own
// notification reached the agent: notify false).
func (h *Healer) RefreshTools(sess *session.Session, hdr *fasthttp.RequestHeader, notify bool) {
	defer h.Bg.Done()
	defer func() {
		if p := recover(); p != nil {
			h.Count.Panics.Add(1)
			h.Log.Error().Interface("panic", p).Msg("tools/list after heal panicked")
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), h.Cfg.HealTimeout)
	defer cancel()
	up, _ := sess.Current()
	var result []byte
	if cls, err := h.SessionCall(ctx, hdr, sess, up, `{"jsonrpc":"2.0","id":`+h.Link.UpcallID("tools")+`,"method":"tools/list"}`, &result); err != nil {
		h.Log.Debug().Str(obs.LogSession, sess.ID.Short()).Stringer(obs.LogClass, cls).Err(err).Msg("tools/list to learn the session's tools failed")
		return
	}
	msg := append(append([]byte(`{"result":`), result...), '}')
	changed := LearnTools(sess, msg)
	if changed && notify {
		h.Streams.Inject(sess.ID, listChanged)
		h.Log.Info().Str(obs.LogSession, sess.ID.Short()).Msg("tool list changed across the heal; agent notified")
		return
	}
	h.Log.Debug().Str(obs.LogSession, sess.ID.Short()).Bool("changed", changed).Msg("tool list learnt")
}
