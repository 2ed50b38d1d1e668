package classify

// Golden files: testdata/<Class>/<dialect>.http, each one raw HTTP/1.1
// response (status line, headers, blank line, body bytes exactly as sent).
// The directory names the expected Class. Sources, by file-name prefix
// (docs/healing.md "What it does with each answer"):
//
//   - go-sdk-*: modelcontextprotocol/go-sdk v1.8.0 mcp/streamable.go. Errors
//     are http.Error (text/plain, nosniff, body + "\n"): 404 "session not
//     found" and "session is closing", 403 "session user mismatch" and
//     "Forbidden: invalid Host header", 400 "GET requires an Mcp-Session-Id
//     header"; writeJSONRPCError for 400 "duplicate in-flight request ID";
//     mcp/server.go for the 200 SSE code 0 "invalid during session
//     initialization", escapes as encoding/json writes them.
//   - ts-sdk-*: typescript-sdk src/server/webStandardStreamableHttp.ts
//     (createJsonErrorResponse: jsonrpc, error, id:null; priming event
//     "id: x\ndata: \n\n"; ": keepalive" comments, PR #2541).
//   - ts-example-*: the v1 example template simpleStreamableHttp.ts (Express:
//     res.json, res.send), copied by many servers; ts-server-everything-*:
//     server-everything 2026.8.31 as observed here (§7, no id member).
//   - python-*: python-sdk mcp/server/streamable_http_manager.py. ≤1.25 sends
//     the 400 text through a Starlette Response with no media_type, so there is
//     no Content-Type header (§2 calls it text/plain); 1.26+ (PR #1808/#1945)
//     404 -32600 with id "server-error", v2 id null.
//   - mcp-go-*: mark3labs/mcp-go server/streamable_http.go writeHTTPError
//     (v0.42 400, v0.44+ and v1.2.1 404).
//   - supergateway-*: 4.0.0 --stateful 404 JSON and text/html (§7), 503 while
//     stopping (§7), stateless 405 with no Content-Type (§2).
//   - 1mcp-*: 1mcp-app/agent PR #550; the 400 variant exercises the 400 marker.
//   - wordpress-*, wpcom-*: WordPress/mcp-adapter HttpSessionValidator and
//     McpErrorFactory (-32602 at HTTP 200; not-found codes at HTTP 404),
//     WordPress.com -32005 (mcp-adapter#312, mcp-wordpress-remote PR #60).
//   - keryx-*: keryx#503 (200 SSE {"error":"Session not found"}).
//   - copilot-cli-style-*: the body from copilot-cli#1360, at 200 to exercise
//     the 2xx marker rule; python-style-*: the Python SDK's 404 message at
//     200; wordpress-style-*: the WordPress text without its "Invalid params:"
//     prefix (the whole phrase hermes#13383 matches).
//   - express-app-*: an Express MCP app answering 404 "Session expired.
//     Please reconnect."; express-router-*: Express MCP routers answering 404
//     -32001 "Unknown session" (both found by code search).
//   - tool-error-*: a tool's own JSON-RPC error whose text mentions a session
//     ("payment gateway session expired", a sentence quoting "Session not
//     found"): dispatched, so never SessionGone. A tool that charged a card
//     and then failed must not run twice.
//   - nginx-*: nginx's default 502/504 pages in front of a dead upstream.
//   - spec-2026-*: a 2026-07-28 server's 404 method not found.
//   - sse-*, bom-*, leading-whitespace-*, batch-*, error-*, tool-result-*,
//     is-error-*, result-*, method-*, request-*, accepted-*, text-*, 401-*,
//     429-*, 500-*, 503-*, 307-*: framings and edge cases built from the
//     bodies above (priming, CRLF, comments, truncation, BOM, batches,
//     markers outside the error member, status precedence).

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// golden is one raw response from testdata.
type golden struct {
	name        string // "<Class>/<dialect>"
	want        Class
	status      int
	contentType []byte
	body        []byte
}

