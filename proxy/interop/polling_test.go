//go:build unix

package interop

// SSE polling (MCP 2025-11-25) through mcpheal: a server closes a call's
// answer stream on purpose, after an event with an id and a retry: field,
// and expects the client back with GET and Last-Event-ID; it may close the
// session's GET stream the same way. Two real servers poll: the
// TypeScript SDK v1 server (testdata/v1server.mjs: InMemoryEventStore, its
// poll tool calls transport.closeSSEStream) and a Go SDK 1.8.0 server with
// an EventStore, whose poll tool calls CloseSSEStream. Three clients
// resume such streams on their own: the TypeScript SDK v2 client with
// versionNegotiation auto (through mcpheal it speaks 2026-07-28 on the held
// route; directly, it falls back to 2025-11-25 against these session-era
// servers), the Go SDK client with its default negotiation (the same), and
// the TypeScript SDK v1 client (the session era both ways).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/proxy"
)

// pollRequest is one HTTP request a polling server saw.
type pollRequest struct {
	HTTPMethod, Method, LastEventID string
}

func (r pollRequest) String() string {
	return r.HTTPMethod + " " + r.Method + " " + r.LastEventID
}

// pollServer is a server whose poll tool polls, with what reached it.
type pollServer struct {
	name string
	url  string
	// runs says how many times poll ran with tag.
	runs func(tag string) int
	// requests returns every request it saw so far, in order.
	requests func() []pollRequest
}

// startV1PollServer runs testdata/v1server.mjs with its event store,
// retry: retryMs and a line per request.
func startV1PollServer(t *testing.T, retryMs int) *pollServer {
	t.Helper()
	countFile := filepath.Join(t.TempDir(), "poll.count")
	srv := startServer(t, "v1server-poll", 0, []string{"COUNT_FILE=" + countFile, "EVENT_STORE=1", "POLL_TOOL=1", "REQUEST_LOG=1",
		fmt.Sprintf("RETRY_MS=%d", retryMs), "FILLER_TOOLS=0"}, "v1server.mjs")
	return &pollServer{
		name: "TS SDK v1 server",
		url:  srv.url(),
		runs: func(tag string) int { return runs(countFile, tag) },
		requests: func() []pollRequest {
			var out []pollRequest
			srv.proc.out.count(func(l string) bool {
				if f := strings.Fields(l); len(f) == 4 && f[0] == "REQUEST" {
					out = append(out, pollRequest{HTTPMethod: f[1], Method: strings.Trim(f[2], "-"), LastEventID: strings.Trim(f[3], "-")})
				}
				return false
			})
			return out
		},
	}
}

// goPollIn is the Go SDK poll tool's input.
type goPollIn struct {
	Tag     string `json:"tag"`
	Times   int    `json:"times"`
	EveryMs int    `json:"everyMs"`
}

// startGoPollServer serves a Go SDK 1.8.0 server with sessions and a
// MemoryEventStore, whose poll tool closes its call's stream times times
// (CloseSSEStream, retry: retry) after a progress notification, everyMs
// apart, then answers "polled <tag>".
func startGoPollServer(t *testing.T, retry time.Duration) *pollServer {
	t.Helper()
	var mu sync.Mutex
	count := map[string]int{}
	var seen []pollRequest
	srv := mcp.NewServer(&mcp.Implementation{Name: "go-poll", Version: "1.0.0"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "poll", Description: "closes its answer stream on purpose, then answers"},
		func(ctx context.Context, req *mcp.CallToolRequest, in goPollIn) (*mcp.CallToolResult, any, error) {
			mu.Lock()
			count[in.Tag]++
			mu.Unlock()
			for i := 1; i <= in.Times; i++ {
				// An event with an id of its own before each close, as the
				// TypeScript server's log message is: a progress notification
				// (a log message goes only to a client that set a level).
				tok := req.Params.GetProgressToken()
				if tok == nil {
					tok = "poll-" + in.Tag
				}
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i),
					Message: fmt.Sprintf("poll %s %d", in.Tag, i)})
				if req.Extra != nil && req.Extra.CloseSSEStream != nil {
					req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: retry})
				}
				select {
				case <-time.After(time.Duration(in.EveryMs) * time.Millisecond):
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "polled " + in.Tag}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := pollRequest{HTTPMethod: r.Method, LastEventID: r.Header.Get("Last-Event-ID")}
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				Method string `json:"method"`
			}
			_ = json.Unmarshal(body, &msg)
			rec.Method = msg.Method
		}
		mu.Lock()
		seen = append(seen, rec)
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return &pollServer{
		name: "Go SDK server",
		url:  hs.URL + "/mcp",
		runs: func(tag string) int {
			mu.Lock()
			defer mu.Unlock()
			return count[tag]
		},
		requests: func() []pollRequest {
			mu.Lock()
			defer mu.Unlock()
			return append([]pollRequest(nil), seen...)
		},
	}
}

