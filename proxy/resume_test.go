package proxy

// Answer streams that end before their response, resumed upstream with
// GET and Last-Event-ID (resume.go), against the scripted stub: the
// server's own polling (SSE polling, MCP 2025-11-25), a connection cut
// mid-answer, and the cases where resumption is impossible. Every test
// counts the tools/call POSTs the stub received: resumption never sends a
// call twice.

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// resumeStub is a stub upstream whose tools/call answer stream is cut by
// post, and whose GET answers with get; it counts both and records each
// GET's Last-Event-ID and when the POST's stream ended.
type resumeStub struct {
	posts, gets atomic.Int32
	mu          sync.Mutex // protects lastIDs, closed, reopened
	lastIDs     []string
	closed      time.Time
	reopened    time.Time
}

func (st *resumeStub) start(t *testing.T, post func(w http.ResponseWriter, rc *http.ResponseController), get func(w http.ResponseWriter, lastID string)) string {
	return startStub(t, func(w http.ResponseWriter, r *http.Request) {
		st.gets.Add(1)
		st.mu.Lock()
		st.lastIDs = append(st.lastIDs, r.Header.Get("Last-Event-ID"))
		st.reopened = time.Now()
		st.mu.Unlock()
		if get == nil {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		get(w, r.Header.Get("Last-Event-ID"))
	}, func(w http.ResponseWriter, r *http.Request, method string) {
		if method != "tools/call" {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		st.posts.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		defer func() {
			st.mu.Lock()
			st.closed = time.Now()
			st.mu.Unlock()
		}()
		post(w, http.NewResponseController(w))
	})
}

func (st *resumeStub) ids() []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]string(nil), st.lastIDs...)
}

const (
	resumeCall   = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"write","arguments":{}}}`
	resumeResult = `data: {"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"done"}]}}`
)

// ownIDs reports whether body's events include events (each given
// without its id line and blank line) in order, each with an id line of
// mcpheal's own, and whether no event of body has an id of another kind.
func ownIDs(body string, events ...string) bool {
	for _, ev := range strings.SplitAfter(body, "\n\n") {
		var lines []string
		own := false
		for _, l := range strings.SplitAfter(strings.TrimSuffix(ev, "\n"), "\n") {
			switch {
			case ownIDLine.MatchString(l):
				own = true
			case strings.HasPrefix(l, "id:"):
				return false
			default:
				lines = append(lines, l)
			}
		}
		if len(events) > 0 && strings.Join(lines, "")+"\n" == events[0] && own {
			events = events[1:]
		}
	}
	return len(events) == 0
}

var ownIDLine = regexp.MustCompile(`^id: m[0-9a-z]+-[0-9]+\n$`)

// streamEvents writes SSE text and flushes it.
func streamEvents(w http.ResponseWriter, text string) {
	_, _ = io.WriteString(w, text)
	_ = http.NewResponseController(w).Flush()
}

// TestResumeServerPolling: a server that closes a call's stream after its
// priming event (an id and retry: 50), as SSE polling lets it, gets a GET
// with that event's id after the retry interval, and the agent gets the
// result in the same stream, the ids rewritten, the call run once.
func TestResumeServerPolling(t *testing.T) {
	t.Parallel()
	var st resumeStub
	up := st.start(t, func(w http.ResponseWriter, rc *http.ResponseController) {
		streamEvents(w, "id: 41\nretry: 50\ndata: \n\n")
	}, func(w http.ResponseWriter, lastID string) {
		w.Header().Set("Content-Type", "text/event-stream")
		if lastID != "41" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		streamEvents(w, "id: 42\n"+resumeResult+"\n\n")
	})
	s, url := startProxy(t, up, nil)
	sid := peers.RawInitialize(t, url)
	resp, raw := peers.RawPost(t, url, sid, resumeCall)
	body := string(raw)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("answer %d %q: want one 200 event stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if !ownIDs(body, "retry: 50\ndata: \n\n", resumeResult+"\n\n") {
		t.Errorf("answer: want the priming event and the result, each with mcpheal's own id:\n%s", body)
	}
	if strings.Contains(body, "-32011") {
		t.Errorf("answer carries mcpheal's error:\n%s", body)
	}
	if n := st.posts.Load(); n != 1 {
		t.Errorf("the upstream got the call %d times, want 1", n)
	}
	if ids := st.ids(); len(ids) != 1 || ids[0] != "41" {
		t.Errorf("resuming GETs carried Last-Event-ID %q, want one with 41", ids)
	}
	st.mu.Lock()
	waited := st.reopened.Sub(st.closed)
	st.mu.Unlock()
	if waited < 45*time.Millisecond {
		t.Errorf("resumed %v after the stream closed; the server asked for retry: 50 ms", waited)
	}
	if ok, failed := s.count.Resumes[obs.OutcomeOK].Load(), s.count.Resumes[obs.OutcomeFailed].Load(); ok != 1 || failed != 0 {
		t.Errorf("mcpheal_stream_resumes_total: ok %d, failed %d; want 1 and 0", ok, failed)
	}
}