// loadGoldens reads every testdata/<Class>/*.http file.
func loadGoldens(tb testing.TB) []golden {
	tb.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "*", "*.http"))
	if err != nil || len(paths) == 0 {
		tb.Fatalf("no golden files: %v", err)
	}
	gs := make([]golden, 0, len(paths))
	for _, p := range paths {
		dir := filepath.Base(filepath.Dir(p))
		want, ok := classNamed(dir)
		if !ok {
			tb.Fatalf("%s: directory %q names no Class", p, dir)
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		status, ct, body, err := parseResponse(raw)
		if err != nil {
			tb.Fatalf("%s: %v", p, err)
		}
		name := dir + "/" + strings.TrimSuffix(filepath.Base(p), ".http")
		gs = append(gs, golden{name, want, status, ct, body})
	}
	return gs
}

// classNamed returns the Class whose String is name.
func classNamed(name string) (Class, bool) {
	for c := Unknown; c <= Busy; c++ {
		if c.String() == name {
			return c, true
		}
	}
	return Unknown, false
}

// parseResponse splits a raw HTTP/1.x response into its status code,
// Content-Type value (nil if absent) and body. The head ends at the first
// empty line (CRLF or LF); the body is everything after it, byte for byte.
// A Content-Length header, when present, must match the body.
func parseResponse(raw []byte) (status int, contentType, body []byte, err error) {
	end, sep := len(raw), 0
	if i := bytes.Index(raw, []byte("\r\n\r\n")); i >= 0 {
		end, sep = i, 4
	}
	if i := bytes.Index(raw, []byte("\n\n")); i >= 0 && i < end {
		end, sep = i, 2
	}
	if sep == 0 {
		return 0, nil, nil, errors.New("no blank line after the head")
	}
	head, body := string(raw[:end]), raw[end+sep:]
	lines := strings.Split(strings.ReplaceAll(head, "\r\n", "\n"), "\n")
	f := strings.Fields(lines[0])
	if len(f) < 2 || !strings.HasPrefix(f[0], "HTTP/") {
		return 0, nil, nil, fmt.Errorf("bad status line %q", lines[0])
	}
	if status, err = strconv.Atoi(f[1]); err != nil {
		return 0, nil, nil, fmt.Errorf("bad status line %q", lines[0])
	}
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			return 0, nil, nil, fmt.Errorf("bad header line %q", l)
		}
		v = strings.TrimSpace(v)
		switch {
		case strings.EqualFold(k, "Content-Type"):
			contentType = []byte(v)
		case strings.EqualFold(k, "Content-Length"):
			if n, err := strconv.Atoi(v); err != nil || n != len(body) {
				return 0, nil, nil, fmt.Errorf("Content-Length %s, body has %d bytes", v, len(body))
			}
		}
	}
	return status, contentType, body, nil
}

func TestClassifyGolden(t *testing.T) {
	t.Parallel()
	seen := map[Class]int{}
	for _, g := range loadGoldens(t) {
		seen[g.want]++
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			if got := Classify(g.status, g.contentType, g.body); got != g.want {
				t.Errorf("Classify(%s) = %v, want %v", g.name, got, g.want)
			}
		})
	}
	for _, c := range []Class{OK, ToolError, Auth, SessionGone, TransportDead, Protocol} {
		if seen[c] == 0 {
			t.Errorf("no golden file for %v", c)
		}
	}
	for _, c := range []Class{Unknown, Timeout} {
		if seen[c] != 0 {
			t.Errorf("golden files expect %v, which Classify never returns", c)
		}
	}
}

func TestParseResponse(t *testing.T) {
	t.Parallel()
	status, ct, body, err := parseResponse([]byte("HTTP/1.1 404 Not Found\r\nContent-type: text/plain\r\nContent-Length: 4\r\n\r\nab\r\n"))
	if err != nil || status != 404 || string(ct) != "text/plain" || string(body) != "ab\r\n" {
		t.Errorf("parseResponse = %d, %q, %q, %v", status, ct, body, err)
	}
	for _, raw := range []string{
		"HTTP/1.1 200 OK\r\n",                            // no blank line
		"HTTP/1.1 x OK\r\n\r\n",                          // bad status
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab", // length mismatch
	} {
		if _, _, _, err := parseResponse([]byte(raw)); err == nil {
			t.Errorf("parseResponse(%q) succeeded, want an error", raw)
		}
	}
}