// pollAnswer is what a client made of a polled call.
type pollAnswer struct {
	version string // the protocol version the client spoke
	ok      bool
	text    string
	err     string
}

// pollClient is a client that calls poll and resumes on its own.
type pollClient struct {
	name string
	// call connects to url, calls poll with args, and closes.
	call func(t *testing.T, url string, args map[string]any) pollAnswer
}

// pollClients are the clients of the polling tests.
var pollClients = []pollClient{
	{"TS SDK v2 client (versionNegotiation auto)", func(t *testing.T, url string, args map[string]any) pollAnswer {
		return nodePollCall(t, "v2", url, args, "VERSION_NEGOTIATION=auto")
	}},
	{"Go SDK client (default negotiation)", goPollCall},
	{"TS SDK v1 client", func(t *testing.T, url string, args map[string]any) pollAnswer {
		return nodePollCall(t, "v1", url, args)
	}},
}

// nodePollCall runs testdata/client.mjs (v1 or v2) with env against url:
// connect, call poll, close.
func nodePollCall(t *testing.T, version, url string, args map[string]any, env ...string) pollAnswer {
	t.Helper()
	env = append(env, "CLIENT_NAME=poll-"+version, fmt.Sprintf("REQUEST_TIMEOUT_MS=%d", sdkTimeout.Milliseconds()))
	c := &sdkClient{t: t, p: startNode(t, "client-"+version+" poll", env, "client.mjs", version, url)}
	defer c.p.kill()
	c.send(map[string]any{"op": "connect"})
	var conn struct {
		result
		Version string `json:"version"`
	}
	if !c.waitInto("connect", &conn) || !conn.OK {
		return pollAnswer{err: "connect: " + conn.String()}
	}
	r := c.call("poll", args)
	if !r.OK || r.IsError {
		return pollAnswer{version: conn.Version, err: r.String()}
	}
	return pollAnswer{version: conn.Version, ok: true, text: r.TextHead}
}

// waitInto waits for the answer to op and decodes it into v.
func (c *sdkClient) waitInto(op string, v any) bool {
	c.t.Helper()
	i, line, ok := c.p.out.waitFor(c.next, opTimeout, func(l string) bool { return strings.HasPrefix(l, "RESULT ") })
	if !ok {
		c.t.Logf("%s: no answer within %v; stderr:\n%s", op, opTimeout, c.p.stderr.String())
		return false
	}
	c.next = i + 1
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), v); err != nil {
		c.t.Fatalf("client output %q: %v", line, err)
	}
	return true
}

// goPollCall connects the Go SDK client to url with its default
// negotiation, calls poll and closes.
func goPollCall(t *testing.T, url string, args map[string]any) pollAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "poll-go", Version: "1.0.0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		return pollAnswer{err: "connect: " + err.Error()}
	}
	defer cs.Close()
	a := pollAnswer{version: cs.InitializeResult().ProtocolVersion}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "poll", Arguments: args})
	switch {
	case err != nil:
		a.err = err.Error()
	case res.IsError:
		a.err = fmt.Sprintf("isError: %v", res.Content)
	default:
		a.ok = true
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				a.text += tc.Text
			}
		}
	}
	return a
}

// pollTag numbers the polled calls of a test run, so that each runs under
// a tag of its own.
var pollTag atomic.Int64

