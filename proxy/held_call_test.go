package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// Tests of a held call (held_call.go): its input rounds, who may resume
// or cancel it.

// TestHeldResumeOnlyByItsAgent: the requestState of a call waiting for its
// agent's input opens it for that agent only. Another credential that
// presents it is refused, and the call is still there for its own agent,
// whose answer completes it; the tool ran once.
func TestHeldResumeOnlyByItsAgent(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
	_, url := startProxy(t, up.URL(), nil)
	call := `"name":"sample","arguments":{"prompt":"p"},`
	st, first := heldPost(t, url, "alice", "tools/call", call, 1)
	state := first.Get("result.requestState").Str
	if st != http.StatusOK || first.Get("result.resultType").Str != "input_required" || state == "" ||
		first.Get("result.inputRequests.*.method").Str != "sampling/createMessage" {
		t.Fatalf("first round: %d %s; want an InputRequiredResult asking for sampling", st, first.Raw)
	}
	key := ""
	first.Get("result.inputRequests").ForEach(func(k, _ gjson.Result) bool { key = k.Str; return false })
	retry := call + `"inputResponses":{"` + key + `":{"role":"assistant","model":"m","content":{"type":"text","text":"S"}}},"requestState":"` + state + `",`
	st, stolen := heldPost(t, url, "mallory", "tools/call", retry, 2)
	if st != http.StatusOK || stolen.Get("error.code").Int() != -32602 {
		t.Fatalf("another credential's retry: %d %s; want -32602", st, stolen.Raw)
	}
	st, done := heldPost(t, url, "alice", "tools/call", retry, 3)
	if st != http.StatusOK || done.Get("id").Int() != 3 || done.Get("result.content.0.text").Str != "S" ||
		done.Get("result.resultType").Str != "complete" {
		t.Fatalf("its agent's retry: %d %s; want the call's result under id 3", st, done.Raw)
	}
	if n := up.ToolCalls("sample"); n != 1 {
		t.Errorf("the sample tool ran %d times; want 1", n)
	}
}

// TestHeldGathersInputRequests: a session-era server (the Go SDK serving
// its multi-round input requests to a session-era client) that asks for a
// name, a greeting and the roots at once gives the agent one
// InputRequiredResult with the three; the agent's answers go back on the
// held session; the server's second round, which the session era hands
// back as a result carrying inputRequests and its own requestState, comes
// as the InputRequiredResult it is, and the agent's retry with that state
// reaches the server. The tool completes once.
func TestHeldGathersInputRequests(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
	// A request left unanswered ends with its call (the server's handler
	// with it) within response_timeout.
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.ResponseTimeout = 5 * time.Second })
	const caps = `{"sampling":{},"elicitation":{},"roots":{}}`
	call := `"name":"ask","arguments":{},`
	st, first := heldPostCaps(t, url, "alice", caps, "tools/call", call, 1)
	asks := first.Get("result.inputRequests").Map()
	state := first.Get("result.requestState").Str
	if st != http.StatusOK || first.Get("result.resultType").Str != "input_required" || len(asks) != 3 {
		t.Fatalf("round 1: %d %s; want one InputRequiredResult with the three requests", st, first.Raw)
	}
	answers := []string{}
	for key, ask := range asks {
		var answer string
		switch ask.Get("method").Str {
		case "elicitation/create":
			answer = `{"action":"accept","content":{"name":"Ada"}}`
		case "sampling/createMessage":
			answer = `{"role":"assistant","model":"m","content":{"type":"text","text":"hello"}}`
		case "roots/list":
			answer = `{"roots":[]}`
		default:
			t.Fatalf("round 1 asks %s; want elicitation, sampling and roots", ask.Raw)
		}
		answers = append(answers, strconv.Quote(key)+":"+answer)
	}
	retry := call + `"inputResponses":{` + strings.Join(answers, ",") + `},"requestState":"` + state + `",`
	st, second := heldPostCaps(t, url, "alice", caps, "tools/call", retry, 2)
	if st != http.StatusOK || second.Get("id").Int() != 2 || second.Get("result.resultType").Str != "input_required" ||
		second.Get("result.inputRequests.colour.method").Str != "elicitation/create" ||
		second.Get("result.requestState").Str != "round2:Ada" {
		t.Fatalf("round 2: %d %s; want the server's own InputRequiredResult (colour, round2:Ada)", st, second.Raw)
	}
	retry = call + `"inputResponses":{"colour":{"action":"accept","content":{"colour":"blue"}}},"requestState":"round2:Ada",`
	st, done := heldPostCaps(t, url, "alice", caps, "tools/call", retry, 3)
	if st != http.StatusOK || done.Get("id").Int() != 3 || done.Get("result.resultType").Str != "complete" ||
		done.Get("result.content.0.text").Str != "Ada likes blue" {
		t.Fatalf("round 3: %d %s; want the tool's result", st, done.Raw)
	}
	if n := up.ToolCalls("ask"); n != 1 {
		t.Errorf("INVARIANT: the ask tool completed %d times; want 1", n)
	}
}