// TestResumeAfterCutMidLine: a connection cut in the middle of a data
// line, after an event that ended, resumes after that event: the agent's
// cut line is ended (the event it began is lost to its parser), then the
// server's replay of the cut event and the result follow whole.
func TestResumeAfterCutMidLine(t *testing.T) {
	t.Parallel()
	progress := `data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":%s}}`
	var st resumeStub
	up := st.start(t, func(w http.ResponseWriter, rc *http.ResponseController) {
		streamEvents(w, "id: 1\n"+strings.Replace(progress, "%s", "1", 1)+"\n\nid: 2\n"+`data: {"jsonrpc":"2.0","method":"notifications/pro`)
		panic(http.ErrAbortHandler) // the connection closes with the chunked body unfinished
	}, func(w http.ResponseWriter, lastID string) {
		w.Header().Set("Content-Type", "text/event-stream")
		streamEvents(w, "id: 2\n"+strings.Replace(progress, "%s", "2", 1)+"\n\nid: 3\n"+resumeResult+"\n\n")
	})
	_, url := startProxy(t, up, nil)
	sid := peers.RawInitialize(t, url)
	_, raw := peers.RawPost(t, url, sid, resumeCall)
	body := string(raw)
	if !ownIDs(body, strings.Replace(progress, "%s", "1", 1)+"\n\n", strings.Replace(progress, "%s", "2", 1)+"\n\n", resumeResult+"\n\n") ||
		!strings.HasSuffix(body, resumeResult+"\n\n") {
		t.Fatalf("answer: want progress 1, then the resumed events whole, each with mcpheal's own id:\n%s", body)
	}
	if !strings.Contains(body, `"method":"notifications/pro`+"\n\n") {
		t.Errorf("the cut line is not ended before the resumed events:\n%s", body)
	}
	if ids := st.ids(); len(ids) != 1 || ids[0] != "1" {
		t.Errorf("resuming GETs carried Last-Event-ID %q, want one with 1 (the last event that ended)", ids)
	}
	if n := st.posts.Load(); n != 1 {
		t.Errorf("the upstream got the call %d times, want 1", n)
	}
}

