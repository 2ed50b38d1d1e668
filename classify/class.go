package classify

import "strconv"

// Class is the outcome of one upstream answer. Values are stable: metrics and
// logs use them by name.
type Class uint8

const (
	// Unknown is the zero value: not classified. Classify never returns it.
	Unknown Class = iota
	// OK is a 2xx answer without a JSON-RPC error or an isError tool result,
	// including 202 with no body and a non-JSON 2xx body.
	OK
	// ToolError is a JSON-RPC error or an isError tool result that names no
	// session (-32601 method not found, a tool's own failure): pass through.
	ToolError
	// Auth is 401 or 403: pass through, or refresh a proxy-owned token.
	Auth
	// SessionGone means the upstream rejected the session before dispatch:
	// heal and replay once.
	SessionGone
	// TransportDead is 502, 503 or 504 from the upstream or a gateway in
	// front of it. The upstream package also uses it for dial and read
	// failures, which never reach Classify.
	TransportDead
	// Timeout is no answer within the deadline. Only the upstream package
	// sets it: without an answer there is nothing to classify.
	Timeout
	// Protocol is any other non-2xx answer (405, 406, 409, 415, 500, a 400
	// that names no session, 1xx, 3xx): pass through, never heal.
	Protocol
	// Busy is the server itself turning a request away for now: 429, or a
	// 503 in its own words (a JSON-RPC error, or a known capacity
	// message such as the Python SDK's "Too many open sessions"). It is at
	// capacity or rate-limits this client; it is not down. Wait its
	// Retry-After, or pass its answer on; never count it as an outage.
	Busy
)

// String returns the name of c as written in the constant list, or
// "Class(n)" for a value outside it.
func (c Class) String() string {
	switch c {
	case Unknown:
		return "Unknown"
	case OK:
		return "OK"
	case ToolError:
		return "ToolError"
	case Auth:
		return "Auth"
	case SessionGone:
		return "SessionGone"
	case TransportDead:
		return "TransportDead"
	case Timeout:
		return "Timeout"
	case Protocol:
		return "Protocol"
	case Busy:
		return "Busy"
	default:
		return "Class(" + strconv.Itoa(int(c)) + ")"
	}
}
