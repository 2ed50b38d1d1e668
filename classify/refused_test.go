package classify

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Golden files for Refused: testdata/refused/<want>/<dialect>.http, raw
// responses like the Classify goldens, where <want> is "true" (the server
// refused before dispatch) or "false" (no proof). Sources:
//
//   - supergateway-4-503-*: supergateway 4.0.0 while stopping, as observed
//     on this project's machines.
//   - python-503-too-many-open-sessions-*: the Python SDK at max_sessions
//     (python-sdk PR #3395/#3426). Only the text is known, so both a
//     text/plain body and a JSON-RPC error (the SDK's envelope for its
//     other transport errors) are kept.
//   - envoy-503-*: Envoy's local reply when the upstream connection breaks
//     before response headers; the request may have been sent.
//   - nginx-*: nginx's default 502 and 503 pages.
//   - 500-*, 503-*: status and whole-message edge cases built from the
//     bodies above.

// refusedGolden is one raw response from testdata/refused.
type refusedGolden struct {
	name        string // "<want>/<dialect>"
	want        bool
	status      int
	contentType []byte
	body        []byte
}

// loadRefusedGoldens reads every testdata/refused/{true,false}/*.http file.
func loadRefusedGoldens(tb testing.TB) []refusedGolden {
	tb.Helper()
	var gs []refusedGolden
	for _, want := range []bool{true, false} {
		dir := filepath.Join("testdata", "refused", strconv.FormatBool(want))
		paths, err := filepath.Glob(filepath.Join(dir, "*.http"))
		if err != nil || len(paths) == 0 {
			tb.Fatalf("no golden files in %s: %v", dir, err)
		}
		for _, p := range paths {
			raw, err := os.ReadFile(p)
			if err != nil {
				tb.Fatal(err)
			}
			status, ct, body, err := parseResponse(raw)
			if err != nil {
				tb.Fatalf("%s: %v", p, err)
			}
			name := filepath.Base(dir) + "/" + strings.TrimSuffix(filepath.Base(p), ".http")
			gs = append(gs, refusedGolden{name, want, status, ct, body})
		}
	}
	return gs
}

func TestRefusedGolden(t *testing.T) {
	t.Parallel()
	for _, g := range loadRefusedGoldens(t) {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			if got := Refused(g.status, g.contentType, g.body); got != g.want {
				t.Errorf("Refused(%s) = %v, want %v", g.name, got, g.want)
			}
		})
	}
}

// refusedCases are shared with alloc_test.go and fuzz_test.go.
var refusedCases = []struct {
	name        string
	status      int
	contentType string
	body        string
	want        bool
}{
	// Known server refusals, whole.
	{"supergateway shutting down", 503, ctText, "Gateway is shutting down", true},
	{"supergateway as text/html", 503, "text/html; charset=utf-8", "Gateway is shutting down", true},
	{"no content type", 503, "", "Gateway is shutting down", true},
	{"case, whitespace and a period", 503, ctText, "\r\n GATEWAY IS SHUTTING DOWN.\n", true},
	{"BOM", 503, ctText, bom + "Gateway is shutting down", true},
	{"Python text", 503, ctText, "Too many open sessions", true},
	{"Python JSON-RPC error", 503, ctJSON, `{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Too many open sessions"}}`, true},
	{"Python JSON-RPC error, id null", 503, ctJSON, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Too many open sessions"}}`, true},
	{"bare-string error", 503, ctJSON, `{"error":"Too many open sessions"}`, true},
	{"batch", 503, ctJSON, `[{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"Too many open sessions"}}]`, true},
	{"SSE", 503, ctSSE, "event: message\ndata: {\"error\":{\"message\":\"Too many open sessions\"}}\n\n", true},

	// No proof: the request may have run.
	{"Envoy reset before headers", 503, "text/plain", "upstream connect error or disconnect/reset before headers. reset reason: connection termination", false},
	{"Envoy no healthy upstream", 503, "text/plain", "no healthy upstream", false},
	{"nginx 502 page", 502, "text/html", "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n", false},
	{"503 empty", 503, "", "", false},
	{"503 generic text", 503, ctText, "Service Unavailable", false},
	{"refusal text at 502", 502, ctText, "Gateway is shutting down", false},
	{"refusal text at 504", 504, ctText, "Gateway is shutting down", false},
	{"refusal text at 500", 500, ctText, "Too many open sessions", false},
	{"refusal text at 429", 429, ctText, "Too many open sessions", false},
	{"refusal text at 200", 200, ctText, "Gateway is shutting down", false},
	{"refusal inside a sentence", 503, ctText, "Gateway is shutting down; your request was already forwarded", false},
	{"refusal after a prefix", 503, ctText, "Error: Too many open sessions", false},
	{"refusal with a count", 503, ctText, "Too many open sessions (max 10000)", false},
	{"refusal inside an HTML page", 503, "text/html", "<html><body>Gateway is shutting down</body></html>", false},
	{"refusal cut short", 503, ctText, "Gateway is shutting", false},
	{"refusal in error.data", 503, ctJSON, `{"error":{"code":-32603,"message":"Internal error","data":"Too many open sessions"}}`, false},
	{"refusal in a result", 503, ctJSON, `{"result":{"content":[{"type":"text","text":"Too many open sessions"}]}}`, false},
	{"refusal as a JSON string", 503, ctJSON, `"Too many open sessions"`, false},
	{"session error at 503", 503, ctJSON, errSessionNotFound, false},
	{"SSE content type, bare text", 503, ctSSE, "Gateway is shutting down", false},
}

func TestRefusedTable(t *testing.T) {
	t.Parallel()
	for _, tc := range refusedCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Refused(tc.status, []byte(tc.contentType), []byte(tc.body)); got != tc.want {
				t.Errorf("Refused(%s) = %v, want %v", tc.name, got, tc.want)
			}
		})
	}
}

// TestRefusedIsTransportDead: every answer Refused accepts is one Classify
// calls TransportDead (a server stopping) or Busy (one at capacity), so the
// proxy meets it on the outage path or waits out the server's Retry-After.
func TestRefusedIsTransportDead(t *testing.T) {
	t.Parallel()
	for _, g := range loadRefusedGoldens(t) {
		if g.want {
			if got := Classify(g.status, g.contentType, g.body); got != TransportDead && got != Busy {
				t.Errorf("Classify(%s) = %v, want TransportDead or Busy", g.name, got)
			}
		}
	}
}