// tableCase is one focused rule test. Strings keep the table readable; the
// tests convert them to []byte.
type tableCase struct {
	name        string
	status      int
	contentType string
	body        string
	want        Class
}

const (
	ctJSON = "application/json"
	ctSSE  = "text/event-stream"
	ctText = "text/plain; charset=utf-8"

	errSessionNotFound = `{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Session not found"}}`
	errMethodNotFound  = `{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}`
	resultOK           = `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}`
)

// tableCases are shared with alloc_test.go and fuzz_test.go.
var tableCases = []tableCase{
	// Status decides first.
	{"401 beats a session body", 401, ctSSE, "data: " + errSessionNotFound + "\n\n", Auth},
	{"403 beats a session body", 403, ctText, "Session not found", Auth},
	{"404 empty body", 404, "", "", SessionGone},
	{"404 text with no marker", 404, ctText, "404 page not found\n", SessionGone},
	{"404 JSON -32001", 404, ctJSON, errSessionNotFound, SessionGone},
	{"404 JSON -32601", 404, ctJSON, errMethodNotFound, ToolError},
	{"404 JSON -32601.0 from PHP", 404, ctJSON, `{"jsonrpc":"2.0","id":1,"error":{"code":-32601.0,"message":"Method not found: x"}}`, ToolError},
	{"404 JSON -32601.5 is no code", 404, ctJSON, `{"error":{"code":-32601.5}}`, SessionGone},
	{"404 JSON -32002 resource not found", 404, ctJSON, `{"jsonrpc":"2.0","id":1,"error":{"code":-32002,"message":"Resource not found: file:///x"}}`, ToolError},
	{"404 JSON -32004 prompt not found", 404, ctJSON, `{"jsonrpc":"2.0","id":1,"error":{"code":-32004,"message":"Prompt not found: p"}}`, ToolError},
	{"404 SSE -32601", 404, ctSSE, "event: message\ndata: " + errMethodNotFound + "\n\n", ToolError},
	{"404 batch -32601", 404, ctJSON, "[" + errMethodNotFound + "]", ToolError},
	{"404 -32601 only in error.data", 404, ctJSON, `{"error":{"code":-32001,"data":{"code":-32601}}}`, SessionGone},
	{"404 -32601 outside an error", 404, ctJSON, `{"code":-32601}`, SessionGone},
	{"404 -32601 as a string", 404, ctJSON, `{"error":{"code":"-32601"}}`, SessionGone},
	{"400 marker lower case", 400, ctText, "no valid session id provided", SessionGone},
	{"400 marker upper case", 400, ctText, "INVALID OR MISSING SESSION ID", SessionGone},
	{"400 marker Missing session ID", 400, ctJSON, `{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Bad Request: Missing session ID"}}`, SessionGone},
	{"400 marker in SSE", 400, ctSSE, "event: message\ndata: {\"error\":{\"message\":\"Bad Request: Server not initialized\"}}\n\n", SessionGone},
	{"400 marker in HTML", 400, "text/html", "<p>Unknown Mcp-Session-Id header</p>", SessionGone},
	{"400 no marker", 400, ctText, "Bad Request: Unsupported protocol version: 1999-01-01", Protocol},
	{"400 session word alone", 400, ctText, "Bad Request: session", Protocol},
	{"400 empty", 400, "", "", Protocol},
	{"405 with marker", 405, ctText, "Invalid session ID", Protocol},
	{"406 with marker", 406, ctText, "Session not found", Protocol},
	{"415 with marker", 415, ctText, "Session not found", Protocol},
	{"500 with marker", 500, ctJSON, errSessionNotFound, Protocol},
	{"502", 502, "", "", TransportDead},
	{"503 with marker", 503, ctJSON, errSessionNotFound, Busy}, // the server's own words: not a heal, not an outage
	{"503 JSON, no error", 503, ctJSON, `{"jsonrpc":"2.0","id":1,"result":{}}`, TransportDead},
	{"503 text", 503, ctText, "Service Unavailable", TransportDead},
	{"503 too many open sessions", 503, ctText, "Too many open sessions.", Busy},
	{"503 too many open sessions in SSE", 503, ctSSE, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32603,\"message\":\"Too many open sessions\"}}\n\n", Busy},
	{"504", 504, "text/html", "<h1>504 Gateway Time-out</h1>", TransportDead},
	{"429", 429, ctText, "slow down", Busy},
	{"429 empty", 429, "", "", Busy},
	{"100", 100, "", "", Protocol},
	{"304", 304, "", "", Protocol},
	{"status 0", 0, "", "", Protocol},
	{"status negative", -1, ctJSON, errSessionNotFound, Protocol},
	{"status 600", 600, ctJSON, errSessionNotFound, Protocol},
	{"199", 199, ctJSON, errSessionNotFound, Protocol},
	{"300", 300, ctJSON, errSessionNotFound, Protocol},

	// 2xx: a known session message, whole, only inside the error member.
	{"200 empty", 200, ctJSON, "", OK},
	{"202 empty, no content type", 202, "", "", OK},
	{"204", 204, "", "", OK},
	{"299 marker", 299, ctJSON, errSessionNotFound, SessionGone},
	{"200 result", 200, ctJSON, resultOK, OK},
	{"200 message marker", 200, ctJSON, errSessionNotFound, SessionGone},
	{"200 marker upper case", 200, ctJSON, `{"error":{"message":"SESSION NOT FOUND"}}`, SessionGone},
	{"200 marker with a period", 200, ctJSON, `{"error":{"message":"Session not found."}}`, SessionGone},
	{"200 marker with whitespace", 200, ctJSON, `{"error":{"message":" Session not found\n"}}`, SessionGone},
	{"200 marker unknown session", 200, ctJSON, `{"error":{"code":-32001,"message":"Unknown session"}}`, SessionGone},
	{"200 marker session terminated", 200, ctJSON, `{"error":{"code":32600,"message":"Session terminated"}}`, SessionGone},
	{"200 marker Python terminated", 200, ctJSON, `{"error":{"code":-32600,"message":"Not Found: Session has been terminated"}}`, SessionGone},
	{"200 marker Python invalid or expired", 200, ctJSON, `{"error":{"code":-32600,"message":"Not Found: Invalid or expired session ID"}}`, SessionGone},
	{"200 marker WordPress", 200, ctJSON, `{"error":{"code":-32602,"message":"Invalid params: Invalid or expired session"}}`, SessionGone},
	{"200 marker WordPress.com", 200, ctJSON, `{"error":{"code":-32005,"message":"Session not found: Invalid or expired session"}}`, SessionGone},
	{"200 marker WordPress text alone", 200, ctJSON, `{"error":{"code":-32602,"message":"Invalid or expired session"}}`, SessionGone},

	// A tool's own error that mentions a session was dispatched: replaying
	// it would run the tool twice.
	{"200 tool error: payment gateway session expired", 200, ctJSON, `{"jsonrpc":"2.0","id":3,"error":{"code":-32000,"message":"charged $20 but payment gateway session expired"}}`, ToolError},
	{"200 tool error: session expired for a user", 200, ctJSON, `{"error":{"code":-32603,"message":"session expired for user bob, please log in at https://shop.example.com/login"}}`, ToolError},
	{"200 tool error: marker in a sentence", 200, ctJSON, `{"error":{"code":-32603,"message":"the CRM answered Session not found for user sync-bot; order 8812 was saved"}}`, ToolError},
	{"200 tool error: marker with a suffix", 200, ctJSON, `{"error":{"message":"Session not found: crm-sync"}}`, ToolError},
	{"200 tool error: marker with a prefix", 200, ctJSON, `{"error":{"message":"Stripe: Session not found"}}`, ToolError},
	{"200 tool error: bare-string marker in a sentence", 200, ctJSON, `{"error":"upstream said Session terminated"}`, ToolError},
	{"200 tool error: Session expired names no server", 200, ctJSON, `{"error":{"code":-32000,"message":"Session Expired"}}`, ToolError},
	{"200 tool error: expired session, reconnect", 200, ctJSON, `{"error":{"code":-32000,"message":"Expired session, reconnect"}}`, ToolError},
	{"200 tool error: unknown session with an id", 200, ctJSON, `{"error":{"code":-32000,"message":"unknown session abc"}}`, ToolError},
	{"200 tool error: marker after an escape", 200, ctJSON, `{"error":{"message":"error:\nsession not found"}}`, ToolError},
	{"200 tool error: marker in quotes", 200, ctJSON, `{"error":{"message":"\"session not found\""}}`, ToolError},
	{"200 tool error: two periods", 200, ctJSON, `{"error":{"message":"Session not found.."}}`, ToolError},
	{"SSE tool error: marker in a sentence", 200, ctSSE, "event: message\ndata: {\"error\":{\"message\":\"payment gateway session expired\"}}\n\n", ToolError},
	{"200 marker inside a word", 200, ctJSON, `{"error":{"message":"unexpired session"}}`, ToolError},
	{"200 marker glued after", 200, ctJSON, `{"error":{"message":"session not founded"}}`, ToolError},
	{"200 session word alone", 200, ctJSON, `{"error":{"code":-32602,"message":"Invalid session"}}`, ToolError},
	{"200 marker only in error.data", 200, ctJSON, `{"error":{"code":-32603,"message":"Internal error","data":"session not found"}}`, ToolError},
	{"200 marker in a non-string message", 200, ctJSON, `{"error":{"message":["session not found"]}}`, ToolError},
	{"200 marker only in result", 200, ctJSON, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"session not found"}]}}`, OK},
	{"200 marker in a nested error", 200, ctJSON, `{"jsonrpc":"2.0","id":1,"result":{"error":{"message":"session not found"}}}`, OK},
	{"200 marker in a notification", 200, ctJSON, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"error","data":"session expired"}}`, OK},
	{"200 error string marker", 200, ctJSON, `{"error":"Session not found"}`, SessionGone},
	{"200 error string other", 200, ctJSON, `{"error":"Rate limited"}`, ToolError},
	{"200 error number", 200, ctJSON, `{"error":1}`, ToolError},
	{"200 error true", 200, ctJSON, `{"error":true}`, ToolError},
	{"200 result before error: the first decides", 200, ctJSON, `{"jsonrpc":"2.0","id":1,"result":{},"error":{"message":"Session not found"}}`, OK},
	{"200 error before result: the first decides", 200, ctJSON, `{"jsonrpc":"2.0","id":1,"error":{"message":"Session not found"},"result":{}}`, SessionGone},
	{"200 null result, then error (JSON-RPC 1.0)", 200, ctJSON, `{"result":null,"error":{"code":-32000,"message":"Session not found"},"id":1}`, SessionGone},
	{"200 null result, then null error", 200, ctJSON, `{"result":null,"error":null,"id":1}`, OK},
	{"200 null error, then isError result", 200, ctJSON, `{"error":null,"result":{"isError":true}}`, ToolError},
	{"200 method before error", 200, ctJSON, `{"method":"x","error":{"message":"Session not found"}}`, OK},
	{"200 error after a big value", 200, ctJSON, `{"id":{"a":[1,"}",{"b":"]"}]},"error":{"message":"Session not found"}}`, SessionGone},
	{"200 error null", 200, ctJSON, `{"jsonrpc":"2.0","id":1,"result":{},"error":null}`, OK},
	{"200 error false", 200, ctJSON, `{"result":{},"error":false}`, OK},
	{"200 error empty string", 200, ctJSON, `{"result":{},"error":""}`, OK},
	{"200 error object without message", 200, ctJSON, `{"error":{"code":-32603}}`, ToolError},
	{"200 error key with spaces", 200, ctJSON, "{ \"error\" :\t{ \"message\" : \"Session not found\" } }", SessionGone},
	{"200 escaped error key", 200, ctJSON, `{"\u0065rror":{"message":"Session not found"}}`, OK},
	{"200 error word as a value", 200, ctJSON, `{"jsonrpc":"2.0","id":1,"result":{"level":"error"}}`, OK},
	{"200 isError true", 200, ctJSON, `{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":true}}`, ToolError},
	{"200 isError true with spaces", 200, ctJSON, `{"result": {"isError" : true}}`, ToolError},
	{"200 isError false", 200, ctJSON, `{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}`, OK},
	{"200 isError string", 200, ctJSON, `{"result":{"isError":"true"}}`, OK},
	{"200 isError nested only", 200, ctJSON, `{"result":{"structuredContent":{"isError":true},"isError":false}}`, OK},
	{"200 isError outside result", 200, ctJSON, `{"isError":true,"result":{}}`, OK},
	{"200 isError with session marker", 200, ctJSON, `{"result":{"content":[{"type":"text","text":"Session not found"}],"isError":true}}`, ToolError},
	{"200 text/plain", 200, ctText, "session not found\n", OK},
	{"200 text/plain JSON body is still JSON", 200, ctText, errSessionNotFound, SessionGone},
	{"200 JSON string", 200, ctJSON, `"session not found"`, OK},
	{"200 garbage", 200, ctJSON, "<html>Session not found</html>", OK},

	// Batches: element 0 decides.
	{"batch marker first", 200, ctJSON, "[" + errSessionNotFound + "," + resultOK + "]", SessionGone},
	{"batch marker second", 200, ctJSON, "[" + resultOK + "," + errSessionNotFound + "]", OK},
	{"batch with spaces", 200, ctJSON, "[ \n" + errSessionNotFound + " ]", SessionGone},
	{"batch isError first", 200, ctJSON, `[{"result":{"isError":true}}]`, ToolError},
	{"batch empty", 200, ctJSON, "[]", OK},
	{"batch of scalars", 200, ctJSON, "[1,2]", OK},
	{"batch nested", 200, ctJSON, "[[" + errSessionNotFound + "]]", OK},

	// Prefixes and truncation.
	{"BOM", 200, ctJSON, bom + errSessionNotFound, SessionGone},
	{"two BOMs and whitespace", 200, ctJSON, bom + " \n" + bom + errSessionNotFound, SessionGone},
	{"leading whitespace", 200, ctJSON, "\r\n\t " + errSessionNotFound, SessionGone},
	{"404 BOM -32601", 404, ctJSON, bom + errMethodNotFound, ToolError},
	{"truncated after the marker", 200, ctJSON, `{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"`, SessionGone},
	{"truncated inside the marker", 200, ctJSON, `{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not fo`, ToolError},
	{"truncated in the key", 200, ctJSON, `{"jsonrpc":"2.0","err`, OK},
	{"truncated after the key", 200, ctJSON, `{"jsonrpc":"2.0","error"`, OK},
	{"truncated after the colon", 200, ctJSON, `{"jsonrpc":"2.0","error":`, OK},
	{"truncated result", 200, ctJSON, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"te`, OK},
	{"lone brace", 200, ctJSON, "{", OK},
	{"deep nesting", 200, ctJSON, `{"result":` + strings.Repeat("[", 100000) + `],"error":"Session not found"}`, OK},

	// SSE framing.
	{"SSE data", 200, ctSSE, "data: " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE data without space", 200, ctSSE, "data:" + errSessionNotFound + "\n\n", SessionGone},
	{"SSE data with two spaces", 200, ctSSE, "data:  " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE event message", 200, ctSSE, "event: message\ndata: " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE priming id and empty data", 200, ctSSE, "id: 1\ndata: \n\nevent: message\nid: 2\ndata: " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE priming bare data", 200, ctSSE, "id: 1\ndata\n\ndata: " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE priming data colon", 200, ctSSE, "retry: 500\ndata:\n\ndata: " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE whitespace-only data", 200, ctSSE, "data:   \n\ndata: " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE comments first", 200, ctSSE, ": keepalive\n\n:\n\n: " + errSessionNotFound + "\n\ndata: " + resultOK + "\n\n", OK},
	{"SSE CRLF", 200, ctSSE, "id: 1\r\ndata: \r\n\r\nevent: message\r\ndata: " + errSessionNotFound + "\r\n\r\n", SessionGone},
	{"SSE CR only", 200, ctSSE, "id: 1\rdata: \r\revent: message\rdata: " + errSessionNotFound + "\r\r", SessionGone},
	{"SSE BOM", 200, ctSSE, bom + "data: " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE leading blank lines", 200, ctSSE, "\n\n  data: " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE unterminated last line", 200, ctSSE, "data: " + errSessionNotFound, SessionGone},
	{"SSE first event decides", 200, ctSSE, "data: " + resultOK + "\n\ndata: " + errSessionNotFound + "\n\n", OK},
	{"SSE isError", 200, ctSSE, "data: {\"result\":{\"isError\":true}}\n\n", ToolError},
	{"SSE only priming", 200, ctSSE, "id: 1\ndata: \n\n", OK},
	{"SSE only comments", 200, ctSSE, ": keepalive\n\n", OK},
	{"SSE empty", 200, ctSSE, "", OK},
	{"SSE text data", 200, ctSSE, "data: session not found\n\n", OK},
	{"SSE other field named data-like", 200, ctSSE, "database: " + errSessionNotFound + "\n\n", OK},
	{"SSE field names are case-sensitive", 200, ctSSE, "Data: " + errSessionNotFound + "\n\n", OK},
	{"SSE content type with parameters", 200, "Text/Event-Stream; charset=utf-8", "data: " + errSessionNotFound + "\n\n", SessionGone},
	{"SSE content type with leading space", 200, " text/event-stream", "data: " + errSessionNotFound + "\n\n", SessionGone},
	{"not SSE: longer subtype", 200, "text/event-streamx", "data: " + errSessionNotFound + "\n\n", OK},
	{"not SSE: JSON content type", 200, ctJSON, "data: " + errSessionNotFound + "\n\n", OK},
	{"SSE content type, bare JSON body", 200, ctSSE, errSessionNotFound, OK},
}

func TestClassifyTable(t *testing.T) {
	t.Parallel()
	for _, tc := range tableCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Classify(tc.status, []byte(tc.contentType), []byte(tc.body)); got != tc.want {
				t.Errorf("Classify(%s) = %v, want %v", tc.name, got, tc.want)
			}
		})
	}
}

