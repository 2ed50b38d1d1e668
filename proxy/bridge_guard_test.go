package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/tidwall/gjson"
)

const (
	creatorToken  = "Bearer creator-token-0123456789"
	strangerToken = "Bearer stranger-token-0123456789"
	// refusedToken is a credential the upstream refuses (401).
	refusedToken = "Bearer refused-token-0123456789"
)

// startGuardedModern is a 2026-07-28-only upstream for the bridge's
// credential tests. Its tool ask asks the agent who it is (an elicitation,
// as an InputRequiredResult) and answers with what the agent said; echo
// answers at once; subscriptions/listen stays open. When judges is set,
// it refuses (401) every request but server/discover that carries neither
// the creator's nor the stranger's token, as an upstream with its own
// users does: both are valid users of it.
func startGuardedModern(t *testing.T, judges bool) *scriptedModern {
	return startScriptedModern(t, &scriptedModern{
		discover: modernDiscover(`{"tools":{},"logging":{},"resources":{"subscribe":true}}`, ""),
		handle: func(w http.ResponseWriter, r *http.Request, c scriptedCall) {
			id := c.msg.Get("id").Raw
			if judges && c.auth != creatorToken && c.auth != strangerToken {
				w.Header().Set("WWW-Authenticate", `Bearer realm="scripted"`)
				scriptedJSON(w, http.StatusUnauthorized, `{"jsonrpc":"2.0","id":`+id+`,"error":{"code":-32001,"message":"Unauthorized"}}`)
				return
			}
			switch {
			case c.method == "subscriptions/listen":
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				_ = http.NewResponseController(w).Flush()
				<-r.Context().Done()
			case c.name == "ask":
				ans := c.msg.Get("params.inputResponses.who")
				if !ans.Exists() {
					scriptedResult(w, id, `{"resultType":"input_required","requestState":"ask-state","inputRequests":{"who":`+
						`{"method":"elicitation/create","params":{"mode":"form","message":"Who are you?",`+
						`"requestedSchema":{"type":"object","properties":{"name":{"type":"string"}}}}}}}`)
					return
				}
				scriptedResult(w, id, `{"content":[{"type":"text","text":`+
					ans.Get("content.name").Raw+`}]}`)
			case c.name == "echo":
				scriptedResult(w, id, `{"content":[{"type":"text","text":"echoed"}]}`)
			default:
				scriptedJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"error":{"code":-32601,"message":"Method not found"}}`)
			}
		},
	})
}

// TestBridgeRefusesStrangers: a bridged session belongs to the credential
// that created it. A request under another credential, or none, that
// carries its id gets 404, as for an unknown session, and changes nothing
// on it: it sets no log level, adds no subscription, cannot answer the
// session's pending elicitation (which the upstream would receive under
// the creator's token) nor cancel the call that waits for it. That holds
// whether or not the upstream judges credentials itself: when it does, a
// stranger's call may go upstream for it to judge, but what mcpheal
// answers locally never happens for one.
// The ids of the requests mcpheal sends an agent are random, so that they
// cannot be guessed either.
func TestBridgeRefusesStrangers(t *testing.T) {
	t.Parallel()
	for _, judges := range []bool{false, true} {
		name := "upstream without auth"
		if judges {
			name = "upstream judges credentials"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testBridgeRefusesStrangers(t, judges)
		})
	}
}

func testBridgeRefusesStrangers(t *testing.T, judges bool) {
	up := startGuardedModern(t, judges)
	_, url := startProxy(t, up.url, nil)
	sid := agentInitialize(t, url, creatorToken)
	if judges {
		// A 2026-07-28 request the upstream refuses: mcpheal learns that
		// the upstream judges credentials (binding.go).
		req := peers.PostRequest(t, url, "", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{`+
			`"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`)
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		if resp, body := peers.RawDo(t, req); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a 2026-07-28 request without credential: %d %s; want the upstream's 401", resp.StatusCode, body)
		}
	}
	strangers := []struct{ what, auth string }{{"another token", strangerToken}, {"no credential", ""}}
	for _, st := range strangers {
		resp, body := agentPost(t, url, sid, st.auth, `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}`)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("setLevel under %s: %d %s; want 404", st.what, resp.StatusCode, body)
		}
		resp, body = agentPost(t, url, sid, st.auth, `{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{"uri":"test://stranger"}}`)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("subscribe under %s: %d %s; want 404", st.what, resp.StatusCode, body)
		}
	}
	if !judges {
		// Nobody upstream judges credentials: a stranger's call is refused
		// here and never reaches the upstream under the creator's session.
		resp, body := agentPost(t, url, sid, strangerToken, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo"}}`)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("tools/call under another token: %d %s; want 404", resp.StatusCode, body)
		}
	} else {
		// The upstream judges: a call under another credential goes to it
		// (here one it refuses; one it accepted would move the session to
		// that credential, binding.go), so the strangers above are ones
		// the upstream may hear, and mcpheal still answered nothing on the
		// session for them.
		resp, body := agentPost(t, url, sid, refusedToken, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo"}}`)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("tools/call under a token the upstream refuses: %d %s; want the upstream's 401", resp.StatusCode, body)
		}
		if n := len(up.received("tools/call", "echo")); n != 1 {
			t.Errorf("the upstream got %d echo calls under a refused token, want 1 (the upstream is the judge)", n)
		}
	}

	// The creator's call asks the agent for input; the session-era agent
	// gets an elicitation/create request on the call's event stream.
	first := askAndAnswer(t, url, sid, 10, "creator-content", func(inputID string) {
		for _, st := range strangers {
			resp, body := agentPost(t, url, sid, st.auth, `{"jsonrpc":"2.0","id":`+inputID+
				`,"result":{"action":"accept","content":{"name":"stranger-content"}}}`)
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("answer to the pending elicitation under %s: %d %s; want 404", st.what, resp.StatusCode, body)
			}
			// Nor may a stranger cancel the creator's call.
			resp, body = agentPost(t, url, sid, st.auth, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":10}}`)
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("notifications/cancelled of the creator's call under %s: %d %s; want 404", st.what, resp.StatusCode, body)
			}
		}
	})

	asks := up.received("tools/call", "ask")
	if len(asks) != 2 {
		t.Fatalf("the upstream got %d rounds of ask, want 2 (the call, then its retry with the agent's answer)", len(asks))
	}
	if got := asks[1].msg.Get("params.inputResponses.who"); got.Get("content.name").Str != "creator-content" || asks[1].auth != creatorToken {
		t.Errorf("the upstream's second round of ask got inputResponses.who %s under %q; want the creator's answer under the creator's token",
			got.Raw, asks[1].auth)
	}

	// The next call of the creator carries no log level: the stranger set none.
	if resp, body := agentPost(t, url, sid, creatorToken, `{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"echo"}}`); resp.StatusCode != http.StatusOK ||
		gjson.GetBytes(body, "result.content.0.text").Str != "echoed" {
		t.Fatalf("the creator's echo: %d %s; want 200 and its result", resp.StatusCode, body)
	}
	echoes := up.received("tools/call", "echo")
	last := echoes[len(echoes)-1]
	if lvl := last.msg.Get(`params._meta.io\.modelcontextprotocol/logLevel`); lvl.Exists() || last.auth != creatorToken {
		t.Errorf("the creator's next call reached the upstream with log level %s under %q; want none (nobody with a right to set one did), under the creator's token",
			lvl.Raw, last.auth)
	}

	// The session's subscriptions are the creator's only: its GET stream's
	// subscriptions/listen carries the one it made, not the stranger's.
	if resp, body := agentPost(t, url, sid, creatorToken, `{"jsonrpc":"2.0","id":21,"method":"resources/subscribe","params":{"uri":"test://mine"}}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("the creator's subscribe: %d %s; want 200", resp.StatusCode, body)
	}
	get, _ := http.NewRequest(http.MethodGet, url, nil)
	get.Header.Set("Accept", "text/event-stream")
	get.Header.Set("Mcp-Session-Id", sid)
	get.Header.Set("MCP-Protocol-Version", "2025-11-25")
	get.Header.Set("Authorization", creatorToken)
	if resp, _ := agentOpen(t, get); resp.StatusCode != http.StatusOK {
		t.Fatalf("the creator's GET stream: %d; want 200", resp.StatusCode)
	}
	peers.Wait(t, "the upstream listen with the creator's subscription", func() bool {
		for _, c := range up.received("subscriptions/listen", "") {
			if strings.Contains(string(c.body), "test://mine") {
				return true
			}
		}
		return false
	})

	// Nothing of the strangers' reached the upstream, under any credential.
	for _, c := range up.all() {
		if c.auth == strangerToken || strings.Contains(string(c.body), "stranger-content") || strings.Contains(string(c.body), "test://stranger") {
			t.Errorf("the upstream got a stranger's %s under %q: %s", c.method, c.auth, c.body)
		}
	}

	// Another elicitation, to compare ids: an agent that saw one must not
	// be able to tell the next (its own, or another session's).
	second := askAndAnswer(t, url, sid, 30, "creator-again", nil)
	checkUnguessable(t, first, second)
}

// askAndAnswer calls ask as the creator (agent id callID), lets meanwhile
// run while the elicitation is pending, answers it with name, and checks
// that the call completes with the creator's answer. It returns the
// elicitation's id, raw JSON.
func askAndAnswer(t *testing.T, url, sid string, callID int, name string, meanwhile func(inputID string)) string {
	t.Helper()
	cid := strconv.Itoa(callID)
	req := peers.PostRequest(t, url, sid, `{"jsonrpc":"2.0","id":`+cid+`,"method":"tools/call","params":{"name":"ask"}}`)
	req.Header.Set("Authorization", creatorToken)
	resp, events := agentOpen(t, req)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("ask: %d %s; want 200 and an event stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	data, err := events.next()
	if err != nil {
		t.Fatalf("ask: no elicitation on the call's stream: %v", err)
	}
	ask := gjson.ParseBytes(data)
	if ask.Get("method").Str != "elicitation/create" || !ask.Get("id").Exists() {
		t.Fatalf("ask: first event %s; want an elicitation/create request with an id", data)
	}
	inputID := ask.Get("id").Raw
	if meanwhile != nil {
		meanwhile(inputID)
	}
	if resp, body := agentPost(t, url, sid, creatorToken, `{"jsonrpc":"2.0","id":`+inputID+
		`,"result":{"action":"accept","content":{"name":"`+name+`"}}}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the creator's answer to the elicitation: %d %s; want 202", resp.StatusCode, body)
	}
	data, err = events.next()
	if err != nil {
		t.Fatalf("ask: no answer after the elicitation was answered: %v", err)
	}
	if got := gjson.GetBytes(data, "result.content.0.text").Str; got != name || gjson.GetBytes(data, "id").Raw != cid {
		t.Errorf("ask completed with %s; want id %s and the creator's %q", data, cid, name)
	}
	return inputID
}

// checkUnguessable fails unless two ids of requests mcpheal sent agents
// are random text: no counter, no short tail that tells one from the next.
func checkUnguessable(t *testing.T, a, b string) {
	t.Helper()
	sa, sb := gjson.Parse(a).Str, gjson.Parse(b).Str
	if sa == "" || sb == "" || sa == sb {
		t.Fatalf("input request ids %s and %s; want two different strings", a, b)
	}
	p := 0
	for p < len(sa) && p < len(sb) && sa[p] == sb[p] {
		p++
	}
	// 16 base32 characters are 80 bits: no agent guesses them.
	if ta, tb := sa[p:], sb[p:]; len(ta) < 16 || len(tb) < 16 || allDigits(ta) || allDigits(tb) {
		t.Errorf("input request ids %s and %s differ only in %q and %q; want long random text, not a counter", a, b, ta, tb)
	}
}

func allDigits(s string) bool {
	return strings.Trim(s, "0123456789") == ""
}
