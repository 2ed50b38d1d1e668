package wire

import (
	"bytes"
	"encoding/base64"
	"strings"

	"github.com/tidwall/gjson"
)

var (
	HdrSessionID       = []byte("Mcp-Session-Id")
	HdrProtocolVersion = []byte("MCP-Protocol-Version")
	HdrLastEventID     = []byte("Last-Event-ID")
	HdrAuthorization   = []byte("Authorization")
	HdrOrigin          = []byte("Origin")
	HdrAccept          = []byte("Accept")
	MimeJSON           = []byte("application/json")
	MimeEventStream    = []byte("text/event-stream")
)

// StatelessVersion is the first MCP version without sessions (2026-07-28
// changelog): its traffic passes through without session mapping.
const StatelessVersion = "2026-07-28"

// LegacyVersions are the session-era versions an agent may ask for; the
// bridge answers initialize with the agent's own, or the newest.
var LegacyVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

func Contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// McpNameValue returns the Mcp-Name header value for v (2026-07-28
// streamable HTTP): as it is when it is safe visible ASCII, else
// =?base64?…?=.
func McpNameValue(v string) string {
	safe := v != "" && v[0] != ' ' && v[len(v)-1] != ' ' && !strings.HasPrefix(v, "=?base64?")
	for i := 0; safe && i < len(v); i++ {
		safe = v[i] >= 0x20 && v[i] < 0x7f
	}
	if safe {
		return v
	}
	return "=?base64?" + base64.StdEncoding.EncodeToString([]byte(v)) + "?="
}

// InitializedVersion returns result.protocolVersion of a successful
// initialize answer (its JSON-RPC message), or "".
func InitializedVersion(status int, msg []byte) string {
	if status/100 != 2 {
		return ""
	}
	v := gjson.GetBytes(msg, "result.protocolVersion")
	if v.Type != gjson.String {
		return ""
	}
	return v.Str
}

// WithID returns a copy of the JSON object body with its top-level "id"
// replaced by id (raw JSON).
func WithID(body []byte, id string) []byte {
	r := gjson.GetBytes(body, "id")
	if !r.Exists() || r.Index <= 0 {
		return append([]byte(nil), body...)
	}
	out := make([]byte, 0, len(body)+len(id))
	out = append(out, body[:r.Index]...)
	out = append(out, id...)
	return append(out, body[r.Index+len(r.Raw):]...)
}

// HasMediaType reports whether a Content-Type value names mt (parameters
// such as charset allowed).
func HasMediaType(ct, mt []byte) bool {
	if len(ct) < len(mt) || !bytes.EqualFold(ct[:len(mt)], mt) {
		return false
	}
	return len(ct) == len(mt) || ct[len(mt)] == ';' || ct[len(mt)] == ' '
}
