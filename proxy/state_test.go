package proxy

// Streams and session state survive a heal (docs/streams.md "Streams and session
// state across a heal"). The tests run the
// official Go SDK server (peers.StartGoSDK) behind the proxy and, mostly, the
// official Go SDK client in front of it (raw HTTP where the wire itself is
// the subject: keepalive comments, Last-Event-ID), kill the upstream
// session (ExpireSessions: the server forgets it; Restart: the process dies
// and comes back empty) and check what the agent sees afterwards. A
// wireTap on the client records what crossed the wire between client and
// proxy.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/session"
)

// stateDeaths are the two ways an upstream session dies.
var stateDeaths = []struct {
	name string
	kill func(*peers.Server)
}{
	{"expire", (*peers.Server).ExpireSessions},
	{"restart", (*peers.Server).Restart},
}

// TestStateSubscriptionAcrossHeal: the agent subscribes to a resource (and
// subscribes to, then unsubscribes from, another), the upstream session
// dies and heals; an update of the resource by the new upstream session
// reaches the agent, which never subscribed again: the proxy replayed the
// subscription, and only the active one.
func TestStateSubscriptionAcrossHeal(t *testing.T) {
	t.Parallel()
	const dropped = "test://peer/unsubscribed"
	for _, death := range stateDeaths {
		t.Run(death.name, func(t *testing.T) {
			t.Parallel()
			up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
			_, url := startProxy(t, up.URL(), nil)
			var updated inbox
			cs := peers.GoSDKClientWith(t, url, &mcp.ClientOptions{
				ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
					updated.add(req.Params.URI)
				},
			})
			ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
			defer cancel()
			for _, uri := range []string{peers.ResourceURI, dropped} {
				if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
					t.Fatalf("Subscribe(%s): %v", uri, err)
				}
			}
			if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: dropped}); err != nil {
				t.Fatalf("Unsubscribe(%s): %v", dropped, err)
			}
			nudge(t, "resources/updated before the heal", func() { up.UpdateResource(peers.ResourceURI) },
				func() bool { return updated.count(peers.ResourceURI) > 0 })

			death.kill(up)
			peers.CallEcho(t, cs, "heal")
			seen := updated.count(peers.ResourceURI)
			nudge(t, "resources/updated after the heal", func() {
				up.UpdateResource(dropped) // first: it would arrive before the other
				up.UpdateResource(peers.ResourceURI)
			}, func() bool { return updated.count(peers.ResourceURI) > seen })
			if n := updated.count(dropped); n != 0 {
				t.Errorf("agent got %d resources/updated for %s, which it unsubscribed from", n, dropped)
			}

			if got := agentParams(up, "resources/subscribe", "uri"); !slices.Equal(got, []string{peers.ResourceURI, dropped}) {
				t.Errorf("agent's resources/subscribe upstream = %q, want its own two only", got)
			}
			if got := journalParams(up, "resources/subscribe", "uri"); !slices.Equal(got, []string{peers.ResourceURI}) {
				t.Errorf("proxy's replayed resources/subscribe = %q, want [%s] once (one heal)", got, peers.ResourceURI)
			}
		})
	}
}