// TestResumeRefused: a server that answers the resuming GET with 405 (no
// GET stream) leaves the call unanswerable: the agent gets the stream's
// events and -32011 as its last event, saying why; the call ran once.
func TestResumeRefused(t *testing.T) {
	t.Parallel()
	var st resumeStub
	up := st.start(t, func(w http.ResponseWriter, rc *http.ResponseController) {
		streamEvents(w, "id: 41\nretry: 10\ndata: \n\n")
	}, func(w http.ResponseWriter, lastID string) {
		w.WriteHeader(http.StatusMethodNotAllowed)
	})
	s, url := startProxy(t, up, nil)
	sid := peers.RawInitialize(t, url)
	resp, raw := peers.RawPost(t, url, sid, resumeCall)
	body := string(raw)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("answer %d %q: want the upstream's 200 event stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if !ownIDs(body, "retry: 10\ndata: \n\n") || !strings.Contains(body, `"code":-32011`) ||
		!strings.Contains(body, "could not be resumed: the upstream refused to resume it (405)") || !strings.Contains(body, `"id":7`) {
		t.Fatalf("answer: want the priming event, then -32011 for id 7 saying why:\n%s", body)
	}
	if n, g := st.posts.Load(), st.gets.Load(); n != 1 || g != 1 {
		t.Errorf("the upstream got the call %d times and %d GETs, want 1 and 1", n, g)
	}
	if ok, failed := s.count.Resumes[obs.OutcomeOK].Load(), s.count.Resumes[obs.OutcomeFailed].Load(); ok != 0 || failed != 1 {
		t.Errorf("mcpheal_stream_resumes_total: ok %d, failed %d; want 0 and 1", ok, failed)
	}
}

// TestStreamEndedWithoutID: a stream that ends before any event id cannot
// be resumed: the agent still gets the stream as it came (its retry:
// field) with -32011 as its last event, and no GET is sent.
func TestStreamEndedWithoutID(t *testing.T) {
	t.Parallel()
	var st resumeStub
	up := st.start(t, func(w http.ResponseWriter, rc *http.ResponseController) {
		streamEvents(w, "retry: 10\n\n")
	}, func(w http.ResponseWriter, lastID string) {
		w.WriteHeader(http.StatusMethodNotAllowed)
	})
	_, url := startProxy(t, up, nil)
	sid := peers.RawInitialize(t, url)
	resp, raw := peers.RawPost(t, url, sid, resumeCall)
	body := string(raw)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || !strings.HasPrefix(body, "retry: 10\n") ||
		!strings.Contains(body, `"code":-32011`) || !strings.Contains(body, "no event id") {
		t.Fatalf("answer %q: want the stream's retry: field, then -32011 saying it had no event id:\n%s", resp.Header.Get("Content-Type"), body)
	}
	if n, g := st.posts.Load(), st.gets.Load(); n != 1 || g != 0 {
		t.Errorf("the upstream got the call %d times and %d GETs, want 1 and 0", n, g)
	}
}

// TestResumeGoSDKCutMidCall: a Go SDK server that keeps events (an
// EventStore) runs a tool that is not replay-safe; mcpheal's connection to
// it is reset right after the first progress event. mcpheal resumes the
// answer stream with Last-Event-ID, and the Go SDK client gets every
// progress step and the result; the server counts one execution. Without
// an event store the server sends no event ids: the client gets -32011, and
// the tool still ran once.
func TestResumeGoSDKCutMidCall(t *testing.T) {
	t.Parallel()
	for _, store := range []bool{true, false} {
		t.Run(map[bool]string{true: "EventStore", false: "NoEventStore"}[store], func(t *testing.T) {
			t.Parallel()
			up := peers.StartGoSDK(t, peers.GoSDKOpts{EventStore: store})
			relay := peers.NewTCPRelay(t, up.Addr())
			s, url := startProxy(t, relay.URL(), nil)
			var steps atomic.Int32
			cs := peers.GoSDKClientWith(t, url, &mcp.ClientOptions{
				ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { steps.Add(1) },
			})
			relay.CutAfter("notifications/progress")
			params := &mcp.CallToolParams{Name: "slow", Arguments: peers.SlowIn{Steps: 3, DelayMs: 100}}
			params.SetProgressToken("p1")
			ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
			defer cancel()
			res, err := cs.CallTool(ctx, params)
			if relay.Cuts() != 1 {
				t.Fatalf("the relay cut %d connections, want 1", relay.Cuts())
			}
			if n := up.ToolCalls("slow"); n != 1 {
				t.Errorf("the server ran the tool %d times, want 1", n)
			}
			if !store {
				if err == nil || !strings.Contains(err.Error(), "-32011") && !strings.Contains(err.Error(), "may or may not have run") {
					t.Fatalf("without an event store: %v, %s; want -32011", err, peers.ResultText(res))
				}
				return
			}
			if err != nil || peers.ResultText(res) != "done" {
				t.Fatalf("call cut mid-answer: %v, %s; want done", err, peers.ResultText(res))
			}
			// The client runs its notification handler apart from the call's
			// answer: the last step may be handled just after it.
			peers.Wait(t, "the client to get 3 progress notifications", func() bool { return steps.Load() == 3 })
			if ok := s.count.Resumes[obs.OutcomeOK].Load(); ok < 1 {
				t.Errorf("mcpheal_stream_resumes_total{outcome=ok} = %d, want at least 1", ok)
			}
		})
	}
}

// TestPolledStreamCostsOneGET: a session-era server closes a call's answer
// stream on purpose, three times (SSE polling, MCP 2025-11-25). Through
// mcpheal the agent's call gets its answer on one stream, the tool runs
// once, and each poll costs the upstream the GET that resumes it and
// nothing else: no server/discover, no initialize.
func TestPolledStreamCostsOneGET(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{EventStore: true, Polls: true})
	_, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDKClient(t, url)
	peers.CallEcho(t, cs, "before the polls")
	before := len(up.Requests())
	const polls = 3
	res, err := peers.GoSDKCall(t, cs, "poll", map[string]any{"times": polls, "retryMs": 20, "delayMs": 100})
	if err != nil || peers.ResultText(res) != "polled" {
		t.Fatalf("poll: %q, %v; want its answer", peers.ResultText(res), err)
	}
	if n := up.ToolCalls("poll"); n != 1 {
		t.Errorf("poll ran %d times, want 1", n)
	}
	var gets int
	for _, r := range up.Requests()[before:] {
		switch {
		case r.HTTPMethod == http.MethodGet && r.Header.Get("Last-Event-ID") != "":
			gets++
		case r.HTTPMethod == http.MethodPost && r.RPCMethod == "tools/call":
		case r.HTTPMethod == http.MethodGet:
			// the agent's own GET stream, reopened as the SDK does
		default:
			t.Errorf("upstream %s %s during the polls; want only the call and its resuming GETs", r.HTTPMethod, r.RPCMethod)
		}
	}
	if gets < 1 || gets > polls {
		t.Errorf("%d upstream GETs with Last-Event-ID for %d polls, want 1 to %d", gets, polls, polls)
	}
}