// TestSessionMessages checks every entry of sessionMessages: it is a
// session loss at 200 as a whole message, bare or SSE-framed, and a tool's
// own error once anything comes before or after it. Each is also the whole
// message (or text body) of a SessionGone golden file: a dialect is listed
// only with the bytes of a server that sends it.
func TestSessionMessages(t *testing.T) {
	t.Parallel()
	golden := map[string]bool{}
	for _, g := range loadGoldens(t) {
		if g.want != SessionGone {
			continue
		}
		p := trimLeft(payload(b2s(g.contentType), b2s(g.body)))
		if strings.HasPrefix(p, "{") || strings.HasPrefix(p, "[") {
			p = firstErrorText(p)
		}
		golden[strings.ToLower(trimMessage(p))] = true
	}
	for _, m := range sessionMessages {
		if !golden[m] {
			t.Errorf("session message %q has no SessionGone golden file", m)
		}
		for _, tc := range []struct {
			ct, body string
			want     Class
		}{
			{ctJSON, `{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"` + m + `"}}`, SessionGone},
			{ctJSON, `{"jsonrpc":"2.0","id":1,"error":"` + strings.ToUpper(m) + `."}`, SessionGone},
			{ctSSE, `data: {"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"` + m + `"}}` + "\n\n", SessionGone},
			{ctJSON, `{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"tool failed: ` + m + `"}}`, ToolError},
			{ctJSON, `{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"` + m + ` for order 17"}}`, ToolError},
		} {
			if got := Classify(200, []byte(tc.ct), []byte(tc.body)); got != tc.want {
				t.Errorf("Classify(200, %s, %s) = %v, want %v", tc.ct, tc.body, got, tc.want)
			}
		}
	}
}