// TestStateLogLevelAcrossHeal: the agent sets its log level, the upstream
// session dies and heals, and a tool logs: the agent gets the messages at
// or above the level it last set, and none below it. A fresh go-sdk session
// sends no log message at all until logging/setLevel, so anything received
// after the heal came through the replayed level.
func TestStateLogLevelAcrossHeal(t *testing.T) {
	t.Parallel()
	type entry struct{ level, text string }
	cases := []struct {
		name    string
		levels  []string // the agent's logging/setLevel calls, in order
		logs    []entry  // logged after the heal, in order
		want    []string // texts the agent receives
		notWant []string
	}{{
		name:   "debug",
		levels: []string{"debug"},
		logs:   []entry{{"debug", "after-debug"}, {"info", "after-info"}},
		want:   []string{"after-debug", "after-info"},
	}, {
		name:    "last level wins",
		levels:  []string{"debug", "warning"},
		logs:    []entry{{"debug", "quiet-debug"}, {"info", "quiet-info"}, {"warning", "loud-warning"}},
		want:    []string{"loud-warning"},
		notWant: []string{"quiet-debug", "quiet-info"},
	}}
	for _, tc := range cases {
		for _, death := range stateDeaths {
			t.Run(tc.name+"/"+death.name, func(t *testing.T) {
				t.Parallel()
				up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
				_, url := startProxy(t, up.URL(), nil)
				var logged inbox
				cs := peers.GoSDKClientWith(t, url, &mcp.ClientOptions{
					LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
						logged.add(fmt.Sprint(req.Params.Data))
					},
				})
				ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
				defer cancel()
				for _, l := range tc.levels {
					if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: mcp.LoggingLevel(l)}); err != nil {
						t.Fatalf("SetLoggingLevel(%s): %v", l, err)
					}
				}
				last := tc.levels[len(tc.levels)-1]
				callLog(t, cs, last, "before")
				peers.Wait(t, "the log message before the heal", func() bool { return logged.count("before") == 1 })

				death.kill(up)
				for _, e := range tc.logs {
					callLog(t, cs, e.level, e.text)
				}
				for _, w := range tc.want {
					peers.Wait(t, "log message "+w+" after the heal", func() bool { return logged.count(w) == 1 })
				}
				// Unprompted, on the GET stream the proxy reopened upstream.
				nudge(t, "an unprompted log message after the heal", func() { up.LogAll(last, "unprompted") },
					func() bool { return logged.count("unprompted") > 0 })
				// Each call's messages precede its result on the call's
				// stream and the client handles them in order: by now an
				// unwanted message would have arrived.
				for _, nw := range tc.notWant {
					if logged.count(nw) != 0 {
						t.Errorf("agent got log message %q below its level %s", nw, last)
					}
				}
				if got := journalParams(up, "logging/setLevel", "level"); !slices.Equal(got, []string{last}) {
					t.Errorf("proxy's replayed logging/setLevel = %q, want [%s] once (one heal)", got, last)
				}
			})
		}
	}
}

// TestStateLastEventIDGenerations: event ids the agent sees are the proxy's,
// "<generation>-<upstream id>". A Last-Event-ID of the live generation
// resumes upstream without the prefix; one of a dead generation never
// reaches the new upstream session, also when the session turns out dead
// while the GET is being opened (it would name events of another session:
// with go-sdk, skip the new session's first events or fail the replay).
func TestStateLastEventIDGenerations(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{EventStore: true})
	// A short keepalive finds a closed agent stream quickly.
	s, url := startProxy(t, up.URL(), func(c *conf.Config) { c.StreamKeepalive = 20 * time.Millisecond })
	sid := peers.RawInitialize(t, url)
	get := func(last string) {
		t.Helper()
		resp, b := rawStream(t, url, sid, last)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET Last-Event-ID %q = %d %q, want 200", last, resp.StatusCode, b)
		}
		peers.Wait(t, "the proxy to end the closed stream", func() bool { return s.streams.Set.Count(session.ClientID(sid)) == 0 })
	}
	first := upstreamGETs(up)

	get("1-_0")
	gets := upstreamGETs(up)[len(first):]
	if len(gets) != 1 || gets[0].Header.Get("Last-Event-ID") != "_0" {
		t.Errorf("upstream GETs for Last-Event-ID 1-_0 in generation 1: %s; want one resuming _0", describeGETs(gets))
	}
	old := gets[0].SessionID

	up.ExpireSessions() // the proxy learns it from the next GET
	n := len(upstreamGETs(up))
	get("1-_0")
	for _, r := range upstreamGETs(up)[n:] {
		if r.SessionID != old && r.Header.Get("Last-Event-ID") != "" {
			t.Errorf("upstream GETs after the heal: %s; a generation-1 Last-Event-ID reached the new session %s",
				describeGETs(upstreamGETs(up)[n:]), r.SessionID)
		}
	}
}

