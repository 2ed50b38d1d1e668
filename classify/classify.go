package classify

import (
	"strings"

	"github.com/mcpheal/mcpheal/classify/sse"
)

// badRequestMarkers name the session in a 400 body: a server that answers 400
// instead of 404 for an unknown or missing session. They are matched anywhere
// in the body, ignoring ASCII case, whatever the content type (JSON-RPC error
// message, text/plain, text/html or SSE-framed), because a 400 is already an
// error and these phrases name nothing but the session. Lower case.
var badRequestMarkers = newFoldSet(
	"no valid session id",               // TS v1 example template, supergateway 3.x, Python ≤1.25, Bocha
	"invalid or missing session id",     // TS example and supergateway 3.x, GET/DELETE
	"mcp-session-id header is required", // TS SDK transport, no id
	"missing session id",                // Python SDK, no id (hermes#20349)
	"invalid session id",                // mcp-go v0.42–v0.43
	"server not initialized",            // TS SDK transport that never saw initialize
	"unknown mcp-session-id",            // 1mcp-app/agent (PR #550)
)

// Classify returns the Class of one upstream answer to a request that carried
// an Mcp-Session-Id. status is the HTTP status code; contentType is the raw
// Content-Type header value (nil when absent); body is the body or a prefix of
// it, such as the first events of an SSE stream. Neither slice is modified or
// retained.
//
// The status decides first, so the common 2xx path is cheap and a body can
// never turn an auth failure or a gateway error into a heal:
//
//	401, 403         Auth
//	404              SessionGone, unless the body is a JSON-RPC error with one of notFoundCodes
//	400              SessionGone if the body names the session (badRequestMarkers), else Protocol
//	429              Busy
//	503              Busy in the server's own words (busy), else TransportDead
//	502, 504         TransportDead
//	2xx              the first JSON-RPC message decides (classifyMessage)
//	anything else    Protocol
func Classify(status int, contentType, body []byte) Class {
	switch status {
	case 401, 403:
		return Auth
	case 404:
		if isNotFoundError(payload(b2s(contentType), b2s(body))) {
			return ToolError
		}
		return SessionGone
	case 400:
		if badRequestMarkers.in(b2s(body)) {
			return SessionGone
		}
		return Protocol
	case 429:
		return Busy
	case 503:
		if busy(b2s(contentType), b2s(body)) {
			return Busy
		}
		return TransportDead
	case 502, 504:
		return TransportDead
	}
	if status >= 200 && status <= 299 {
		return classifyMessage(payload(b2s(contentType), b2s(body)))
	}
	return Protocol
}

// busyMessages are whole 503 bodies with which an MCP server says it is at
// capacity, as text: the Python SDK ≥1.30 at max_sessions (its JSON-RPC
// form is a JSON-RPC error, busy on its own). Lower case.
var busyMessages = newWholeSet("too many open sessions")

// busy reports a 503 written by the MCP server itself: a JSON-RPC error (a
// gateway's error page is never one), or a known capacity message. A 503
// that only a gateway could have written (nginx's page, Envoy's reset,
// supergateway's "Gateway is shutting down" while it stops) is not: it is
// an outage to wait out.
func busy(contentType, body string) bool {
	p := trimLeft(payload(contentType, body))
	if strings.HasPrefix(p, "{") || strings.HasPrefix(p, "[") {
		msg, ok := firstMessage(p)
		if !ok {
			return false
		}
		_, ok = member(msg, "error")
		return ok
	}
	return busyMessages.is(p)
}

// payload returns the JSON-RPC text of an answer: the data of the first
// non-empty SSE event for text/event-stream, the body itself otherwise.
func payload(contentType, body string) string {
	if isEventStream(contentType) {
		return firstData(body)
	}
	return body
}

// isEventStream reports whether the Content-Type value ct is
// text/event-stream. Type and subtype are case-insensitive and may be
// followed by parameters (RFC 9110 §8.3.1).
func isEventStream(ct string) bool {
	const mt = "text/event-stream"
	for ct != "" && (ct[0] == ' ' || ct[0] == '\t') {
		ct = ct[1:]
	}
	if !hasPrefixFold(ct, mt) {
		return false
	}
	rest := ct[len(mt):]
	return rest == "" || rest[0] == ';' || rest[0] == ' ' || rest[0] == '\t'
}

// firstData returns the value of the first data field in the SSE stream s
// that holds more than whitespace, or "" if there is none. That skips what
// comes before a JSON-RPC message: comments (": keepalive", TS SDK 1.30),
// id:, event: and retry: fields, and the 2025-11-25 priming event
// ("id: x\ndata: \n\n" or "data:\n"). Lines and fields are split by
// [sse.NextLine] and [sse.Field], the one home of those rules.
//
// Every MCP server writes one JSON-RPC message per event on one data line, so
// the first such line is the message; a message split over several data
// lines is classified from its first line only. A last line without its
// terminator still counts: s may be a prefix of the stream. A byte order
// mark and whitespace before the first field are skipped as a whole-body
// prefix, so that neither changes the result.
func firstData(s string) string {
	rest := s2b(trimLeft(s))
	for len(rest) > 0 {
		var line []byte
		line, rest = sse.NextLine(rest)
		name, v, comment := sse.Field(line)
		if !comment && string(name) == "data" && trimLeft(b2s(v)) != "" {
			return b2s(v)
		}
	}
	return ""
}