func TestClassifyNilInputs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		want   Class
	}{{200, OK}, {400, Protocol}, {404, SessionGone}} {
		if got := Classify(tc.status, nil, nil); got != tc.want {
			t.Errorf("Classify(%d, nil, nil) = %v, want %v", tc.status, got, tc.want)
		}
	}
}

// TestClassifyKeepsInput checks that Classify neither modifies nor needs to
// copy its input: every golden body is unchanged afterwards.
func TestClassifyKeepsInput(t *testing.T) {
	t.Parallel()
	for _, g := range loadGoldens(t) {
		before := bytes.Clone(g.body)
		Classify(g.status, g.contentType, g.body)
		if !bytes.Equal(before, g.body) {
			t.Errorf("Classify(%s) modified its body", g.name)
		}
	}
}

func TestClassString(t *testing.T) {
	t.Parallel()
	want := []string{"Unknown", "OK", "ToolError", "Auth", "SessionGone", "TransportDead", "Timeout", "Protocol", "Busy"}
	for i, w := range want {
		if got := Class(i).String(); got != w {
			t.Errorf("Class(%d).String() = %q, want %q", i, got, w)
		}
	}
	if got := Class(len(want)).String(); got != "Class(9)" {
		t.Errorf("Class(9).String() = %q, want %q", got, "Class(9)")
	}
}