// TestStateResumableRestartMidCall: the upstream keeps SSE events for
// resumption (go-sdk EventStore), so the agent's SDK resumes a call's
// stream that broke with a GET carrying Last-Event-ID. The upstream
// restarts in the middle of a call: that call cannot be resumed (its
// session is gone) and may fail, but the agent's session must survive (the
// go-sdk client ends its whole session when the resuming GET is refused),
// and its standalone GET stream stay open: the resuming GET, which can
// deliver nothing, must not take its place.
func TestStateResumableRestartMidCall(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{EventStore: true})
	_, url := startProxy(t, up.URL(), nil)
	tap := &wireTap{}
	var progress atomic.Int64
	cs := peers.GoSDKClientVia(t, url, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
	}, tap.wrap)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
		defer cancel()
		params := &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"steps": 40, "delayMs": 50}}
		params.SetProgressToken("mid-call")
		_, err := cs.CallTool(ctx, params)
		done <- err
	}()
	peers.Wait(t, "the call's first progress", func() bool { return progress.Load() > 0 })
	up.Restart()
	err := <-done // the call's outcome is open; it must end
	t.Logf("call cut by the restart: %v", err)
	peers.CallEcho(t, cs, "after")
	if w := tap.snapshot(); w.firstEnded {
		t.Errorf("agent's standalone GET stream ended (GET answers %v); want it held open across the restart", w.getStatus)
	}
}

// TestStateResumeCallStream: the connection of a call's event stream breaks
// between agent and proxy while the upstream lives on; the agent's SDK
// resumes it with a GET carrying the last event id (go-sdk client), which
// is mcpheal's own: the proxy serves the rest of the answer from its log,
// whether or not the upstream keeps events (go-sdk EventStore or none).
// The call completes, the tool ran once, and the agent's standalone GET
// stream, a different stream, stays open beside the resumed one.
func TestStateResumeCallStream(t *testing.T) {
	t.Parallel()
	for _, store := range []bool{true, false} {
		t.Run(map[bool]string{true: "EventStore", false: "NoEventStore"}[store], func(t *testing.T) {
			t.Parallel()
			up := peers.StartGoSDK(t, peers.GoSDKOpts{EventStore: store})
			s, url := startProxy(t, up.URL(), nil)
			tap := &wireTap{}
			var progress atomic.Int64
			cs := peers.GoSDKClientVia(t, url, &mcp.ClientOptions{
				ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
			}, tap.wrap)
			peers.Wait(t, "the agent's GET stream", func() bool { return tap.snapshot().getsOpen == 1 })
			type result struct {
				res *mcp.CallToolResult
				err error
			}
			done := make(chan result, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
				defer cancel()
				params := &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"steps": 20, "delayMs": 50}}
				params.SetProgressToken("resumed")
				res, err := cs.CallTool(ctx, params)
				done <- result{res, err}
			}()
			peers.Wait(t, "the call's first progress", func() bool { return progress.Load() > 0 })
			tap.cutPOST()
			r := <-done
			if r.err != nil || peers.ResultText(r.res) != "done" {
				t.Fatalf("resumed call = %s, %v; want done", peers.ResultText(r.res), r.err)
			}
			if n := up.ToolCalls("slow"); n != 1 {
				t.Errorf("the upstream ran the tool %d times, want 1", n)
			}
			if ok := s.count.AgentResumes[obs.OutcomeOK].Load(); ok < 1 {
				t.Errorf("no agent resume was served from mcpheal's log")
			}
			if w := tap.snapshot(); w.firstEnded {
				t.Errorf("agent's standalone GET stream ended (GET answers %v); want it open beside the resumed call", w.getStatus)
			}
			peers.CallEcho(t, cs, "after")
		})
	}
}