// TestPollThroughMcpheal: each client gets the answer of a polled call
// (three polls, retry 50 ms) through mcpheal exactly as directly, from
// both servers, and the server runs each call once. Through mcpheal the
// TypeScript SDK v2 and Go SDK clients take the held route (they speak
// 2026-07-28 there), which must resume the server's stream itself; the
// v1 client passes through, and mcpheal resumes it too.
func TestPollThroughMcpheal(t *testing.T) {
	t.Parallel()
	servers := []*pollServer{startV1PollServer(t, 50), startGoPollServer(t, 50*time.Millisecond)}
	for _, srv := range servers {
		through := startProxy(t, srv.url)
		for _, c := range pollClients {
			t.Run(srv.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				answer := func(url string) (pollAnswer, string) {
					tag := fmt.Sprintf("poll-%d", pollTag.Add(1))
					a := c.call(t, url, map[string]any{"tag": tag, "times": 3, "everyMs": 100})
					if n := srv.runs(tag); n != 1 {
						t.Errorf("poll %s ran %d times, want 1", tag, n)
					}
					return a, tag
				}
				before := len(srv.requests())
				d, dtag := answer(srv.url)
				for try := 2; !d.ok && try <= 3; try++ {
					// The TypeScript SDK v1 server's replayed stream now and
					// then carries an event whose data is {}, which the Go
					// SDK client cannot decode, directly (through the held
					// route mcpheal drops it: it writes only messages).
					t.Logf("directly, try %d: %s; once more", try-1, d.err)
					d, dtag = answer(srv.url)
				}
				dreqs := srv.requests()[before:]
				before = len(srv.requests())
				th, ttag := answer(through)
				treqs := srv.requests()[before:]
				t.Logf("directly: %s %+v; through mcpheal: %s %+v", d.version, d, th.version, th)
				if !d.ok || !th.ok {
					// The subtests share the server: these may hold another's.
					t.Logf("the server saw, directly: %v; through mcpheal: %v", dreqs, treqs)
				}
				if !d.ok || d.text != "polled "+dtag {
					t.Fatalf("directly the client did not get the polled call's answer (%q, %s): this test proves nothing", d.text, d.err)
				}
				if !th.ok || th.text != "polled "+ttag {
					t.Errorf("through mcpheal (speaking %s) the client got %q, %s; directly (speaking %s) %q", th.version, th.text, th.err, d.version, d.text)
				}
			})
		}
	}
}

// TestPollCostsOnlyTheGET: SSE polling costs the upstream no request but
// the GET that resumes. The TypeScript SDK v1 server polls at retry: 200
// (and 0) for about 3 s: a long call closes its answer stream every 250 ms,
// and the session's GET stream with it (closeStandaloneSSEStream). Through
// mcpheal, with a session-era agent (pass-through) and a 2026-07-28 one
// (the held route), what reaches the server during the call is the call
// itself and resuming GETs, at most one per stream closed: no
// server/discover, no initialize, no other POST.
func TestPollCostsOnlyTheGET(t *testing.T) {
	t.Parallel()
	const times, everyMs = 12, 250
	for _, retry := range []int{200, 0} {
		for _, c := range []pollClient{pollClients[2], pollClients[0]} {
			t.Run(fmt.Sprintf("retry %d/%s", retry, c.name), func(t *testing.T) {
				t.Parallel()
				srv := startV1PollServer(t, retry)
				through := startProxy(t, srv.url)
				measure := func(url string) (pollAnswer, []pollRequest) {
					before := len(srv.requests())
					tag := fmt.Sprintf("poll-%d", pollTag.Add(1))
					a := c.call(t, url, map[string]any{"tag": tag, "times": times, "everyMs": everyMs, "standalone": true})
					if n := srv.runs(tag); n != 1 {
						t.Errorf("poll %s ran %d times, want 1", tag, n)
					}
					return a, srv.requests()[before:]
				}
				d, dreqs := measure(srv.url)
				th, treqs := measure(through)
				t.Logf("directly (%s): %v, %d requests: %s", d.version, d.ok, len(dreqs), summarize(dreqs))
				t.Logf("through mcpheal (%s): %v, %d requests: %s", th.version, th.ok, len(treqs), summarize(treqs))
				if !d.ok {
					t.Fatalf("directly the client did not get the polled call's answer (%s): this test proves nothing", d.err)
				}
				if !th.ok {
					t.Errorf("through mcpheal the client did not get the polled call's answer: %s", th.err)
				}
				// Before the call, the connect costs what it costs (mcpheal's
				// one server/discover to learn the upstream's era; on the held
				// route the held session's initialize and mcpheal's own
				// tools/list); during the call, polled 2*times times, nothing
				// but the call and the GETs that resume, but one tools/list of
				// mcpheal's if the held session's came late: no
				// server/discover, no initialize, nothing per poll.
				call := callWindow(treqs)
				gets, lists, other := 0, 0, []string{}
				for _, r := range call {
					switch {
					case r.HTTPMethod == http.MethodGet:
						gets++
					case r.HTTPMethod == http.MethodPost && r.Method == "tools/call":
					case r.HTTPMethod == http.MethodPost && r.Method == "tools/list" && lists == 0:
						lists++
					default:
						other = append(other, r.String())
					}
				}
				if len(other) > 0 {
					t.Errorf("during the polled call mcpheal sent the server %d requests besides the call and resuming GETs: %v", len(other), other)
				}
				if limit := 2*times + 2; gets > limit {
					t.Errorf("during the polled call mcpheal sent %d GETs, want at most %d (one per stream the server closed)", gets, limit)
				}
				if gets == 0 {
					t.Errorf("during the polled call mcpheal sent no GET: nothing resumed the server's stream")
				}
			})
		}
	}
}