// TestHeldAsksAside: a server that asks for input within a tool on its
// session's GET stream (the Go SDK with a context not of the call, as the
// TypeScript SDK's elicitInput does) reaches the agent of the one call in
// flight on the held session, in its InputRequiredResult; its answer goes
// back and the tool completes once.
func TestHeldAsksAside(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.ResponseTimeout = 5 * time.Second })
	const caps = `{"elicitation":{}}`
	call := `"name":"ask_aside","arguments":{},`
	// The held session's GET stream opens in the background: until the Go
	// SDK has it, the tool's elicitation fails on the server ("stream not
	// connected", the tool does not count). Open the session first, and
	// wait for the GET to reach the server.
	if st, res := heldPostCaps(t, url, "alice", caps, "tools/list", "", 1); st != http.StatusOK {
		t.Fatalf("tools/list: %d %s", st, res.Raw)
	}
	peers.Wait(t, "the held session's GET stream", func() bool {
		for _, r := range up.Requests() {
			if r.HTTPMethod == http.MethodGet {
				return true
			}
		}
		return false
	})
	var st int
	var first gjson.Result
	if !waitFor(peers.Timeout, func() bool {
		st, first = heldPostCaps(t, url, "alice", caps, "tools/call", call, 1)
		return !strings.Contains(first.Raw, "stream not connected")
	}) {
		t.Fatalf("the server's GET stream never connected: %s", first.Raw)
	}
	key, ask := "", gjson.Result{}
	first.Get("result.inputRequests").ForEach(func(k, v gjson.Result) bool { key, ask = k.Str, v; return false })
	if st != http.StatusOK || first.Get("result.resultType").Str != "input_required" || ask.Get("method").Str != "elicitation/create" {
		t.Fatalf("the call: %d %s; want an InputRequiredResult with the server's elicitation", st, first.Raw)
	}
	retry := call + `"inputResponses":{"` + key + `":{"action":"accept","content":{"name":"Ada"}}},"requestState":"` +
		first.Get("result.requestState").Str + `",`
	st, done := heldPostCaps(t, url, "alice", caps, "tools/call", retry, 2)
	if st != http.StatusOK || done.Get("result.content.0.text").Str != "hello Ada" || done.Get("result.resultType").Str != "complete" {
		t.Fatalf("the retry: %d %s; want the tool's result", st, done.Raw)
	}
	if n := up.ToolCalls("ask_aside"); n != 1 {
		t.Errorf("INVARIANT: ask_aside completed %d times; want 1", n)
	}
}

// TestHeldCancelOnlyByItsAgent: two 2026-07-28 agents under one
// credential (here a shared token; by default none) with different
// clients. One's notifications/cancelled naming the other's call id does
// not end that call; the caller's own cancel does.
func TestHeldCancelOnlyByItsAgent(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), nil)
	send := func(client, body string) (int, gjson.Result) {
		t.Helper()
		meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"` + client +
			`","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(strings.Replace(body, `"params":{`, `"params":{`+meta+`,`, 1)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", gjson.Get(body, "method").Str)
		if name := gjson.Get(body, "params.name").Str; name != "" {
			req.Header.Set("Mcp-Name", name)
		}
		req.Header.Set("Authorization", "Bearer shared-token")
		resp, b := peers.RawDo(t, req)
		msg := b
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			for _, line := range strings.Split(string(b), "\n") {
				if d, ok := strings.CutPrefix(line, "data: "); ok {
					msg = []byte(d)
				}
			}
		}
		return resp.StatusCode, gjson.ParseBytes(msg)
	}
	call := func(id string) <-chan gjson.Result {
		out := make(chan gjson.Result, 1)
		go func() {
			_, m := send("alice-client", `{"jsonrpc":"2.0","id":`+id+`,"method":"tools/call","params":{"name":"slow","arguments":{"steps":1,"delayMs":600}}}`)
			out <- m
		}()
		return out
	}
	cancel := func(client, id string) {
		if st, _ := send(client, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":`+id+`}}`); st != http.StatusAccepted {
			t.Fatalf("notifications/cancelled from %s: %d, want 202", client, st)
		}
	}
	first := call("5")
	peers.Wait(t, "the call to reach the server", func() bool { return up.ToolCalls("slow") == 1 })
	cancel("bob-client", "5")
	if m := <-first; m.Get("result.content.0.text").Str != "done" {
		t.Fatalf("a call another client tried to cancel: %s; want its result", m.Raw)
	}
	second := call("6")
	peers.Wait(t, "the second call to reach the server", func() bool { return up.ToolCalls("slow") == 2 })
	cancel("alice-client", "6")
	if m := <-second; m.Get("result.content.0.text").Str == "done" {
		t.Fatalf("a call its own client cancelled: %s; want it ended", m.Raw)
	}
}