// TestResumeAfterConflict: a server that has not yet seen the connection of
// a broken answer stream close refuses its resumption with 409 (the Go SDK:
// "stream ID conflicts with ongoing stream"; TestResumeGoSDKCutMidCall met
// it under load). mcpheal asks again, and the agent gets the result, the
// call run once; it gave up with -32011 at the first 409 before.
func TestResumeAfterConflict(t *testing.T) {
	t.Parallel()
	var st resumeStub
	var conflicts atomic.Int32
	up := st.start(t, func(w http.ResponseWriter, rc *http.ResponseController) {
		streamEvents(w, "id: 41\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n")
		if c, _, err := rc.Hijack(); err == nil {
			_ = c.Close() // cut, not ended
		}
	}, func(w http.ResponseWriter, lastID string) {
		if lastID != "41" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if conflicts.Add(1) <= 2 {
			http.Error(w, "stream ID conflicts with ongoing stream", http.StatusConflict)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		streamEvents(w, "id: 42\n"+resumeResult+"\n\n")
	})
	_, url := startProxy(t, up, nil)
	sid := peers.RawInitialize(t, url)
	resp, raw := peers.RawPost(t, url, sid, resumeCall)
	if body := string(raw); resp.StatusCode != http.StatusOK || !strings.Contains(body, resumeResult) || strings.Contains(body, "-32011") {
		t.Fatalf("answer %d:\n%s\nwant the result after two 409s", resp.StatusCode, body)
	}
	if n := st.posts.Load(); n != 1 {
		t.Errorf("the upstream got the call %d times, want 1", n)
	}
	if n := st.gets.Load(); n != 3 {
		t.Errorf("the upstream got %d resuming GETs, want 3 (two refused)", n)
	}
}
