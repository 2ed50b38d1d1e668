package classify

import "strings"

// refusalMessages are the whole 503 bodies, or whole JSON-RPC error messages
// in a 503 body, with which an MCP server itself turns a request away before
// dispatching it (docs/healing.md "Replay rules"; each is a golden file under testdata/refused). Only the server writes them,
// so a gateway that passes one through proves nothing more than the server
// said. Add one here, with its server and a golden file under
// testdata/refused/true/, only when its source shows the refusal comes before any
// request is dispatched. Lower case, no trailing period.
var refusalMessages = newWholeSet(
	// supergateway 4.0.0, text/plain, for about a second while it stops.
	"gateway is shutting down",
	// Python SDK ≥2.2 and its v1.x backport at max_sessions (PR #3395/#3426).
	"too many open sessions",
)

// Refused reports whether an upstream answer proves that the MCP server
// itself refused the request before dispatching it, so that sending the
// request again cannot run anything twice. Only a 503 qualifies, and only
// when its body, as a whole, is a refusal such a server is known to send
// (refusalMessages): supergateway's "Gateway is shutting down", the Python
// SDK's "Too many open sessions". The body is matched as plain text, as the
// message of a JSON-RPC error (or a bare-string error), or as either in the
// first event of a text/event-stream, ignoring ASCII case, surrounding
// whitespace and one trailing period.
//
// Every other answer proves nothing and Refused returns false: a 502, 503
// or 504 from a load balancer or reverse proxy in between (Envoy's "upstream
// connect error or disconnect/reset before headers. reset reason: connection
// termination", an nginx error page) may come after the server received the
// request and ran it; so may a 500. Refused is not about sessions:
// [Classify] reports a rejected session as [SessionGone].
//
// Like Classify it is pure, allocates nothing, and neither modifies nor
// retains its inputs. contentType is the raw Content-Type value (nil when
// absent); body is the whole body, or for text/event-stream at least its
// first complete event.
func Refused(status int, contentType, body []byte) bool {
	if status != 503 {
		return false
	}
	p := trimLeft(payload(b2s(contentType), b2s(body)))
	if strings.HasPrefix(p, "{") || strings.HasPrefix(p, "[") {
		return refusalMessages.is(firstErrorText(p))
	}
	return refusalMessages.is(p)
}

// firstErrorText returns the raw text of the error member of the first
// JSON-RPC message in p (see errorText), or "" if it has none.
func firstErrorText(p string) string {
	msg, ok := firstMessage(p)
	if !ok {
		return ""
	}
	e, ok := member(msg, "error")
	if !ok {
		return ""
	}
	return errorText(e)
}