// TestFirstData checks the first-event peek; the line and field rules it
// relies on are package sse's.
func TestFirstData(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, s, want string }{
		{"plain", "data: {}\n\n", "{}"},
		{"no space", "data:{}\n\n", "{}"},
		{"one space dropped only", "data:  {}\n", " {}"},
		{"priming skipped", "id: a\ndata: \n\nevent: message\nid: b\ndata: {}\n\n", "{}"},
		{"bare data skipped", "data\n\ndata: x\n", "x"},
		{"whitespace data skipped", "data: \t \n\ndata: x\n", "x"},
		{"comments and fields skipped", ": hi\nretry: 10\nevent: e\nid: 1\ndata: x\n", "x"},
		{"CRLF", "data: x\r\n\r\n", "x"},
		{"CR", "id: 1\rdata: x\r\r", "x"},
		{"CR then LF ends two lines", "data\r\ndata: x\ry\n", "x"},
		{"lone CR before LF", "id: 1\r\n\rdata: x\n", "x"},
		{"CR ends the value", "data: x\rdata: y\n", "x"},
		{"lone LF line", "\n", ""},
		{"comment holding data", ":data: x\n", ""},
		{"data without colon", "data x\n", ""},
		{"unterminated", "data: x", "x"},
		{"none", ": keepalive\n\n", ""},
		{"empty", "", ""},
		{"BOM and blank lines", bom + "\r\n data: x\n", "x"},
		{"other field", "datum: x\n", ""},
		{"case-sensitive", "DATA: x\n", ""},
	} {
		if got := firstData(tc.s); got != tc.want {
			t.Errorf("firstData(%s: %q) = %q, want %q", tc.name, tc.s, got, tc.want)
		}
	}
}

func TestIsEventStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ct   string
		want bool
	}{
		{"text/event-stream", true},
		{"TEXT/Event-Stream", true},
		{"text/event-stream; charset=utf-8", true},
		{"text/event-stream ;charset=utf-8", true},
		{"\ttext/event-stream", true},
		{"text/event-streams", false},
		{"text/event", false},
		{"application/json", false},
		{"", false},
	} {
		if got := isEventStream(tc.ct); got != tc.want {
			t.Errorf("isEventStream(%q) = %v, want %v", tc.ct, got, tc.want)
		}
	}
}