// TestStateEventIDsQualified: with an upstream that numbers its SSE events
// (go-sdk EventStore), every event id the agent sees on the GET stream is
// the proxy's "<generation>-<upstream id>", so that a Last-Event-ID names
// its generation; after a heal the generation part moves on. The events
// of a call's answer carry mcpheal's own ids (answerlog.go).
func TestStateEventIDsQualified(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{EventStore: true, State: true})
	_, url := startProxy(t, up.URL(), nil)
	tap := &wireTap{}
	var changed atomic.Int64
	cs := peers.GoSDKClientVia(t, url, &mcp.ClientOptions{
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { changed.Add(1) },
	}, tap.wrap)
	var n atomic.Int64
	addResource := func() { up.AddResource(fmt.Sprintf("test://peer/added/%d", n.Add(1))) }
	peers.CallEcho(t, cs, "gen1")
	nudge(t, "resources/list_changed in generation 1", addResource, func() bool { return changed.Load() > 0 })
	gen1 := len(tap.snapshot().eventIDs)

	up.ExpireSessions()
	peers.CallEcho(t, cs, "gen2")
	seen := changed.Load()
	nudge(t, "resources/list_changed in generation 2", addResource, func() bool { return changed.Load() > seen })
	ids := tap.snapshot().eventIDs
	if len(ids) <= gen1 || gen1 == 0 {
		t.Fatalf("agent saw event ids %q (%d before the heal), want some in each generation", ids, gen1)
	}
	// Every stream event's id names its generation, and generations never
	// go back: a late event of generation 1 (a list_changed the nudge set
	// off twice) may still come after the heal was asked, never after one
	// of generation 2. (Counting the events before the heal as generation
	// 1's, as this test once did, failed on such a late one.)
	var n1, n2 int
	for i, id := range ids {
		switch {
		case ownIDLine.MatchString("id: " + id + "\n"):
			continue // an answer's event: mcpheal's own id, which no heal changes
		case strings.HasPrefix(id, "1-") && n2 == 0:
			n1++
		case strings.HasPrefix(id, "2-"):
			n2++
		default:
			t.Errorf("event id #%d = %q after %d of generation 2: want \"1-…\" before them, \"2-…\" after (all: %q)", i+1, id, n2, ids)
		}
	}
	if n1 == 0 || n2 == 0 {
		t.Errorf("stream event ids of generation 1: %d, of generation 2: %d; want some of each (all: %q)", n1, n2, ids)
	}
}

// TestStateSamplingAcrossHeal: a tool that asks the agent for
// sampling/createMessage works through the proxy before and after heals.
// A new upstream session numbers its requests from the start again; the
// agent still never sees one request id twice, and each answer reaches the
// upstream session that asked, under the id it used. An answer to a request
// of a dead generation is acknowledged and dropped.
func TestStateSamplingAcrossHeal(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
	_, url := startProxy(t, up.URL(), nil)
	tap := &wireTap{}
	cs := peers.GoSDKClientVia(t, url, &mcp.ClientOptions{
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			var prompt string
			if len(req.Params.Messages) == 1 {
				if tc, ok := req.Params.Messages[0].Content.(*mcp.TextContent); ok {
					prompt = tc.Text
				}
			}
			return &mcp.CreateMessageResult{Model: "test", Role: "assistant", Content: &mcp.TextContent{Text: "sampled " + prompt}}, nil
		},
	}, tap.wrap)
	sample := func(prompt string) {
		t.Helper()
		res, err := peers.GoSDKCall(t, cs, "sample", map[string]any{"prompt": prompt})
		if err != nil {
			t.Fatalf("sample(%q): %v", prompt, err)
		}
		if got, want := peers.ResultText(res), "sampled "+prompt; got != want {
			t.Fatalf("sample(%q) = %q, want %q", prompt, got, want)
		}
	}
	sample("g1-a")
	sample("g1-b")
	up.ExpireSessions()
	sample("g2-a")
	sample("g2-b")
	up.Restart()
	sample("g3-a")

	w := tap.snapshot()
	if len(w.requestIDs) != 5 {
		t.Fatalf("agent saw server→client requests %q, want 5", w.requestIDs)
	}
	for i, id := range w.requestIDs {
		if slices.Contains(w.requestIDs[:i], id) {
			t.Errorf("agent saw request id %s twice: %q", id, w.requestIDs)
		}
		if healed, ns := i >= 2, strings.HasPrefix(id, `"mcpheal-g`); ns != healed {
			t.Errorf("request id #%d = %s: namespaced %v, want %v (only after a heal)", i+1, id, ns, healed)
		}
	}
	if !slices.Equal(w.answerIDs, w.requestIDs) {
		t.Errorf("agent answered ids %q, want the ids it saw %q", w.answerIDs, w.requestIDs)
	}
	// An answer whose connection the restart cut may be sent once more
	// (an answer is safe to repeat); it then meets the dead session.
	answers := upstreamAnswers(up)
	if len(answers) < 5 {
		t.Fatalf("upstream got answers %q, want 5", answers)
	}
	for _, id := range answers {
		if strings.Contains(id, "mcpheal") {
			t.Errorf("upstream got answer id %s, want the id its session sent", id)
		}
	}
	if answers[0] != answers[2] {
		t.Logf("upstream ids %q: a new session did not restart numbering, the test proves less", answers)
	}

	// Answers to requests of dead generations: acknowledged, not forwarded.
	for _, id := range []string{`1`, w.requestIDs[2]} {
		resp, body := peers.RawPost(t, url, cs.ID(),
			`{"jsonrpc":"2.0","id":`+id+`,"result":{"model":"test","role":"assistant","content":{"type":"text","text":"late"}}}`)
		if resp.StatusCode != http.StatusAccepted {
			t.Errorf("late answer %s = %d %q, want 202", id, resp.StatusCode, body)
		}
	}
	if got := upstreamAnswers(up); len(got) != len(answers) {
		t.Errorf("upstream answers after two late ones = %q, want still %q", got, answers)
	}
}