// callWindow is the part of reqs from the tools/call to the end of the
// call: the requests after it until the agent's own close (DELETE), or all.
func callWindow(reqs []pollRequest) []pollRequest {
	for i, r := range reqs {
		if r.HTTPMethod == http.MethodPost && r.Method == "tools/call" {
			reqs = reqs[i:]
			for j, r := range reqs {
				if r.HTTPMethod == http.MethodDelete {
					return reqs[:j]
				}
			}
			return reqs
		}
	}
	return nil
}

// summarize counts requests by HTTP method, JSON-RPC method and whether
// they carried a Last-Event-ID.
func summarize(reqs []pollRequest) string {
	counts := map[string]int{}
	var order []string
	for _, r := range reqs {
		k := r.HTTPMethod
		if r.Method != "" {
			k += " " + r.Method
		}
		if r.LastEventID != "" {
			k += " (Last-Event-ID)"
		}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%d× %s", counts[k], k))
	}
	return strings.Join(parts, ", ")
}

// pollPendingEnv makes TestPollRetryPastHealTimeout fail where mcpheal is
// still worse than direct, rather than log it.

// TestPollRetryPastHealTimeout: a server whose retry: (1.5 s) is longer
// than mcpheal's heal_timeout (1 s here; the TypeScript SDK servers of the
// conformance suite send retry: 5000 against the default 25 s). Directly,
// the client waits the retry interval, comes back with GET and
// Last-Event-ID, and gets its answer. Through mcpheal it does too, on
// either route: mcpheal waits the server's retry: in full, as the client
// would, then resumes the stream itself; the server runs the call once.
// Before, mcpheal gave up at once ("the heal budget ran out before the
// upstream's retry interval"), ended the agent's stream with -32011, and
// the agent's own GET with Last-Event-ID got an empty stream.
func TestPollRetryPastHealTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []pollClient{pollClients[2], pollClients[0]} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := startV1PollServer(t, 1500)
			logs := &tail{max: 64 << 10}
			_, through := startProxyConfig(t, proxy.Config{Upstream: srv.url, HealTimeout: time.Second}, logs)
			answer := func(url string) (pollAnswer, string) {
				tag := fmt.Sprintf("poll-%d", pollTag.Add(1))
				a := c.call(t, url, map[string]any{"tag": tag, "times": 1, "everyMs": 200})
				if n := srv.runs(tag); n != 1 {
					t.Errorf("poll %s ran %d times, want 1", tag, n)
				}
				return a, tag
			}
			d, dtag := answer(srv.url)
			if !d.ok || d.text != "polled "+dtag {
				t.Fatalf("directly the client did not get the polled call's answer (%q, %s): this test proves nothing", d.text, d.err)
			}
			th, ttag := answer(through)
			if th.ok && th.text == "polled "+ttag {
				t.Logf("through mcpheal (%s) the client got its answer, as directly (%s)", th.version, d.version)
				return
			}
			t.Errorf("through mcpheal (speaking %s) the client got %q, %s; directly (speaking %s) its answer\nmcpheal log (tail):\n%s",
				th.version, th.text, th.err, d.version, logs.String())
		})
	}
}
