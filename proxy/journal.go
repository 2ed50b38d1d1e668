package proxy

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
)

// noteJournal records session state the agent set up through a request the
// upstream accepted, so that a re-init (here or, with a shared store, in
// another process) can restore it.
func (s *Server) noteJournal(sess *session.Session, m *message, body []byte) {
	switch m.method {
	case "logging/setLevel":
		if p := gjson.GetBytes(body, "params"); p.IsObject() {
			sess.SetLevel(p.Raw)
			s.saveJournal(sess)
		}
	case "resources/subscribe", "resources/unsubscribe":
		if uri := gjson.GetBytes(body, "params.uri").Str; uri != "" {
			sess.Subscribe(uri, m.method == "resources/subscribe")
			s.saveJournal(sess)
		}
	}
}

// replayJournal restores the journal on a new upstream session: the log
// level, then every subscription. A failure is logged and counted, never
// fatal: the agent's request still goes through.
func (s *Server) replayJournal(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, up session.UpstreamID) {
	j := sess.Journal()
	if j.Level != "" {
		s.journalCall(ctx, hdr, sess, up, "logging/setLevel", j.Level)
	}
	for _, uri := range j.Subscriptions {
		params := `{"uri":` + strconv.Quote(uri) + `}`
		s.journalCall(ctx, hdr, sess, up, "resources/subscribe", params)
	}
}

func (s *Server) journalCall(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, up session.UpstreamID, method, params string) {
	body := `{"jsonrpc":"2.0","id":` + s.upcallID("journal") + `,"method":"` + method + `","params":` + params + `}`
	cls, err := s.sessionCall(ctx, hdr, sess, up, body, nil)
	if cls == classify.OK {
		s.count.journal[outcomeOK].Add(1)
		return
	}
	s.count.journal[outcomeFailed].Add(1)
	s.log.Warn().Str(logSession, sess.ID.Short()).Str(logMethod, method).Stringer(logClass, cls).Err(err).
		Msg("journal replay failed")
}

// sessionCall sends one proxy-made request on an upstream session and
// classifies the answer; result, if not nil, receives the answer's result.
func (s *Server) sessionCall(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, up session.UpstreamID, body string, result *[]byte) (classify.Class, error) {
	rep, err := s.call(&upcall{hdr: hdr, session: up, version: sess.Recipe.ProtocolVersion, body: []byte(body),
		deadline: deadlineOf(ctx, time.Now().Add(s.cfg.HealTimeout))})
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
var listChanged = []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n")

// checkTools runs after a heal when the agent has listed tools: if the new
// upstream session lists different tools (a server restarted with another
// version), the agent is told on its GET stream.
func (s *Server) checkTools(sess *session.Session, hdr *fasthttp.RequestHeader) {
	defer s.bg.Done()
	defer func() {
		if p := recover(); p != nil {
			s.count.panics.Add(1)
			s.log.Error().Interface("panic", p).Msg("tools/list after heal panicked")
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HealTimeout)
	defer cancel()
	up, _ := sess.Current()
	var result []byte
	if cls, err := s.sessionCall(ctx, hdr, sess, up, `{"jsonrpc":"2.0","id":`+s.upcallID("tools")+`,"method":"tools/list"}`, &result); err != nil {
		s.log.Debug().Str(logSession, sess.ID.Short()).Stringer(logClass, cls).Err(err).Msg("tools/list after heal failed")
		return
	}
	if sess.SeeTools(result) {
		s.log.Info().Str(logSession, sess.ID.Short()).Msg("tool list changed across the heal; agent notified")
		s.streams.inject(sess.ID, listChanged)
	}
}
