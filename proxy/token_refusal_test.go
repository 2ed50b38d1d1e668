package proxy

// A token endpoint that turns mcpheal's own upstream credential down
// (docs/observability.md "Errors mcpheal answers itself", -32018): only the operator can
// mend a refused client, so the agent is told at once, the endpoint is
// asked once and then held down, nothing is sent upstream, the breaker is
// not involved, and the log says what the endpoint answered. An endpoint
// that is down, not refusing, is a 503 the agent may retry.

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2/clientcredentials"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/upstream"
)

// answeringTokenEndpoint is a token endpoint that gives every request the
// same status and body, and counts them and how each carried the client's
// credentials (HTTP Basic or the form body).
type answeringTokenEndpoint struct {
	url   string
	calls atomic.Int64

	mu  sync.Mutex
	how []string
}

// styles says how each request carried the client's credentials.
func (te *answeringTokenEndpoint) styles() string {
	te.mu.Lock()
	defer te.mu.Unlock()
	return strings.Join(te.how, ", ")
}

func startAnsweringTokenEndpoint(t *testing.T, status int, body string) *answeringTokenEndpoint {
	t.Helper()
	te := &answeringTokenEndpoint{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		te.calls.Add(1)
		how := "no client authentication"
		if _, _, ok := r.BasicAuth(); ok {
			how = "HTTP Basic"
		} else if r.ParseForm() == nil && r.PostForm.Get("client_secret") != "" {
			how = "client_secret in the body"
		}
		te.mu.Lock()
		te.how = append(te.how, how)
		te.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(hs.Close)
	te.url = hs.URL + "/token"
	return te
}

// countingUpstream counts every request that reaches it; it should get
// none.
func countingUpstream(t *testing.T) (url string, calls *atomic.Int64) {
	t.Helper()
	calls = new(atomic.Int64)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "unexpected", http.StatusInternalServerError)
	}))
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp", calls
}

const tokenRefusalSecret = "refused-client-secret-4711"

// startRefusedProxy serves a proxy whose upstream credential comes from
// te with client credentials.
func startRefusedProxy(t *testing.T, te *answeringTokenEndpoint, up string) (string, *testLog) {
	t.Helper()
	creds := upstream.ClientCredentials(&clientcredentials.Config{ClientID: "mcpheal", ClientSecret: tokenRefusalSecret, TokenURL: te.url})
	t.Cleanup(creds.Close)
	_, url, logs := startProxyLog(t, up, func(c *conf.Config) { c.Credentials = creds })
	return url, logs
}

// TestTokenEndpointRefusesClient: the token endpoint answers 401
// invalid_client. One agent initialize costs one token request; the agent
// gets 502 -32018 at once with the endpoint's answer and no secret; the
// upstream MCP server gets nothing; the log has an error line with the
// endpoint's answer; and a second request right after gets the same -32018
// (not "circuit breaker open") without asking the endpoint again. Before,
// the one initialize made 30 token requests, the agent got 503 "circuit
// breaker open", and no log line named the credential.
func TestTokenEndpointRefusesClient(t *testing.T) {
	t.Parallel()
	te := startAnsweringTokenEndpoint(t, http.StatusUnauthorized, `{"error":"invalid_client"}`)
	up, upCalls := countingUpstream(t)
	url, logs := startRefusedProxy(t, te, up)

	check := func(what string) {
		t.Helper()
		resp, body, took := slowPost(t, url, "", secInitBody)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s after %v, %d token requests; want 200 -32018", what, resp.StatusCode, body, took, te.calls.Load())
		}
		code, msg, id := rpcError(t, body)
		if code != wire.CodeCredential || id != "1" || !strings.Contains(msg, "401 invalid_client") {
			t.Fatalf("%s: %s; want -32018 saying the token endpoint answered 401 invalid_client", what, body)
		}
		if strings.Contains(msg, "circuit breaker") || strings.Contains(string(body), tokenRefusalSecret) {
			t.Fatalf("%s: %s", what, body)
		}
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			t.Errorf("%s: Retry-After %q on a refusal only the operator can mend", what, ra)
		}
		if took > time.Second {
			t.Errorf("%s: answered after %v; want at once", what, took)
		}
	}
	check("initialize")
	first := te.calls.Load()
	if first != 1 {
		t.Errorf("%d token requests for one agent initialize (%s), want 1", first, te.styles())
	}
	check("initialize right after")
	if n := te.calls.Load() - first; n != 0 {
		t.Fatalf("%d more token requests for a second agent initialize within the hold-down, want 0", n)
	}
	if n := upCalls.Load(); n != 0 {
		t.Fatalf("the upstream MCP server got %d requests without a credential, want 0", n)
	}

	out := logs.String()
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if m["level"] == "error" && strings.Contains(line, "401 invalid_client") {
			found = true
		}
	}
	if !found {
		t.Errorf("no error line in the log gives the token endpoint's answer (401 invalid_client):\n%s", out)
	}
	if strings.Contains(out, tokenRefusalSecret) {
		t.Errorf("the log holds the client secret:\n%s", out)
	}
	if strings.Contains(out, "circuit breaker") {
		t.Errorf("the circuit breaker moved:\n%s", out)
	}
}

// TestTokenEndpointDown: the token endpoint answers 503: an outage, not a
// refusal. The agent gets -32018 (HTTP 200) with Retry-After, and the upstream
// MCP server gets nothing.
func TestTokenEndpointDown(t *testing.T) {
	t.Parallel()
	te := startAnsweringTokenEndpoint(t, http.StatusServiceUnavailable, `{"error":"temporarily_unavailable"}`)
	up, upCalls := countingUpstream(t)
	url, logs := startRefusedProxy(t, te, up)

	resp, body, took := slowPost(t, url, "", secInitBody)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("initialize: %d %s after %v, %d token requests; want 200 -32018", resp.StatusCode, body, took, te.calls.Load())
	}
	code, msg, _ := rpcError(t, body)
	if code != wire.CodeCredential || strings.Contains(msg, "circuit breaker") {
		t.Fatalf("initialize: %s; want -32018", body)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Error("no Retry-After on the token endpoint's outage")
	}
	if n := upCalls.Load(); n != 0 {
		t.Fatalf("the upstream MCP server got %d requests without a credential, want 0", n)
	}
	if strings.Contains(logs.String(), tokenRefusalSecret) {
		t.Errorf("the log holds the client secret:\n%s", logs.String())
	}
}
