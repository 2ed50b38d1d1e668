package proxy

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
	"github.com/mcpheal/mcpheal/session"
)

// replayJournal restores the journal on a new upstream session: the log
// level, then every subscription. A failure is logged and counted, never
// fatal: the agent's request still goes through.
func (h *healer) replayJournal(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, up session.UpstreamID) {
	j := sess.Journal()
	if j.Level == "" && len(j.Subscriptions) == 0 {
		return
	}
	ctx, sp := h.trace.child(ctx, "mcpheal journal replay", attribute.Int("mcpheal.journal.subscriptions", len(j.Subscriptions)))
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

func (h *healer) journalCall(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, up session.UpstreamID, method, params string) {
	body := `{"jsonrpc":"2.0","id":` + h.link.upcallID("journal") + `,"method":"` + method + `","params":` + params + `}`
	cls, err := h.sessionCall(ctx, hdr, sess, up, body, nil)
	if cls == classify.OK {
		h.count.journal[outcomeOK].Add(1)
		return
	}
	h.count.journal[outcomeFailed].Add(1)
	h.log.Warn().Str(logSession, sess.ID.Short()).Str(logMethod, logText(method)).Stringer(logClass, cls).Err(err).
		Msg("journal replay failed")
}

// sessionCall sends one proxy-made request on an upstream session and
// classifies the answer; result, if not nil, receives the answer's result.
func (h *healer) sessionCall(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, up session.UpstreamID, body string, result *[]byte) (classify.Class, error) {
	rep, err := h.link.call(&upcall{hdr: hdr, session: up, version: sess.Recipe.ProtocolVersion, body: []byte(body),
		deadline: deadlineOf(ctx, time.Now().Add(h.cfg.HealTimeout)), ctx: ctx, name: gjson.Get(body, "method").Str})
	if err != nil {
		return rep.class, err
	}
	if rep.class != classify.OK {
		return rep.class, errors.New(rep.describe())
	}
	if result != nil {
		*result = append((*result)[:0], gjson.GetBytes(rep.msg, "result").Raw...)
	}
	return rep.class, nil
}

// listChanged is the notification that tells the agent to list tools again
// (MCP server/tools: notifications/tools/list_changed).
var listChanged = sse.AppendEvent(nil, "message", []byte(`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`))

// toolsDue lists the session's tools in the background if they are due
// (Session.DueTools).
func (h *healer) toolsDue(sess *session.Session) {
	if due, notify := sess.TakeDueTools(); due && h.bg.Add(1) {
		go h.refreshTools(sess, recipeHeader(sess), notify)
	}
}

// refreshTools lists the session's tools upstream itself and learns them
// (learnTools: the annotations the replay rules read, the list the next
// check compares): after a heal when the agent has listed tools, so that
// an agent whose new upstream session lists different tools (a server
// restarted with another version) is told on its GET stream (notify); and
// for a held session when it is held and when the upstream says its list
// changed, so that a 2026-07-28 agent's call is judged on its tool's
// annotations whether or not the agent listed tools (the upstream's own
// notification reached the agent: notify false).
func (h *healer) refreshTools(sess *session.Session, hdr *fasthttp.RequestHeader, notify bool) {
	defer h.bg.Done()
	defer func() {
		if p := recover(); p != nil {
			h.count.panics.Add(1)
			h.log.Error().Interface("panic", p).Msg("tools/list after heal panicked")
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.HealTimeout)
	defer cancel()
	up, _ := sess.Current()
	var result []byte
	if cls, err := h.sessionCall(ctx, hdr, sess, up, `{"jsonrpc":"2.0","id":`+h.link.upcallID("tools")+`,"method":"tools/list"}`, &result); err != nil {
		h.log.Debug().Str(logSession, sess.ID.Short()).Stringer(logClass, cls).Err(err).Msg("tools/list to learn the session's tools failed")
		return
	}
	msg := append(append([]byte(`{"result":`), result...), '}')
	changed := learnTools(sess, msg)
	if changed && notify {
		h.streams.inject(sess.ID, listChanged)
		h.log.Info().Str(logSession, sess.ID.Short()).Msg("tool list changed across the heal; agent notified")
		return
	}
	h.log.Debug().Str(logSession, sess.ID.Short()).Bool("changed", changed).Msg("tool list learnt")
}
