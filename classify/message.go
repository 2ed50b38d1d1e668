package classify

import "strings"

// sessionMessages are the whole JSON-RPC error messages with which servers
// say "your session is gone" (each one a golden file under testdata/SessionGone). In a 2xx answer
// the message must be one of them as a whole (wholeSet.is: ASCII case,
// surrounding whitespace and one trailing period aside), never merely
// contain one: a tool's own error such as "charged $20 but payment gateway
// session expired" was dispatched, and replaying it would run the tool twice.
// Servers that say it at 404 are listed too, for a relay or an application
// that answers the same text at 200. Add a dialect here, with its server
// and a golden file, when a new one is found. Lower case, no trailing period.
var sessionMessages = newWholeSet(
	// TS SDK transport -32001, supergateway 4.0, Python SDK ≥1.26 -32600
	// (all 404); at 200: keryx's bare-string error (keryx#503), the body of
	// copilot-cli#1360.
	"session not found",
	// WordPress.com -32005 at 200 (mcp-adapter#312, mcp-wordpress-remote
	// PR #60).
	"session not found: invalid or expired session",
	// WordPress mcp-adapter -32602 at 200 (HttpSessionValidator,
	// McpErrorFactory: INVALID_PARAMS maps to HTTP 200).
	"invalid params: invalid or expired session",
	// WordPress mcp-adapter's session text on its own, the phrase hermes
	// matches (hermes#13383).
	"invalid or expired session",
	// mcp-go for a DELETEd id (404); the Python SDK client's name for a
	// dead session (hermes#18069).
	"session terminated",
	// Python SDK ≥1.26 -32600 (404).
	"not found: session has been terminated",
	"not found: invalid or expired session id",
	// 1mcp-app/agent -32000 (PR #550).
	"not found: unknown mcp-session-id header",
	// Express MCP routers, 404 -32001 (found by code search).
	"unknown session",
	// An Express MCP app, 404 -32000 (found by code search; golden
	// express-app-404-session-expired).
	"session expired. please reconnect",
)

// notFoundCodes are the JSON-RPC codes a 404 may carry for something other
// than the session: -32601 method not found (a 2026-07-28 server, which has no
// sessions), and the codes WordPress mcp-adapter maps to HTTP 404
// (McpErrorFactory::mcp_error_to_http_status): -32002 resource, -32003 tool,
// -32004 prompt not found. With such a body the 404 is the server's answer
// to the request, not to the session.
var notFoundCodes = [...]int{-32601, -32002, -32003, -32004}

// classifyMessage classifies the JSON-RPC payload of a 2xx answer by
// walking the top-level members of its first message. Only the first message
// of a batch counts: a server that rejects the session rejects the whole HTTP
// request before dispatch. The first non-null "result" or "error" member
// decides (JSON-RPC 2.0 §5: a response has exactly one), so the common
// answer, a result, costs no scan of the result beyond looking for isError.
func classifyMessage(p string) Class {
	msg, ok := firstMessage(p)
	if !ok {
		return OK // empty (202) or not JSON
	}
	for i := 1; ; {
		k, v, ok := nextMember(msg, i)
		if !ok {
			return OK
		}
		switch k {
		case "result":
			if !strings.HasPrefix(msg[v:], "null") { // JSON-RPC 1.0 sends "result":null next to an error
				return resultClass(msg[v:])
			}
		case "method":
			return OK // a request or notification, not an answer
		case "error":
			if c, ok := errorClass(msg[v:]); ok {
				return c
			}
		}
		if i, ok = nextComma(msg, valueEnd(msg, v)); !ok {
			return OK
		}
	}
}

// resultClass classifies a result value, given as the rest of the message
// from the value's first byte: ToolError if it is an object whose isError
// member is true (a tool's own failure, MCP server/tools "Error Handling"),
// OK otherwise.
func resultClass(r string) Class {
	if !strings.HasPrefix(r, "{") || !mayHaveIsErrorTrue(r) {
		return OK
	}
	if v, ok := member(r, "isError"); ok && v == "true" {
		return ToolError
	}
	return OK
}

// isNotFoundError reports whether p is a JSON-RPC error whose code is one of
// notFoundCodes (see there).
func isNotFoundError(p string) bool {
	msg, ok := firstMessage(p)
	if !ok {
		return false
	}
	e, ok := member(msg, "error")
	if !ok || !strings.HasPrefix(e, "{") {
		return false
	}
	c, ok := member(e, "code")
	if !ok {
		return false
	}
	code, ok := intCode(c)
	if !ok {
		return false
	}
	for _, nf := range notFoundCodes {
		if code == nf {
			return true
		}
	}
	return false
}

// firstMessage returns the first JSON-RPC message in p, starting at its '{':
// p itself, or element 0 of a batch (2025-03-26 allowed batches). The text
// after the message is not cut off; member stops at the message's closing
// brace. A leading byte order mark and whitespace are skipped.
func firstMessage(p string) (string, bool) {
	p = trimLeft(p)
	if strings.HasPrefix(p, "[") {
		p = p[skipSpace(p, 1):]
	}
	if !strings.HasPrefix(p, "{") {
		return "", false
	}
	return p, true
}

// errorClass classifies an error value, given as the rest of the message
// from the value's first byte: SessionGone if its whole text is a session
// message (sessionMessages), ToolError otherwise. ok is false when the value
// reports no error: null, false and "" (some JSON-RPC libraries send
// "error":null next to a result). An error object is read only up to its message; its
// end is never searched for.
func errorClass(e string) (c Class, ok bool) {
	switch {
	case strings.HasPrefix(e, "{"):
	case strings.HasPrefix(e, `"`):
		e = e[:stringEnd(e, 0)]
	default:
		switch e[:valueEnd(e, 0)] {
		case "", "null", "false":
			return OK, false
		}
		return ToolError, true
	}
	if e == `""` {
		return OK, false
	}
	if sessionMessages.is(errorText(e)) {
		return SessionGone, true
	}
	return ToolError, true
}

// errorText returns the raw text of an error value: the message of an error
// object, or the error itself when it is a bare string (keryx). Escapes stay
// as they are; the known messages contain no characters that JSON escapes.
// Anything else, including error.data, is never read. An unterminated
// string (a body cut short) yields the text that arrived.
func errorText(raw string) string {
	if strings.HasPrefix(raw, "{") {
		m, ok := member(raw, "message")
		if !ok || !strings.HasPrefix(m, `"`) {
			return ""
		}
		raw = m
	}
	if !strings.HasPrefix(raw, `"`) {
		return ""
	}
	raw = raw[1:]
	if n := len(raw); n > 0 && raw[n-1] == '"' {
		raw = raw[:n-1]
	}
	return raw
}
