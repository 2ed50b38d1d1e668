package proxy

import (
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// startFlakyModern is a 2026-07-28-only upstream whose tools/list
// annotates lookup readOnlyHint and refund idempotentHint, and leaves
// charge unannotated. Each tool's first call is read, then its connection
// dropped without an answer (the tool may have run); its later calls are
// answered.
func startFlakyModern(t *testing.T) *scriptedModern {
	var mu sync.Mutex
	seen := map[string]int{}
	return startScriptedModern(t, &scriptedModern{
		tools: `{"tools":[` +
			`{"name":"lookup","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},` +
			`{"name":"refund","inputSchema":{"type":"object"},"annotations":{"idempotentHint":true}},` +
			`{"name":"charge","inputSchema":{"type":"object"}}]}`,
		handle: func(w http.ResponseWriter, _ *http.Request, c scriptedCall) {
			if c.method != "tools/call" {
				scriptedJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+c.msg.Get("id").Raw+`,"error":{"code":-32601,"message":"Method not found"}}`)
				return
			}
			mu.Lock()
			seen[c.name]++
			n := seen[c.name]
			mu.Unlock()
			if n == 1 {
				scriptedCut(w)
				return
			}
			scriptedResult(w, c.msg.Get("id").Raw, `{"content":[{"type":"text","text":"`+c.name+` done"}]}`)
		},
	})
}

// TestBridgeReplaysReplaySafeTools: through the bridge, the replay rule is
// the one of every route. A call of a tool the upstream annotated
// readOnlyHint or idempotentHint (learned from the agent's tools/list),
// or one the operator allow-listed (replay_tools), whose connection was
// lost after the upstream read it, is sent again and the agent gets the
// result; a call of any other tool is not (-32011), and ran once.
func TestBridgeReplaysReplaySafeTools(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, tool  string
		replayTools []string
		replayed    bool
	}{
		{name: "readOnlyHint", tool: "lookup", replayed: true},
		{name: "idempotentHint", tool: "refund", replayed: true},
		{name: "unannotated", tool: "charge", replayed: false},
		{name: "allow-listed by replay_tools", tool: "charge", replayTools: []string{"charge"}, replayed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := startFlakyModern(t)
			_, url := startProxy(t, up.url, func(c *conf.Config) { c.ReplayTools = tc.replayTools })
			sid := peers.RawInitialize(t, url)
			resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
			if resp.StatusCode != http.StatusOK || len(gjson.GetBytes(body, "result.tools").Array()) != 3 {
				t.Fatalf("tools/list: %d %s; want 200 and 3 tools", resp.StatusCode, body)
			}
			resp, body = peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"`+tc.tool+`"}}`)
			runs := len(up.received("tools/call", tc.tool))
			if tc.replayed {
				if text := rpcAnswer(body).Get("result.content.0.text").Str; resp.StatusCode != http.StatusOK || text != tc.tool+" done" {
					t.Errorf("%s after a lost connection: %d %s; want 200 and its result (replayed)", tc.tool, resp.StatusCode, body)
				}
				if runs != 2 {
					t.Errorf("%s ran %d times upstream, want 2 (the lost call and its replay)", tc.tool, runs)
				}
				return
			}
			if code, _, id := rpcError(t, body); resp.StatusCode != http.StatusOK || code != wire.CodeMaybeExecuted || id != "3" {
				t.Errorf("%s after a lost connection: %d %s; want 200 with -32011 for id 3", tc.tool, resp.StatusCode, body)
			}
			if runs != 1 {
				t.Errorf("%s ran %d times upstream, want 1: it may have run, and is not safe to run twice", tc.tool, runs)
			}
		})
	}
}

// TestBridgeCutStreamSaysWhetherRetryIsSafe: a bridged call whose event
// stream ends after a notification and before its answer is not sent
// again (the agent already got part of it), and ends with mcpheal's
// error as its last event, as on every route (docs/observability.md "Errors mcpheal
// answers itself"): -32011, "may or may not have run", for a tool that is
// not safe to run twice; -32010, "safe to retry", for one the upstream
// annotated readOnlyHint. Telling an agent that a read-only lookup "may
// have run" makes a careful agent give up on a call it could just retry.
func TestBridgeCutStreamSaysWhetherRetryIsSafe(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tool string
		code int64
	}{
		{tool: "lookup", code: wire.CodeUpstreamDown},
		{tool: "charge", code: wire.CodeMaybeExecuted},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			t.Parallel()
			up := startScriptedModern(t, &scriptedModern{
				tools: `{"tools":[{"name":"lookup","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},` +
					`{"name":"charge","inputSchema":{"type":"object"}}]}`,
				handle: func(w http.ResponseWriter, _ *http.Request, c scriptedCall) {
					// One log message, then the connection drops.
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					_, _ = io.WriteString(w, "event: message\ndata: "+
						`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"working"}}`+"\n\n")
					_ = http.NewResponseController(w).Flush()
					panic(http.ErrAbortHandler)
				},
			})
			_, url := startProxy(t, up.url, nil)
			sid := peers.RawInitialize(t, url)
			if resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusOK {
				t.Fatalf("tools/list: %d %s; want 200", resp.StatusCode, body)
			}
			resp, events := agentOpen(t, peers.PostRequest(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"`+tc.tool+`"}}`))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d; want 200 and an event stream", tc.tool, resp.StatusCode)
			}
			var last []byte
			for {
				data, err := events.next()
				if err != nil {
					break
				}
				last = data
			}
			if code, msg, id := rpcError(t, last); code != tc.code || id != "3" {
				t.Errorf("%s's stream cut before its answer ended with %s (%d %q); want error %d for id 3", tc.tool, last, code, msg, tc.code)
			}
			if n := len(up.received("tools/call", tc.tool)); n != 1 {
				t.Errorf("%s ran %d times upstream, want 1 (part of its answer reached the agent: not sent again)", tc.tool, n)
			}
		})
	}
}