// TestStateToolListChangedAcrossHeal: the agent lists tools, the upstream
// restarts with another tool list, and the agent's next call heals the
// session: the proxy tells the agent notifications/tools/list_changed on its
// GET stream, and listing again shows the new tools. With the same tools
// it stays quiet.
func TestStateToolListChangedAcrossHeal(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		add, drop []string
		changed   bool
	}{
		{"tool added", []string{"extra"}, nil, true},
		{"tool removed", nil, []string{"counter"}, true},
		{"same tools", nil, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
			_, url := startProxy(t, up.URL(), nil)
			tap := &wireTap{}
			var toolsChanged, resourcesChanged atomic.Int64
			cs := peers.GoSDKClientVia(t, url, &mcp.ClientOptions{
				ToolListChangedHandler:     func(context.Context, *mcp.ToolListChangedRequest) { toolsChanged.Add(1) },
				ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { resourcesChanged.Add(1) },
			}, tap.wrap)
			before := toolNames(t, cs)
			peers.Wait(t, "the agent's GET stream", func() bool { return tap.snapshot().getsOpen == 1 })

			up.SetNextTools(tc.add, tc.drop)
			up.Restart()
			peers.CallEcho(t, cs, "heal")
			want := slices.DeleteFunc(append(slices.Clone(before), tc.add...), func(n string) bool { return slices.Contains(tc.drop, n) })
			slices.Sort(want)
			if tc.changed {
				peers.Wait(t, "notifications/tools/list_changed", func() bool { return toolsChanged.Load() > 0 })
				if got := toolNames(t, cs); !slices.Equal(got, want) {
					t.Errorf("tools after list_changed = %q, want %q", got, want)
				}
				return
			}
			// The proxy compares the new session's tools/list; a notification
			// the new server sends on the GET stream after that is the barrier
			// behind which a wrong list_changed would have arrived.
			peers.Wait(t, "the proxy's tools/list on the new session", func() bool {
				for _, r := range up.Requests() {
					if r.RPCMethod == "tools/list" && strings.HasPrefix(string(r.RPCID), `"mcpheal-`) {
						return true
					}
				}
				return false
			})
			var n atomic.Int64
			nudge(t, "resources/list_changed", func() { up.AddResource(fmt.Sprintf("test://peer/added/%d", n.Add(1))) },
				func() bool { return resourcesChanged.Load() > 0 })
			if got := toolsChanged.Load(); got != 0 {
				t.Errorf("agent got %d tools/list_changed although the tools did not change", got)
			}
			if got := toolNames(t, cs); !slices.Equal(got, want) {
				t.Errorf("tools after the heal = %q, want %q", got, want)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// helpers

// callLog calls the log tool of a State peer.
func callLog(t testing.TB, cs *mcp.ClientSession, level, text string) {
	t.Helper()
	res, err := peers.GoSDKCall(t, cs, "log", map[string]any{"level": level, "text": text})
	if err != nil || peers.ResultText(res) != "logged" {
		t.Fatalf("log(%s, %q) = %s, %v", level, text, peers.ResultText(res), err)
	}
}

// toolNames lists the tools, sorted by name.
func toolNames(t testing.TB, cs *mcp.ClientSession) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("ListTools: %v", err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

// nudge runs act every 50 ms until cond holds, for peers.Timeout at most. A
// notification a server sends unprompted travels on the session's
// standalone GET stream and is lost while the proxy (re)opens that stream
// upstream, so a test sends it until it arrives.
func nudge(t testing.TB, what string, act func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(peers.Timeout)
	var next time.Time
	for !cond() {
		now := time.Now()
		if now.After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", peers.Timeout, what)
		}
		if !now.Before(next) {
			act()
			next = now.Add(50 * time.Millisecond)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// journalParams returns params.<field> of each method request the proxy
// made itself (journal replay) on the upstream, in order.
func journalParams(up *peers.Server, method, field string) []string {
	return upstreamParams(up, method, field, true)
}

// agentParams is journalParams for the requests the agent made.
func agentParams(up *peers.Server, method, field string) []string {
	return upstreamParams(up, method, field, false)
}

func upstreamParams(up *peers.Server, method, field string, journal bool) []string {
	var out []string
	for _, r := range up.Requests() {
		if r.RPCMethod != method {
			continue
		}
		if strings.HasPrefix(string(r.RPCID), `"mcpheal-journal-`) == journal {
			out = append(out, gjson.GetBytes(r.Body, "params."+field).String())
		}
	}
	return out
}

// upstreamAnswers returns the ids of the JSON-RPC responses POSTed to the
// upstream (answers to its server→client requests), in order.
func upstreamAnswers(up *peers.Server) []string {
	var out []string
	for _, r := range up.Requests() {
		if r.HTTPMethod == http.MethodPost && r.RPCMethod == "" && len(r.RPCID) > 0 &&
			(gjson.GetBytes(r.Body, "result").Exists() || gjson.GetBytes(r.Body, "error").Exists()) {
			out = append(out, string(r.RPCID))
		}
	}
	return out
}

// rawStream opens a GET stream as a session-era client would, with
// Last-Event-ID if last != "", and closes it after the answer's head (and
// the body of an error).
func rawStream(t testing.TB, url, sid, last string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	req.Header.Set("Mcp-Session-Id", sid)
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := peers.RawClient.Do(req)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	defer resp.Body.Close()
	var b []byte
	if resp.StatusCode != http.StatusOK {
		b, _ = io.ReadAll(resp.Body)
	}
	return resp, b
}

// upstreamGETs returns the GETs the upstream received, in order.
func upstreamGETs(up *peers.Server) []peers.Request {
	var out []peers.Request
	for _, r := range up.Requests() {
		if r.HTTPMethod == http.MethodGet {
			out = append(out, r)
		}
	}
	return out
}

func describeGETs(gets []peers.Request) string {
	var b strings.Builder
	for _, r := range gets {
		fmt.Fprintf(&b, "[session %.8s Last-Event-ID %q]", r.SessionID, r.Header.Get("Last-Event-ID"))
	}
	return b.String()
}

// inbox collects what a client's notification handler receives.
type inbox struct {
	mu    sync.Mutex // protects items
	items []string
}

func (b *inbox) add(s string) {
	b.mu.Lock()
	b.items = append(b.items, s)
	b.mu.Unlock()
}

func (b *inbox) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, x := range b.items {
		if x == s {
			n++
		}
	}
	return n
}

// wireTap records the wire traffic between a go-sdk client and the proxy
// (peers.GoSDKClientVia(…, tap.wrap)): the client's GET streams, the ids of the
// server→client requests in every SSE body it reads, and the ids of the
// answers it POSTs.
type wireTap struct {
	base http.RoundTripper

	mu   sync.Mutex // protects w, get, post
	w    wireStats
	get  *sseTap // the last GET stream opened
	post *sseTap // the last POST answered with a stream
}

// wireStats is what a wireTap saw.
type wireStats struct {
	gets       int      // GETs sent
	getStatus  []int    // the answer to each GET: HTTP status, or -1 for a transport error
	getsOpen   int      // GETs answered 200 text/event-stream
	getsEnded  int      // of those, streams whose body ended or was closed
	firstEnded bool     // the first of them (the client's standalone stream) ended
	eventIDs   []string // SSE event ids, in arrival order
	requestIDs []string // raw ids of server→client requests, in arrival order
	answerIDs  []string // raw ids of the client's answers, in sending order
}

func (tap *wireTap) wrap(base http.RoundTripper) http.RoundTripper {
	tap.base = base
	return tap
}

func (tap *wireTap) snapshot() wireStats {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	w := tap.w
	w.getStatus = slices.Clone(w.getStatus)
	w.eventIDs = slices.Clone(w.eventIDs)
	w.requestIDs = slices.Clone(w.requestIDs)
	w.answerIDs = slices.Clone(w.answerIDs)
	return w
}

func (tap *wireTap) RoundTrip(req *http.Request) (*http.Response, error) {
	get := req.Method == http.MethodGet
	if req.Method == http.MethodPost && req.Body != nil {
		body, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		if m := gjson.ParseBytes(body); m.IsObject() && !m.Get("method").Exists() && m.Get("id").Exists() {
			tap.mu.Lock()
			tap.w.answerIDs = append(tap.w.answerIDs, m.Get("id").Raw)
			tap.mu.Unlock()
		}
	}
	if get {
		tap.mu.Lock()
		tap.w.gets++
		tap.mu.Unlock()
	}
	resp, err := tap.base.RoundTrip(req)
	if get {
		st := -1
		if err == nil {
			st = resp.StatusCode
		}
		tap.mu.Lock()
		tap.w.getStatus = append(tap.w.getStatus, st)
		tap.mu.Unlock()
	}
	if err != nil || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp, err
	}
	st := &sseTap{ReadCloser: resp.Body, tap: tap, get: get && resp.StatusCode == http.StatusOK}
	tap.mu.Lock()
	if st.get {
		tap.w.getsOpen++
		st.first = tap.w.getsOpen == 1
		tap.get = st
	} else if req.Method == http.MethodPost {
		tap.post = st
	}
	tap.mu.Unlock()
	resp.Body = st
	return resp, nil
}

// cutGET breaks the client's connection of its last GET stream, as a
// network failure between agent and proxy would: the client's read fails
// (and its SDK reconnects), the proxy is not told.
func (tap *wireTap) cutGET() {
	tap.mu.Lock()
	st := tap.get
	tap.mu.Unlock()
	if st != nil {
		_ = st.ReadCloser.Close() // an unread body: net/http closes the connection
	}
}

// cutPOST is cutGET for the last POST answered with an event stream.
func (tap *wireTap) cutPOST() {
	tap.mu.Lock()
	st := tap.post
	tap.mu.Unlock()
	if st != nil {
		_ = st.ReadCloser.Close()
	}
}

// sseTap reads an SSE body for a wireTap as the client consumes it.
type sseTap struct {
	io.ReadCloser
	tap   *wireTap
	get   bool
	first bool   // the client's first GET stream
	line  []byte // a partial line
	once  sync.Once
}

func (s *sseTap) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	s.feed(p[:n])
	if err != nil {
		s.ended()
	}
	return n, err
}

func (s *sseTap) Close() error {
	s.ended()
	return s.ReadCloser.Close()
}

func (s *sseTap) ended() {
	if s.get {
		s.once.Do(func() {
			s.tap.mu.Lock()
			s.tap.w.getsEnded++
			s.tap.w.firstEnded = s.tap.w.firstEnded || s.first
			s.tap.mu.Unlock()
		})
	}
}

func (s *sseTap) feed(p []byte) {
	s.line = append(s.line, p...)
	for {
		i := bytes.IndexByte(s.line, '\n')
		if i < 0 {
			return
		}
		l := bytes.TrimRight(s.line[:i], "\r")
		if v, ok := bytes.CutPrefix(l, []byte("id:")); ok {
			s.tap.mu.Lock()
			s.tap.w.eventIDs = append(s.tap.w.eventIDs, string(bytes.TrimPrefix(v, []byte(" "))))
			s.tap.mu.Unlock()
		}
		if v, ok := bytes.CutPrefix(l, []byte("data:")); ok {
			m := gjson.ParseBytes(bytes.TrimPrefix(v, []byte(" ")))
			if m.Get("method").Exists() && m.Get("id").Exists() {
				s.tap.mu.Lock()
				s.tap.w.requestIDs = append(s.tap.w.requestIDs, m.Get("id").Raw)
				s.tap.mu.Unlock()
			}
		}
		s.line = s.line[i+1:]
	}
}
